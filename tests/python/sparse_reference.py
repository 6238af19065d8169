"""Float64 references for the sparse normalizers, in plain torch ops: sort-based sparsemax and
entmax-1.5, α-entmax by bisection. Differentiable (autograd gives the reference gradients)."""

import math

import torch

NEG_INF = float("-inf")


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
    float64: p = [(α−1)·z − τ]_+^{1/(α−1)}. Rows with every entry −inf give zeros.
    Returns (p, tau) with tau [..., 1] in the (α−1)·z units (+inf for empty rows)."""
    z = z.double()
    empty = (z == NEG_INF).all(dim=-1, keepdim=True)
    z = z.masked_fill(empty, 0.0)
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


ALPHAS = {"sparsemax": 2.0, "entmax15": 1.5}


def alpha_of(normalizer, alpha=None):
    return ALPHAS.get(normalizer, alpha)


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
              normalizer="sparsemax", alpha=None):
    """normalize(scale·q·kᵀ + mask)·v in float64. Returns (output, weights, tau)."""
    z = scores(query, key, attn_mask, is_causal, scale)
    p, tau = normalize(z, alpha_of(normalizer, alpha))
    return p @ value.double(), p, tau.squeeze(-1)
