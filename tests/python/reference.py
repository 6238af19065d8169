"""Float64 references built from plain torch ops: the ground truth the tests compare against.

The normalizers are the operator's: softmax, and α-entmax, p = [(α−1)·z − τ]_+^{1/(α−1)} with
Σ p = 1 (sparsemax is α = 2, entmax-1.5 α = 1.5, both by sorting; any other α by bisection to
1e-12). All are differentiable: autograd through them gives the reference gradients."""

import math

import torch

NEG_INF = float("-inf")

# The (normalizer, alpha) pairs the operator tests run over: softmax, the two sorting paths, and
# α-entmax by bisection below 1.5, between 1.5 and 2, and above 2 (where s = p^(2−α) is
# unbounded at the support's edge).
NORMALIZERS = [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3),
               ("entmax", 1.75), ("entmax", 3.0)]
SPARSE_NORMALIZERS = NORMALIZERS[1:]


def normalizer_id(normalizer, alpha=None):
    """A test id: the normalizer's name, α appended for "entmax" (entmax1.3)."""
    return normalizer if alpha is None else f"{normalizer}{alpha:g}"


def ids(pairs):
    return [normalizer_id(*pair) for pair in pairs]


# Softmax is the α → 1 limit of α-entmax.
ALPHAS = {"softmax": 1.0, "sparsemax": 2.0, "entmax15": 1.5}


def alpha_of(normalizer, alpha=None):
    """α of a normalizer: its own for the named ones, the given alpha for "entmax"."""
    if normalizer == "entmax":
        if alpha is None:
            raise ValueError('normalizer="entmax" needs alpha')
        return float(alpha)
    if normalizer not in ALPHAS:
        raise ValueError(f"unknown normalizer {normalizer!r}")
    return ALPHAS[normalizer]


def _sorted_threshold(x, alpha):
    """τ of sparsemax (alpha 2) or entmax-1.5 (alpha 1.5) from the sorted entries of x
    [..., n] (−inf allowed; rows need one finite entry). Returns τ [..., 1]."""
    xs, _ = x.sort(dim=-1, descending=True)
    n = x.shape[-1]
    k = torch.arange(1, n + 1, dtype=x.dtype, device=x.device)
    finite = xs > NEG_INF
    xs0 = torch.where(finite, xs, torch.zeros_like(xs))
    cumsum = xs0.cumsum(-1)
    if alpha == 2.0:
        tau_k = (cumsum - 1) / k
        valid = finite & (xs > tau_k)
    else:
        mean = cumsum / k
        ss = (xs0 * xs0).cumsum(-1) - cumsum * mean
        tau_k = mean - torch.sqrt(torch.clamp((1 - ss) / k, min=0))
        valid = finite & (ss <= 1) & (xs > tau_k)
    support = (valid * k).amax(dim=-1, keepdim=True).long().clamp(min=1)
    return tau_k.gather(-1, support - 1)


def _bisect_threshold(x, alpha, tol=1e-12):
    """τ of α-entmax by bisection to tol, then one implicit-function term so that autograd
    sees dτ/dx (its value is τ itself up to f(τ) ≈ 0)."""
    r = 1.0 / (alpha - 1.0)
    with torch.no_grad():
        x_max = x.amax(dim=-1, keepdim=True)
        n = (x > NEG_INF).sum(dim=-1, keepdim=True).to(x.dtype)
        lo = x_max - 1
        hi = x_max - (1 / n) ** (alpha - 1)
        for _ in range(200):
            if (hi - lo).max() <= tol:
                break
            mid = (lo + hi) / 2
            mass = torch.clamp(x - mid, min=0).pow(r).sum(-1, keepdim=True)
            lo = torch.where(mass >= 1, mid, lo)
            hi = torch.where(mass >= 1, hi, mid)
        tau = (lo + hi) / 2
        slope = (r * _power(x - tau, r - 1)).sum(-1, keepdim=True)
    mass = _power(x - tau, r).sum(-1, keepdim=True)
    return tau + (mass - 1) / slope


def _power(d, exponent):
    """[d]_+^exponent, 0 where d <= 0, with finite gradients there for any exponent."""
    positive = d > 0
    return torch.where(positive, torch.where(positive, d, torch.ones_like(d)).pow(exponent),
                       torch.zeros_like(d))


def normalize(z, alpha):
    """The α-entmax of the scores z [..., n] (−inf = masked) along the last dimension, in
    float64, softmax for alpha 1. Rows with every entry −inf give zeros.
    Returns (p, tau) with tau [..., 1] (+inf for empty rows): the threshold in the (α−1)·z
    units, p = [(α−1)·z − τ]_+^{1/(α−1)}; for softmax the log-sum-exp, p = exp(z − τ)."""
    z = z.double()
    empty = (z == NEG_INF).all(dim=-1, keepdim=True)
    z = z.masked_fill(empty, 0.0)
    if alpha == 1.0:
        p = torch.softmax(z, dim=-1).masked_fill(empty, 0.0)
        return p, torch.logsumexp(z, dim=-1, keepdim=True).masked_fill(empty, math.inf)
    # Relative to the row's max (a constant shift of z shifts τ alike).
    z_max = z.amax(dim=-1, keepdim=True).detach()
    x = (alpha - 1) * (z - z_max)
    if alpha in (2.0, 1.5):
        tau = _sorted_threshold(x, alpha)
    else:
        tau = _bisect_threshold(x, alpha)
    p = torch.clamp(x - tau, min=0) if alpha == 2.0 else _power(x - tau, 1.0 / (alpha - 1))
    if alpha not in (2.0, 1.5):
        p = p / p.sum(-1, keepdim=True)
    p = p.masked_fill(empty, 0.0)
    tau = (tau + (alpha - 1) * z_max).masked_fill(empty, math.inf)
    return p, tau


def scores(query, key, attn_mask=None, is_causal=False, scale=None):
    """scale·q·kᵀ + mask in float64 (−inf where masked or hidden by the causal mask)."""
    q, k = query.double(), key.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    z = q @ k.transpose(-2, -1) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            z = z.masked_fill(~attn_mask, NEG_INF)
        else:
            z = z + attn_mask.double()
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        z = z.masked_fill(~allowed, NEG_INF)
    return z


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None,
              normalizer="softmax", alpha=None):
    """normalizer(q kᵀ·scale + mask) v in float64; a query whose keys are all masked gets zeros.

    Returns (output, weights)."""
    z = scores(query, key, attn_mask, is_causal, scale)
    weights, _ = normalize(z, alpha_of(normalizer, alpha))
    return weights @ value.double(), weights


def threshold(query, key, attn_mask=None, is_causal=False, scale=None, normalizer="softmax",
              alpha=None):
    """Each query row's τ [..., L_q] as normalize() defines it: +inf for a row without keys."""
    z = scores(query, key, attn_mask, is_causal, scale)
    return normalize(z, alpha_of(normalizer, alpha))[1].squeeze(-1)


def support_gaps(query, key, attn_mask=None, is_causal=False, scale=None, normalizer="softmax",
                 alpha=None):
    """|(α−1)·z − τ| per score: how far it is from entering or leaving the support, where a
    sparse map's gradient jumps (+inf where hidden, and everywhere for softmax, whose support
    is every visible key)."""
    a = alpha_of(normalizer, alpha)
    z = scores(query, key, attn_mask, is_causal, scale)
    if a == 1.0:
        return torch.full_like(z, math.inf)
    _, tau = normalize(z, a)
    return ((a - 1) * z - tau).abs().nan_to_num(nan=math.inf, posinf=math.inf)


def assert_close(actual, expected, what, dtype, gradient=False):
    """The bound every normalizer meets against these references, relative to the largest
    expected entry (at least 1): float64 1e-9 (1e-7 for gradients, which the 1e-12 bisection
    bounds), float32 1e-5 (1e-4 for gradients)."""
    assert actual.shape == expected.shape, \
        f"{what}: shape {list(actual.shape)} != {list(expected.shape)}"
    if dtype == torch.float64:
        tol = 1e-7 if gradient else 1e-9
    else:
        tol = 1e-4 if gradient else 1e-5
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual.double(), expected.double(), rtol=0, atol=tol * scale,
                               msg=lambda m: f"{what}: {m}")


def tutorial_mha(module, x, mask=None):
    """The tutorial's multi-head attention, from an attnlab.nn.MultiheadAttention's weights, in
    plain torch ops. mask: [L, L], [B, L, L] or [B, H, L, L], boolean (True = may attend) or
    floating point (added to the scores). Returns (output, attention)."""
    B, L, _ = x.shape
    H, hd = module.num_heads, module.head_dim
    qkv = x @ module.qkv_proj.weight.T + module.qkv_proj.bias
    qkv = qkv.reshape(B, L, H, 3 * hd).permute(0, 2, 1, 3)
    q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
    logits = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if mask is not None:
        mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask
    attention = torch.softmax(logits, dim=-1)
    values = (attention @ v).permute(0, 2, 1, 3).reshape(B, L, H * hd)
    return values @ module.o_proj.weight.T + module.o_proj.bias, attention


def tutorial_block(block, x, mask=None):
    """An attnlab.nn.EncoderBlock (no dropout) from its weights in plain torch ops: post-norm
    as the tutorial writes it, or pre-norm when block.norm_first."""
    def layer_norm(norm, t):
        mean = t.mean(-1, keepdim=True)
        var = ((t - mean) ** 2).mean(-1, keepdim=True)
        return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    def ffn(t):
        first, second = block.linear_net[0], block.linear_net[3]
        return torch.relu(t @ first.weight.T + first.bias) @ second.weight.T + second.bias

    if block.norm_first:
        h = x + tutorial_mha(block.self_attn, layer_norm(block.norm1, x), mask)[0]
        return h + ffn(layer_norm(block.norm2, h))
    h = layer_norm(block.norm1, x + tutorial_mha(block.self_attn, x, mask)[0])
    return layer_norm(block.norm2, h + ffn(h))
