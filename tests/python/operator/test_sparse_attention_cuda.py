"""The CUDA sparse attention kernels (sparsemax, entmax-1.5, α-entmax) against float64
references written here, and against the CPU operator.

The operators: torch.ops.attnlab._sparse_sdpa_forward(query, key, value, attn_mask, is_causal,
scale, need_weights, alpha) -> (output, tau, support_value, weights) and _sparse_sdpa_backward.
Per query row, x_j = (α−1)·z_j with z_j = scale·q·k_j + mask_j, p_j = [x_j − τ]_+^(1/(α−1)) with
Σ_j p_j = 1, s_j = p_j^(2−α) on the support, U = Σ_j s_j·V_j / Σ_j s_j; a row that sees no key
has τ = +inf and zeros. On CUDA tau and support_value are float32 for every input dtype.

References (float64, plain torch ops): sparsemax and entmax-1.5 by sorting, any other α by
bisection to 1e-12 followed by one Newton step on the differentiable threshold (its gradient is
then the implicit function's), so that autograd gives the reference gradients in every case.

Tolerances, relative to the reference's largest entry (at least 1): float32 1e-5; float16 and
bfloat16 outputs, weights and gradients are float32 results rounded once, so one unit of the
dtype's precision (torch.finfo(dtype).eps); tau, support_value and the mask's gradient stay
float32 (1e-5). The sparse maps are not differentiable where a key sits exactly at the
threshold (sparsemax's support jumps there; for α > 2, s is unbounded near it): gradients are
compared with the output's gradient set to zero on the query rows that have a key closer to the
threshold than gradient_gap(α) (relative to |τ|), which removes those rows' contributions on
both sides; forward values skip the rows within forward_gap(α) (sparsemax's support value
jumps, and for α > 2 a float32 τ moves a near-threshold p by more than 1e-5).

A GPU run needs the CPU operators and their fake kernels (the `sparse` change) merged: the
tests compare with the CPU operator, call the public operator with normalizer=..., and opcheck
the CUDA kernels against the fake ones.

Without a GPU every test here skips, except the checks of the references themselves.
"""

import math

import pytest
import torch

import attnlab  # registers torch.ops.attnlab

requires_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the sparse attention kernels are compiled and linked but cannot run")

HALF_DTYPES = [torch.float16, torch.bfloat16]
DTYPES = [torch.float32, *HALF_DTYPES]
# sparsemax and entmax-1.5 (solved exactly), a general α < 2 (bisection, then Newton) and a
# general α > 2 (bisection alone).
ALPHAS = [2.0, 1.5, 1.25, 3.0]
FLOAT32_TOLERANCE = 1e-5


# ---- float64 references -----------------------------------------------------------------------


def _sorted_prefix(x):
    """x sorted in descending order along the last dimension, hidden entries (-inf) replaced by 0,
    the positions k = 1..n, and which of the sorted entries are visible."""
    xs, _ = torch.sort(x, dim=-1, descending=True)
    visible = xs > -math.inf
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    return torch.where(visible, xs, torch.zeros_like(xs)), k, visible


def _sparsemax_threshold(x):
    """τ of sparsemax by sorting: the support is the largest k with 1 + k·x_(k) > Σ_{j≤k} x_(j),
    τ = (Σ_{j≤k} x_(j) − 1)/k. Every row must have a visible entry. Differentiable in x."""
    xs, k, visible = _sorted_prefix(x)
    cumsum = xs.cumsum(-1)
    support = visible & (1 + k * xs > cumsum)
    size = support.sum(-1, keepdim=True)
    return ((cumsum.gather(-1, size - 1) - 1) / size).squeeze(-1)


def _entmax15_threshold(x):
    """τ of entmax-1.5 (in x = z/2) by sorting (Peters et al., 2019): for the top k entries,
    τ_k = mean_k − sqrt((1 − ss_k)/k) with ss_k their sum of squared deviations; the support is
    the largest k with τ_k ≤ x_(k). Every row must have a visible entry. Differentiable in x."""
    xs, k, visible = _sorted_prefix(x)
    mean = xs.cumsum(-1) / k
    mean_sq = (xs * xs).cumsum(-1) / k
    with torch.no_grad():
        ss = k * (mean_sq - mean * mean)
        tau_k = mean - torch.sqrt(torch.clamp((1 - ss) / k, min=0))
        size = (visible & (tau_k <= xs)).sum(-1, keepdim=True)
    m, m_sq = mean.gather(-1, size - 1), mean_sq.gather(-1, size - 1)
    ss = size * (m_sq - m * m)
    return (m - torch.sqrt((1 - ss) / size)).squeeze(-1)


def _bisection_threshold(x, alpha, steps=200):
    """τ with Σ_j [x_j − τ]_+^(1/(α−1)) = 1 by bisection in float64 (to adjacent doubles), then
    one Newton step on the differentiable residual: the value stays, and autograd gets the
    implicit function's derivative dτ/dx_j = s_j / Σ s."""
    exponent = 1 / (alpha - 1)

    def sums(tau):
        d = x - tau.unsqueeze(-1)
        positive = d > 0
        safe = torch.where(positive, d, torch.ones_like(d))
        p = torch.where(positive, safe ** exponent, torch.zeros_like(d)).sum(-1)
        s = torch.where(positive, safe ** (exponent - 1), torch.zeros_like(d)).sum(-1)
        return p, s

    with torch.no_grad():
        top = x.max(-1).values
        count = (x > -math.inf).sum(-1).to(x.dtype)
        lo, hi = top - 1, top - count ** (1 - alpha)
        for _ in range(steps):
            mid = (lo + hi) / 2
            above = sums(mid)[0] >= 1
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        tau0 = lo
    p, s = sums(tau0)
    return tau0 + (p - 1) / (exponent * s)


def entmax_reference(z, alpha):
    """(τ, p) of α-entmax over the last dimension of the scores z (float64, -inf = hidden), τ in
    the x = (α−1)·z frame; a row with every entry hidden gets τ = +inf and p = 0."""
    x = (alpha - 1) * z
    empty = (x == -math.inf).all(-1)
    x = torch.where(empty.unsqueeze(-1), torch.zeros_like(x), x)  # any finite row: discarded
    if alpha == 2:
        tau = _sparsemax_threshold(x)
    elif alpha == 1.5:
        tau = _entmax15_threshold(x)
    else:
        tau = _bisection_threshold(x, alpha)
    d = x - tau.unsqueeze(-1)
    positive = d > 0
    safe = torch.where(positive, d, torch.ones_like(d))
    p = torch.where(positive, safe ** (1 / (alpha - 1)), torch.zeros_like(d))
    p = p / p.sum(-1, keepdim=True)
    p = torch.where(empty.unsqueeze(-1), torch.zeros_like(p), p)
    tau = torch.where(empty, torch.full_like(tau, math.inf), tau)
    return tau, p


def scores_reference(query, key, attn_mask=None, is_causal=False, scale=None):
    """z = scale·q·kᵀ + mask in float64, -inf where a key is hidden (boolean False, -inf in a
    float mask, or after the query under the top-left causal mask)."""
    q, k = query.double(), key.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    z = q @ k.transpose(-2, -1) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            z = z.masked_fill(~attn_mask, -math.inf)
        else:
            z = z + attn_mask.double()
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        z = z.masked_fill(~allowed, -math.inf)
    return z


def reference(query, key, value, attn_mask=None, is_causal=False, scale=None, alpha=2.0):
    """Everything the forward returns, in float64: output, tau, support_value, weights; plus the
    distance of each query row's closest visible key to its threshold, relative to the
    threshold's size (`gap`: min_j |x_j − τ| / max(1, |τ|)). Differentiable in query, key, value
    and a float mask."""
    z = scores_reference(query, key, attn_mask, is_causal, scale)
    tau, p = entmax_reference(z, alpha)
    output = p @ value.double()
    with torch.no_grad():
        s = torch.where(p > 0, p.clamp(min=1e-300) ** (2 - alpha), torch.zeros_like(p))
        total = s.sum(-1, keepdim=True)
        support_value = (s @ value.double()) / torch.where(total > 0, total, torch.ones_like(total))
        x = (alpha - 1) * z.detach()
        distance = (x - tau.detach().unsqueeze(-1)).abs().masked_fill(x == -math.inf, math.inf)
        gap = distance.min(-1).values if distance.shape[-1] else torch.full(tau.shape, math.inf)
        gap = gap / tau.detach().abs().clamp(min=1)
    return {"output": output, "tau": tau, "support_value": support_value, "weights": p,
            "gap": gap}


# ---- checks of the references (these run without a GPU) ---------------------------------------


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_sorting_references_agree_with_bisection(alpha):
    gen = torch.Generator().manual_seed(int(alpha * 10))
    z = torch.randn(6, 40, dtype=torch.float64, generator=gen) * 2
    z[1, 5:] = -math.inf  # a few visible keys
    z[2, :] = -math.inf  # none
    z[3, :] = 0.25  # ties everywhere: uniform
    tau, p = entmax_reference(z, alpha)
    tau_b = _bisection_threshold((alpha - 1) * z[[0, 1, 3, 4, 5]], alpha)
    torch.testing.assert_close(tau[[0, 1, 3, 4, 5]], tau_b, rtol=0, atol=1e-12)
    assert tau[2] == math.inf and torch.equal(p[2], torch.zeros(40, dtype=torch.float64))
    torch.testing.assert_close(p[3], torch.full((40,), 1 / 40, dtype=torch.float64))
    torch.testing.assert_close(p.sum(-1)[[0, 1, 3, 4, 5]], torch.ones(5, dtype=torch.float64))
    assert (p[1, 5:] == 0).all()
    assert (p == 0).any(), "sparse maps have exact zeros"


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_bisection_reference_gradient_matches_sorting(alpha):
    # The Newton-step trick gives the implicit derivative: the same Jacobian as autograd through
    # the sorting formulas.
    gen = torch.Generator().manual_seed(3)
    z = (torch.randn(4, 30, dtype=torch.float64, generator=gen) * 2).requires_grad_()
    weight = torch.randn(4, 30, dtype=torch.float64, generator=gen)
    (grad_sorted,) = torch.autograd.grad((entmax_reference(z, alpha)[1] * weight).sum(), z)
    x = (alpha - 1) * z
    tau = _bisection_threshold(x, alpha)
    d = (x - tau.unsqueeze(-1)).clamp(min=0)
    p = d ** (1 / (alpha - 1))
    (grad_bisect,) = torch.autograd.grad((p * weight).sum(), z)
    torch.testing.assert_close(grad_bisect, grad_sorted, rtol=1e-9, atol=1e-10)


def test_reference_gradient_is_the_entmax_formula():
    # dz = s ⊙ (g − Σ s·g / Σ s) with s = p^(2−α): the formula the kernels implement, checked
    # here against autograd of the reference for a general α.
    gen = torch.Generator().manual_seed(4)
    alpha = 1.25
    z = (torch.randn(3, 25, dtype=torch.float64, generator=gen) * 3).requires_grad_()
    g = torch.randn(3, 25, dtype=torch.float64, generator=gen)
    _, p = entmax_reference(z, alpha)
    (dz,) = torch.autograd.grad((p * g).sum(), z)
    s = torch.where(p > 0, p.detach() ** (2 - alpha), torch.zeros_like(p))
    expected = s * (g - (s * g).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
    torch.testing.assert_close(dz, expected, rtol=1e-9, atol=1e-12)


# ---- helpers for the GPU tests ----------------------------------------------------------------


def forward(query, key, value, attn_mask=None, is_causal=False, scale=None, need_weights=True,
            alpha=2.0):
    """The forward operator: (output, tau, support_value, weights)."""
    return torch.ops.attnlab._sparse_sdpa_forward(query, key, value, attn_mask, is_causal, scale,
                                                  need_weights, alpha)


def backward(grad_output, query, key, value, attn_mask, is_causal, scale, forward_outputs, alpha,
             grad_mask=False):
    """The backward operator from the forward's (output, tau, support_value, weights)."""
    output, tau, support_value, _ = forward_outputs
    return torch.ops.attnlab._sparse_sdpa_backward(grad_output, query, key, value, attn_mask,
                                                   is_causal, scale, output, tau, support_value,
                                                   alpha, None, grad_mask)


def relative_error(result, expected):
    """Largest absolute error relative to the reference's largest entry (absolute where that is
    below 1)."""
    expected = expected.double().cpu()
    if expected.numel() == 0:
        return 0.0
    error = (result.double().cpu() - expected).abs().max().item()
    return error / max(expected.abs().max().item(), 1.0)


def assert_close(result, expected, tolerance, what):
    assert result.shape == expected.shape, (
        f"{what}: shape {tuple(result.shape)}, expected {tuple(expected.shape)}")
    assert not torch.isnan(result).any(), f"{what}: NaN"
    error = relative_error(result, expected)
    assert error <= tolerance, f"{what}: relative error {error:.2e} > {tolerance:.1e}"


def tolerance(dtype):
    """float32: 1e-5; half precision: one unit of the dtype's precision (results are float32
    values rounded once to the dtype)."""
    return FLOAT32_TOLERANCE if dtype == torch.float32 else torch.finfo(dtype).eps


def forward_gap(alpha):
    """Rows with a key closer than this to the threshold are left out of the forward checks:
    sparsemax's support value jumps there; for α > 2, p = d^(1/(α−1)) is steep near d = 0 and a
    float32 threshold moves such a key's p by more than 1e-5."""
    return 1e-5 if alpha == 2 else 3e-3 if alpha > 2 else 0.0


def gradient_gap(alpha):
    """Rows with a key closer than this to the threshold get a zero output gradient: sparsemax's
    s jumps there; for α > 2, s = d^((2−α)/(α−1)) is unbounded as d → 0."""
    return 1e-5 if alpha == 2 else 5e-2 if alpha > 2 else 0.0


LAYOUTS = ["contiguous", "heads_last", "sliced", "column_major"]


def on_cuda(t, dtype=None, layout="contiguous"):
    """t on the GPU (as dtype) in one of several memory layouts: contiguous, the head dimension
    innermost but one, a slice of wider rows, or column-major matrices."""
    t = t.detach().to("cuda", dtype or t.dtype)
    if layout == "heads_last" and t.dim() >= 3:
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if layout == "sliced":
        wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype, device=t.device)
        wide[..., 1:t.shape[-1] + 1] = t
        return wide[..., 1:t.shape[-1] + 1]
    if layout == "column_major":
        return t.transpose(-2, -1).contiguous().transpose(-2, -1)
    return t.contiguous()


def make_inputs(seed, q_shape, k_shape, v_shape, dtype=torch.float32, spread=1.0):
    """Random query, key and value as float64 tensors holding values exact in `dtype`, so that
    the reference and the kernels see the same numbers. `spread` scales the query: larger gives
    sparser maps."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in (q_shape, k_shape, v_shape))
    return [t.to(dtype).double() for t in (q * spread, k, v)]


def make_mask(seed, kind, shape, len_q):
    """A boolean (True = may attend) or float32 (added; some -inf) mask of `shape`, with the first
    query's keys all hidden when the mask has a query dimension."""
    gen = torch.Generator().manual_seed(seed + 99)
    if kind == "bool":
        mask = torch.rand(*shape, generator=gen) > 0.3
        if len(shape) >= 2 and shape[-2] == len_q and len_q > 1:
            mask[..., 0, :] = False
        return mask
    mask = torch.randn(*shape, generator=gen).float()
    mask = mask.masked_fill(torch.rand(*shape, generator=gen) < 0.2, -math.inf)
    if len(shape) >= 2 and shape[-2] == len_q and len_q > 1:
        mask[..., 0, :] = -math.inf
    return mask.double()


def check_case(q, k, v, attn_mask=None, is_causal=False, scale=None, alpha=2.0,
               dtype=torch.float32, layout="contiguous", seed=0):
    """The CUDA forward and backward on one case against the float64 reference: output, tau,
    support_value and weights (values, exact zeros, shapes, dtypes); gradients of query, key,
    value and of a float mask. q, k, v (and a float mask) hold values exact in dtype (float32 for
    the mask)."""
    float_mask = attn_mask is not None and attn_mask.dtype != torch.bool
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    if float_mask:
        ref_inputs.append(attn_mask.clone().requires_grad_())
    ref = reference(*ref_inputs[:3], ref_inputs[3] if float_mask else attn_mask, is_causal, scale,
                    alpha)
    inputs = [on_cuda(t, dtype, layout) for t in (q, k, v)]
    mask = None if attn_mask is None else on_cuda(attn_mask, torch.float32 if float_mask else None)
    outs = forward(*inputs, mask, is_causal, scale, True, alpha)
    output, tau, support_value, weights = outs

    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                   *(() if attn_mask is None else (attn_mask.shape[:-2],)))
    len_q, len_k, dim_v = q.shape[-2], k.shape[-2], v.shape[-1]
    assert output.shape == (*batch, len_q, dim_v) and output.dtype == dtype and output.is_cuda
    assert tau.shape == (*batch, len_q) and tau.dtype == torch.float32
    assert support_value.shape == output.shape and support_value.dtype == torch.float32
    assert weights.shape == (*batch, len_q, len_k) and weights.dtype == dtype

    rows = (ref["gap"] >= forward_gap(alpha)).expand(tau.shape)
    tol = tolerance(dtype)
    assert_close(output.cpu()[rows], ref["output"].detach().expand(output.shape)[rows], tol,
                 "output")
    assert_close(weights.cpu()[rows], ref["weights"].detach().expand(weights.shape)[rows], tol,
                 "weights")
    assert_close(support_value.cpu()[rows],
                 ref["support_value"].expand(support_value.shape)[rows], FLOAT32_TOLERANCE,
                 "support_value")
    ref_tau = ref["tau"].detach().expand(tau.shape)
    empty = ref_tau == math.inf
    assert torch.equal(tau.cpu() == math.inf, empty), "tau is +inf exactly for rows with no key"
    tau_error = ((tau.cpu().double() - ref_tau).abs() / ref_tau.abs().clamp(min=1))[~empty & rows]
    assert tau_error.numel() == 0 or tau_error.max() <= FLOAT32_TOLERANCE, "tau"
    # Exact zeros off the support (keys clearly below the threshold, or hidden), positive weights
    # on it (clearly above, with p large enough not to round to zero in half precision).
    x = (alpha - 1) * scores_reference(q, k, attn_mask, is_causal, scale)
    ref_tau_col = ref["tau"].detach().unsqueeze(-1)
    below = (x - ref_tau_col <= -1e-5 * ref_tau_col.abs().clamp(min=1)).expand(weights.shape)
    assert (weights.cpu()[below] == 0).all(), "weights off the support are exactly zero"
    assert (weights.cpu()[ref["weights"].detach().expand(weights.shape) > 1e-3] > 0).all()
    assert torch.equal(output.cpu()[empty], torch.zeros_like(output.cpu()[empty]))
    assert torch.equal(weights.cpu()[empty], torch.zeros_like(weights.cpu()[empty]))

    gen = torch.Generator().manual_seed(seed + 7)
    grad_output = torch.randn(output.shape, generator=gen).to(dtype).double()
    grad_output[(ref["gap"] < gradient_gap(alpha)).expand(tau.shape)] = 0
    ref_grads = torch.autograd.grad(ref["output"], ref_inputs, grad_output, allow_unused=True)
    ref_grads = [torch.zeros_like(t) if g is None else g for t, g in zip(ref_inputs, ref_grads)]
    grads = backward(on_cuda(grad_output, dtype, layout), *inputs, mask, is_causal, scale, outs,
                     alpha, grad_mask=float_mask)
    for name, grad, ref_grad, given in zip(["query", "key", "value"], grads, ref_grads, inputs):
        assert grad.shape == given.shape and grad.dtype == dtype, name
        assert_close(grad, ref_grad, tol, f"grad of {name}")
    if float_mask:
        assert grads[3].shape == attn_mask.shape and grads[3].dtype == torch.float32
        assert_close(grads[3], ref_grads[3], FLOAT32_TOLERANCE, "grad of attn_mask")
    else:
        assert grads[3].numel() == 0
    return ref, outs


# ---- float32 against the reference ------------------------------------------------------------

# id: (query shape, key shape, value shape, mask kind, mask shape, is_causal, scale, spread).
# Lengths that are not multiples of the 16-query blocks or the 32-key tiles, L_q ≠ L_k both ways
# under the top-left causal mask, every head-size family (32, 64, 128, 256) and the sizes around
# them, broadcast batch dimensions and masks, fully masked rows, dense and very sparse maps.
CASES = {
    "one-query-one-key": ((1, 1, 8), (1, 1, 8), (1, 1, 8), None, None, False, None, 1.0),
    "odd-lengths": ((3, 7, 3), (3, 13, 3), (3, 13, 5), "bool", (3, 7, 13), False, None, 1.0),
    "one-query-many-keys": ((2, 1, 16), (2, 90, 16), (2, 90, 16), None, None, False, None, 1.0),
    "tiles-causal": ((2, 3, 77, 64), (2, 3, 101, 64), (2, 3, 101, 64), None, None, True, None,
                     1.0),
    "tiles-causal-tall": ((2, 101, 65), (2, 77, 65), (2, 77, 7), "float", (101, 77), True, None,
                          1.0),
    "head-1": ((2, 40, 1), (2, 50, 1), (2, 50, 1), None, None, False, None, 2.0),
    "head-31-33": ((3, 45, 31), (3, 61, 31), (3, 61, 33), "bool", (61,), False, None, 1.0),
    "head-128": ((2, 70, 128), (2, 130, 128), (2, 130, 128), "bool", (70, 130), True, None, 1.0),
    "head-129-200": ((2, 33, 129), (2, 45, 129), (2, 45, 200), "float", (2, 33, 45), False, None,
                     1.0),
    "head-256": ((2, 20, 256), (2, 70, 256), (2, 70, 256), None, None, True, None, 1.0),
    "broadcast": ((2, 1, 3, 19, 24), (1, 4, 1, 37, 24), (4, 3, 37, 10), "float", (4, 1, 19, 37),
                  False, None, 1.0),
    "negative-scale": ((3, 30, 16), (3, 40, 16), (3, 40, 16), "float", (1, 40), False, -0.7,
                       1.0),
    "dense": ((2, 50, 32), (2, 200, 32), (2, 200, 32), None, None, False, None, 0.05),
    "very-sparse": ((2, 50, 32), (2, 60, 32), (2, 60, 32), "bool", (50, 60), False, None, 6.0),
}


def _case_inputs(case_id, dtype=torch.float32):
    q_shape, k_shape, v_shape, mask_kind, mask_shape, is_causal, scale, spread = CASES[case_id]
    seed = sum(map(ord, case_id))
    q, k, v = make_inputs(seed, q_shape, k_shape, v_shape, dtype, spread)
    mask = None if mask_kind is None else make_mask(seed, mask_kind, mask_shape, q_shape[-2])
    return dict(q=q, k=k, v=v, attn_mask=mask, is_causal=is_causal, scale=scale, seed=seed)


@requires_gpu
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("case_id", list(CASES))
def test_float32_matches_reference(case_id, alpha):
    case = _case_inputs(case_id)
    layout = LAYOUTS[case["seed"] % len(LAYOUTS)]
    check_case(**case, alpha=alpha, layout=layout)


@requires_gpu
@pytest.mark.parametrize("alpha", [2.0, 1.5])
@pytest.mark.parametrize("mask_shape", [(2, 4, 37, 45), (37, 45), (45,), (4, 1, 45), (37, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_float32_float_mask_gradient(mask_shape, is_causal, alpha):
    # A learnable additive mask receives dz summed over its broadcast dimensions.
    q, k, v = make_inputs(len(mask_shape), (2, 4, 37, 16), (2, 4, 45, 16), (2, 4, 45, 16))
    mask = torch.randn(*mask_shape, generator=torch.Generator().manual_seed(5)).float().double()
    check_case(q, k, v, mask, is_causal, alpha=alpha, seed=len(mask_shape))


@requires_gpu
@pytest.mark.parametrize("alpha", [2.0, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
def test_long_sequences(alpha, dtype, is_causal):
    # L = 2048: 128 query blocks and 64 key tiles per row; a long row's threshold search.
    q, k, v = make_inputs(11, (1, 2, 2048, 64), (1, 2, 2048, 64), (1, 2, 2048, 64), dtype)
    check_case(q, k, v, None, is_causal, alpha=alpha, dtype=dtype, seed=11)


# ---- float16 / bfloat16 -----------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.25])
@pytest.mark.parametrize("case_id", ["odd-lengths", "tiles-causal", "tiles-causal-tall",
                                     "head-128", "head-256", "broadcast", "very-sparse"])
def test_half_precision_matches_reference(case_id, alpha, dtype):
    case = _case_inputs(case_id, dtype)
    layout = LAYOUTS[case["seed"] % len(LAYOUTS)]
    check_case(**case, alpha=alpha, dtype=dtype, layout=layout)


# ---- special rows and sizes -------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_one_key_gets_all_the_weight(dtype, alpha):
    # L_k = 1: p = 1, τ = x − 1, output = U = v, and the scores get no gradient (dz = s·(dp − δ)
    # with δ = dp); dV = dO.
    q, k, v = make_inputs(2, (3, 5, 8), (3, 1, 8), (3, 1, 4), dtype)
    outs = forward(*(on_cuda(t, dtype) for t in (q, k, v)), alpha=alpha)
    output, tau, support_value, weights = outs
    x = (alpha - 1) * (q @ k.transpose(-2, -1)).squeeze(-1) / math.sqrt(8)
    assert torch.equal(weights.cpu(), torch.ones(3, 5, 1, dtype=dtype))
    assert_close(output, v.expand(3, 5, 4), 0, "output")
    assert_close(support_value, v.expand(3, 5, 4), 0, "support_value")
    assert_close(tau, x - 1, FLOAT32_TOLERANCE, "tau")
    grad_output = torch.randn(3, 5, 4).to(dtype)
    dq, dk, dv, _ = backward(grad_output.cuda(), *(on_cuda(t, dtype) for t in (q, k, v)), None,
                             False, None, outs, alpha)
    # dp − δ is zero up to the rounding of two dot products summed in different orders.
    assert_close(dq, torch.zeros(dq.shape), FLOAT32_TOLERANCE, "grad of query")
    assert_close(dk, torch.zeros(dk.shape), FLOAT32_TOLERANCE, "grad of key")
    assert_close(dv, grad_output.double().sum(1, keepdim=True), tolerance(dtype), "grad of value")


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["bool", "float", "causal-short-keys"])
def test_fully_masked_rows_give_zeros_and_zero_gradients(dtype, mask_kind):
    q, k, v = (torch.randn(2, n, 8).to(dtype) for n in (20, 21, 21))
    allowed = torch.ones(2, 20, 21, dtype=torch.bool)
    allowed[0, 1] = False
    allowed[1, 3:17] = False
    mask = {"bool": allowed, "float": torch.zeros(2, 20, 21).masked_fill(~allowed, -math.inf),
            "causal-short-keys": None}[mask_kind]
    if mask_kind == "causal-short-keys":  # no key at all
        k, v = k[:, :0], v[:, :0]
    inputs = [on_cuda(t) for t in (q, k, v)]
    gmask = None if mask is None else mask.cuda()
    outs = forward(*inputs, gmask, False, None, True, 2.0)
    output, tau, support_value, weights = (t.cpu() for t in outs)
    hidden = ~allowed.any(-1) if mask is not None else torch.ones(2, 20, dtype=torch.bool)
    assert (tau[hidden] == math.inf).all() and torch.isfinite(tau[~hidden]).all()
    assert torch.equal(output[hidden], torch.zeros_like(output[hidden]))
    assert torch.equal(support_value[hidden], torch.zeros_like(support_value[hidden]))
    assert torch.equal(weights[hidden], torch.zeros_like(weights[hidden]))
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    grad_output = torch.randn(output.shape).to(dtype).cuda()
    dq, dk, dv, dmask = backward(grad_output, *inputs, gmask, False, None, outs, 2.0,
                                 grad_mask=mask_kind == "float")
    assert torch.equal(dq.cpu()[hidden], torch.zeros_like(dq.cpu()[hidden]))
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    if mask_kind == "float":
        assert torch.equal(dmask.cpu()[hidden], torch.zeros_like(dmask.cpu()[hidden]))
        assert torch.isfinite(dmask).all()


@requires_gpu
def test_many_batch_dimensions_and_empty_problems():
    # More broadcast batch dimensions than the kernels index directly (the operands are
    # flattened), and empty sizes.
    q, k, v = make_inputs(7, (2, 2, 2, 2, 2, 2, 2, 5, 4), (2, 1, 2, 2, 1, 2, 2, 6, 4), (6, 3))
    check_case(q, k, v, alpha=1.5, seed=7)
    output, tau, support_value, weights = forward(
        *(torch.randn(0, n, 4, device="cuda") for n in (3, 5, 5)))
    assert output.shape == (0, 3, 4) and tau.shape == (0, 3) and weights.shape == (0, 3, 5)
    output, tau, support_value, weights = forward(
        torch.randn(3, 4, device="cuda"), torch.randn(0, 4, device="cuda"),
        torch.randn(0, 2, device="cuda"))
    assert torch.equal(output, torch.zeros(3, 2, device="cuda"))
    assert torch.equal(support_value, torch.zeros(3, 2, device="cuda"))
    assert (tau == math.inf).all() and weights.shape == (3, 0)
    output, tau, _, weights = forward(*(torch.randn(2, n, 4, device="cuda") for n in (0, 5, 5)))
    assert output.shape == (2, 0, 4) and tau.shape == (2, 0) and weights.shape == (2, 0, 5)


@requires_gpu
def test_workspace_waves_give_identical_results(monkeypatch):
    # A small workspace budget runs the forward in many waves of blocks; every block computes the
    # same bits whichever wave it is in.
    q, k, v = (torch.randn(3, 2, 150, 32, device="cuda") for _ in range(3))
    mask = torch.rand(150, 150, device="cuda") > 0.2
    expected = forward(q, k, v, mask, True, None, True, 1.5)
    for budget in ("1", str(16 * 150 * 4 * 5 + 3)):  # one block per wave; five blocks per wave
        monkeypatch.setenv("ATTNLAB_SPARSE_WORKSPACE_BYTES", budget)
        for ours, theirs in zip(forward(q, k, v, mask, True, None, True, 1.5), expected):
            assert torch.equal(ours, theirs)
    monkeypatch.setenv("ATTNLAB_SPARSE_WORKSPACE_BYTES", "lots")
    with pytest.raises(RuntimeError, match=r"ATTNLAB_SPARSE_WORKSPACE_BYTES must be a positive"):
        forward(q, k, v)


@requires_gpu
@pytest.mark.parametrize("mask_kind", ["float", "bool"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_masked_nonfinite_scores_stay_hidden(mask_kind, bad):
    # Rows 0-3 cannot see key 3, whose scores are NaN or ±inf: they stay finite (and match the
    # reference); the rows that see it are all NaN (a NaN or +inf score has no threshold) or,
    # for a −inf score, treat the key as hidden.
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, n, 40, generator=gen).double() for n in (6, 7, 7))
    k[0, 3, 0] = bad
    allowed = torch.ones(6, 7, dtype=torch.bool)
    allowed[:4, 3] = False
    mask = allowed if mask_kind == "bool" else torch.zeros(6, 7).masked_fill(~allowed, -math.inf)
    inputs = [on_cuda(t, torch.float32) for t in (q, k, v)]
    output, tau, _, weights = (t.cpu() for t in forward(*inputs, mask.cuda(), alpha=1.5))
    assert torch.isfinite(output[0, :4]).all() and torch.isfinite(weights[0, :4]).all()
    assert torch.isfinite(output[1]).all()
    clean = reference(q[:, :4], k, v, allowed[:4], alpha=1.5)
    assert_close(output[0, :4], clean["output"][0], FLOAT32_TOLERANCE, "rows that cannot see it")
    sees = output[0, 4:]
    q_sign = torch.sign(q[0, 4:, 0])  # +inf·q: +inf (no threshold: NaN) or -inf (hidden)
    for row, sign in zip(sees, q_sign):
        if math.isnan(bad) or sign > 0:
            assert torch.isnan(row).all()
        else:
            assert torch.isfinite(row).all()


@requires_gpu
def test_deterministic_and_on_the_current_stream():
    q = torch.randn(4, 2, 300, 64, device="cuda")
    expected = forward(q, q, q, None, True, None, True, 1.5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        outs = forward(q, q, q, None, True, None, True, 1.5)
        grads = backward(torch.ones_like(outs[0]), q, q, q, None, True, None, outs, 1.5)
    stream.synchronize()
    for ours, theirs in zip(outs, expected):
        assert torch.equal(ours, theirs)
    again = backward(torch.ones_like(expected[0]), q, q, q, None, True, None, expected, 1.5)
    for ours, theirs in zip(grads, again):
        assert torch.equal(ours, theirs)


# ---- the CPU operator -------------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case_id", ["odd-lengths", "tiles-causal-tall", "head-31-33",
                                     "broadcast"])
def test_matches_the_cpu_operator(case_id, dtype, alpha):
    # The CPU operator in float32 on the same (rounded) inputs: every output, and the gradients;
    # then the CUDA backward driven by the CPU forward's tau and support value (the two devices
    # share their meaning) gives the same gradients.
    case = _case_inputs(case_id, dtype)
    q, k, v, mask = case["q"], case["k"], case["v"], case["attn_mask"]
    is_causal, scale = case["is_causal"], case["scale"]
    float_mask = mask is not None and mask.dtype != torch.bool
    cpu_mask = None if mask is None else (mask.float() if float_mask else mask)
    cpu_inputs = [t.float() for t in (q, k, v)]
    cpu = forward(*cpu_inputs, cpu_mask, is_causal, scale, True, alpha)
    inputs = [on_cuda(t, dtype) for t in (q, k, v)]
    gmask = None if mask is None else cpu_mask.cuda()
    gpu = forward(*inputs, gmask, is_causal, scale, True, alpha)
    ref = reference(q, k, v, mask, is_causal, scale, alpha)
    rows = (ref["gap"] >= forward_gap(alpha)).expand(gpu[1].shape)
    tol = tolerance(dtype) + FLOAT32_TOLERANCE
    for name, ours, theirs, t in zip(["output", "tau", "support_value", "weights"], gpu, cpu,
                                     [tol, FLOAT32_TOLERANCE, FLOAT32_TOLERANCE, tol]):
        assert ours.shape == theirs.shape, name
        finite = torch.isfinite(theirs)
        assert torch.equal(torch.isfinite(ours.cpu()), finite), f"{name}: where it is finite"
        ours, theirs = ours.cpu().double(), theirs.double()
        if name == "tau":
            assert torch.equal(ours[~finite], theirs[~finite])
            skip = ~finite | ~rows
            ours, theirs = ours.masked_fill(skip, 0), theirs.masked_fill(skip, 0)
        else:
            ours, theirs = ours[rows], theirs[rows]
        assert_close(ours, theirs, t, f"{name} against the CPU operator")

    gen = torch.Generator().manual_seed(3)
    grad_output = torch.randn(gpu[0].shape, generator=gen).to(dtype)
    grad_output[(ref["gap"] < gradient_gap(alpha)).expand(gpu[1].shape)] = 0
    cpu_grads = backward(grad_output.float(), *cpu_inputs, cpu_mask, is_causal, scale, cpu, alpha,
                         grad_mask=float_mask)
    gpu_grads = backward(grad_output.cuda(), *inputs, gmask, is_causal, scale, gpu, alpha,
                         grad_mask=float_mask)
    # The CPU forward's outputs, on the GPU and in the CUDA kernels' dtypes.
    cpu_outs = (cpu[0].to("cuda", dtype), cpu[1].cuda(), cpu[2].cuda(), cpu[3].to("cuda", dtype))
    mixed_grads = backward(grad_output.cuda(), *inputs, gmask, is_causal, scale, cpu_outs, alpha,
                           grad_mask=float_mask)
    names = ["query", "key", "value", "attn_mask"]
    for name, ours, mixed, theirs in zip(names, gpu_grads, mixed_grads, cpu_grads):
        t = FLOAT32_TOLERANCE if name == "attn_mask" else tol
        assert ours.shape == theirs.shape, name
        assert_close(ours.cpu(), theirs.double(), t, f"grad of {name}")
        assert_close(mixed.cpu(), theirs.double(), t, f"grad of {name} from the CPU forward's tau")


# ---- the public operator ----------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalizer,alpha", [("sparsemax", None), ("entmax15", None),
                                             ("entmax", 1.25), ("entmax", 3.0)])
def test_public_operator_with_autograd(normalizer, alpha, dtype):
    # attnlab.scaled_dot_product_attention(normalizer=...) on CUDA tensors, through autograd: the
    # CUDA forward's tau and support value (float32) reach the CUDA backward; a learnable float
    # mask gets its gradient in its own shape and dtype.
    value_alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(normalizer, alpha)
    q, k, v = make_inputs(21, (2, 3, 40, 32), (2, 3, 56, 32), (2, 3, 56, 24), dtype)
    mask = torch.randn(40, 56, generator=torch.Generator().manual_seed(21)).float().double()
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, mask)]
    ref = reference(*ref_inputs, alpha=value_alpha)
    inputs = [on_cuda(t, dtype).requires_grad_() for t in (q, k, v)]
    inputs.append(on_cuda(mask, torch.float32).requires_grad_())
    output, weights = attnlab.scaled_dot_product_attention(
        *inputs[:3], attn_mask=inputs[3], need_weights=True, normalizer=normalizer, alpha=alpha)
    assert output.dtype == dtype and weights.dtype == dtype
    rows = (ref["gap"] >= forward_gap(value_alpha)).expand(output.shape[:-1])
    assert_close(output.detach().cpu()[rows], ref["output"].detach()[rows], tolerance(dtype),
                 "output")
    assert_close(weights.cpu()[rows], ref["weights"].detach()[rows], tolerance(dtype), "weights")
    grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(22))
    grad_output = grad_output.to(dtype).double()
    grad_output[(ref["gap"] < gradient_gap(value_alpha)).expand(output.shape[:-1])] = 0
    grads = torch.autograd.grad(output, inputs, on_cuda(grad_output, dtype))
    ref_grads = torch.autograd.grad(ref["output"], ref_inputs, grad_output)
    for name, grad, ref_grad in zip(["query", "key", "value", "attn_mask"], grads, ref_grads):
        assert grad.shape == ref_grad.shape
        assert grad.dtype == (torch.float32 if name == "attn_mask" else dtype)
        assert_close(grad, ref_grad, FLOAT32_TOLERANCE if name == "attn_mask" else tolerance(dtype),
                     f"grad of {name}")


# ---- operator contract on CUDA ----------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind,is_causal,need_weights,alpha",
                         [("none", False, False, 2.0), ("bool", True, True, 1.5),
                          ("float", False, True, 1.25)])
def test_opcheck_on_cuda(dtype, mask_kind, is_causal, need_weights, alpha):
    # The fake (meta) kernels must agree with the CUDA ones: tau and support_value are float32
    # for every input dtype.
    q, k, v = (torch.randn(2, 3, n, 8, device="cuda", dtype=dtype) for n in (5, 7, 7))
    mask = {"none": None, "bool": torch.rand(5, 7, device="cuda") > 0.3,
            "float": torch.randn(1, 5, 7, device="cuda")}[mask_kind]
    args = (q, k, v, mask, is_causal, None, need_weights, alpha)
    torch.library.opcheck(torch.ops.attnlab._sparse_sdpa_forward.default, args)
    output, tau, support_value, _ = torch.ops.attnlab._sparse_sdpa_forward(*args)
    assert tau.dtype == torch.float32 and support_value.dtype == torch.float32
    backward_args = (torch.randn_like(output), *args[:6], output, tau, support_value, alpha, None,
                     mask_kind == "float")
    torch.library.opcheck(torch.ops.attnlab._sparse_sdpa_backward.default, backward_args)


@requires_gpu
def test_bad_inputs_on_cuda():
    q = torch.randn(2, 4, 8, device="cuda")
    for alpha in (1.0, 0.5, -2.0, math.nan, math.inf):
        with pytest.raises(RuntimeError, match=r"alpha must be a finite number > 1"):
            forward(q, q, q, alpha=alpha)
    with pytest.raises(RuntimeError, match=r"key is on cpu but query is on cuda"):
        forward(q, q.cpu(), q)
    with pytest.raises(RuntimeError, match=r"query must be float32, float16 or bfloat16 on CUDA"):
        forward(q.double(), q.double(), q.double())
    with pytest.raises(RuntimeError, match=r"attn_mask is on cpu but query is on cuda"):
        forward(q, q, q, torch.ones(4, 4, dtype=torch.bool))
    wide = torch.randn(2, 4, 257, device="cuda")
    with pytest.raises(NotImplementedError, match=r"at most 256 features per head, got 257"):
        forward(wide, wide, q)
    outs = forward(q, q, q, alpha=1.5)
    output, tau, support_value, _ = outs
    grad = torch.ones_like(output)

    def call(**changes):
        args = dict(grad_output=grad, query=q, key=q, value=q, attn_mask=None, is_causal=False,
                    scale=None, output=output, tau=tau, support_value=support_value, alpha=1.5)
        args.update(changes)
        return torch.ops.attnlab._sparse_sdpa_backward(*args.values())

    with pytest.raises(RuntimeError, match=r"tau has shape \[2, 3\], expected \[2, 4\]"):
        call(tau=tau[:, :3])
    with pytest.raises(RuntimeError, match=r"support_value has shape"):
        call(support_value=support_value[..., :5])
    with pytest.raises(RuntimeError, match=r"tau is on cpu but output is on cuda"):
        call(tau=tau.cpu())
    with pytest.raises(RuntimeError, match=r"grad_output has dtype Half, expected Float"):
        call(grad_output=grad.half())
    with pytest.raises(RuntimeError, match=r"output has dtype Half, expected Float"):
        call(output=output.half())
    with pytest.raises(RuntimeError, match=r"tau has dtype Long, expected Float"):
        call(tau=tau.long())
    with pytest.raises(RuntimeError, match=r"alpha must be a finite number > 1"):
        call(alpha=1.0)
    with pytest.raises(RuntimeError, match=r"a boolean attn_mask has no gradient"):
        torch.ops.attnlab._sparse_sdpa_backward(grad, q, q, q, torch.ones(4, 4, dtype=torch.bool,
                                                                          device="cuda"),
                                                False, None, output, tau, support_value, 1.5,
                                                None, True)


# ---- a small sweep for compute-sanitizer (tests/cuda_sanitizer.sh) ----------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [3, 40, 100, 200])
@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.25, 3.0])
def test_sparse_small_problems_every_kernel(dtype, dim, alpha):
    # Every kernel once per dtype, head-size family and solver (sparsemax, entmax-1.5, general
    # α with and without Newton), with a float mask, causal, weights, a bool mask and a fully
    # masked row, at sizes small enough for memcheck and racecheck; finite results that agree
    # with the reference where it is well conditioned.
    q = torch.randn(2, 19, dim, device="cuda", dtype=dtype)
    k = torch.randn(1, 37, dim, device="cuda", dtype=dtype)
    v = torch.randn(2, 37, 5, device="cuda", dtype=dtype)
    mask = torch.randn(19, 37, device="cuda")
    mask[3] = -math.inf
    outs = forward(q, k, v, mask, True, None, True, alpha)
    grads = backward(torch.ones_like(outs[0]), q, k, v, mask, True, None, outs, alpha,
                     grad_mask=True)
    bool_mask = torch.rand(37, device="cuda") > 0.5
    outs_bool = forward(q, k, v, bool_mask, False, None, False, alpha)
    grads_bool = backward(torch.ones_like(outs_bool[0]), q, k, v, bool_mask, False, None,
                          outs_bool, alpha)
    torch.cuda.synchronize()
    for t in (*outs, *grads, *outs_bool[:3], *grads_bool[:3]):
        assert not torch.isnan(t).any()
    assert (outs[1][:, 3] == math.inf).all() and torch.isfinite(outs[1][:, 4:]).all()
    ref = reference(q.double().cpu(), k.double().cpu(), v.double().cpu(), mask.double().cpu(),
                    True, alpha=alpha)
    rows = (ref["gap"] >= forward_gap(alpha)).expand(outs[1].shape)
    assert_close(outs[0].cpu()[rows], ref["output"].expand(outs[0].shape)[rows],
                 tolerance(dtype), "output")
