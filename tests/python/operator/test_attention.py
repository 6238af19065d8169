"""attnlab.scaled_dot_product_attention against the float64 reference (reference.py) for every
normalizer: outputs, weights and the gradients of both, on random cases, on the kernels' row
paths and block boundaries, and at the edges (no keys, fully masked rows, ties, huge and tiny
scores, NaN). Gradcheck, autograd's bookkeeping and the operators' registration are in
test_attention_autograd.py; what only the sparse normalizers have (exact zeros, τ, the support
value, α) is in test_sparse_attention.py."""

import math
import random

import pytest
import torch

import attnlab
import reference
from reference import assert_close

sdpa = attnlab.scaled_dot_product_attention

RANDOM_CASES = 240
NORMALIZERS = reference.NORMALIZERS
by_normalizer = pytest.mark.parametrize("normalizer,alpha", NORMALIZERS,
                                        ids=reference.ids(NORMALIZERS))


def make(*shape, seed=0, dtype=torch.float64, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=dtype)


def problem(seed, dtype, batch=(2, 3), len_q=11, len_k=13, dim=8, dim_v=5):
    q = make(*batch, len_q, dim, seed=seed, dtype=dtype)
    k = make(*batch[-1:], len_k, dim, seed=seed + 1, dtype=dtype)  # broadcast
    v = make(*batch, len_k, dim_v, seed=seed + 2, dtype=dtype)
    return q, k, v


# ---- random cases: layouts, broadcasting, masks, causal, scales ----------------------------

def _layout(t, rng):
    """The same values in a different memory layout: contiguous, transposed from a
    [..., L, H, E]-style buffer, a slice of a wider buffer, or a transposed last-two-dims copy."""
    kind = rng.choice(["contiguous", "heads_last", "sliced", "column_major"])
    if kind == "heads_last" and t.dim() >= 3:
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if kind == "sliced":
        wide = torch.empty(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype)
        wide[..., 1:t.shape[-1] + 1] = t
        return wide[..., 1:t.shape[-1] + 1]
    if kind == "column_major":
        return t.transpose(-2, -1).contiguous().transpose(-2, -1)
    return t


def random_case(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    batch = rng.choice([(), (3,), (2, 3), (1, 4), (2, 1, 3)])
    len_q = rng.choice([1, 2, rng.randint(1, 40), rng.randint(40, 150)])
    len_k = rng.choice([1, len_q, rng.randint(1, 40), rng.randint(40, 200)])
    dim = rng.choice([1, 3, 8, rng.randint(1, 70)])
    dim_v = rng.choice([dim, 1, rng.randint(1, 40)])

    def batch_of_input():
        # Inputs may carry fewer or size-1 batch dimensions that broadcast.
        dims = list(batch)
        if dims and rng.random() < 0.3:
            dims = dims[rng.randint(1, len(dims)):]
        return [1 if rng.random() < 0.2 else d for d in dims]

    def make(shape):
        return torch.randn(*shape, generator=gen)

    query = make([*batch_of_input(), len_q, dim])
    key = make([*batch_of_input(), len_k, dim])
    value = make([*batch_of_input(), len_k, dim_v])
    if rng.random() < 0.5:  # make sure the full batch shape is reached at least by one input
        query = make([*batch, len_q, dim])

    mask = None
    mask_kind = rng.choice(["none", "bool", "float"])
    if mask_kind != "none":
        full = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        mask_shape = [*full, len_q, len_k]
        # Drop leading dimensions and set some to 1 so that the mask broadcasts.
        mask_shape = mask_shape[rng.randint(0, len(full)):]
        mask_shape = [1 if (i < len(mask_shape) - 1 and rng.random() < 0.3) else d
                      for i, d in enumerate(mask_shape)]
        if mask_kind == "bool":
            mask = torch.rand(*mask_shape, generator=gen) > 0.3
            if len_q > 1 and mask.shape[-2] == len_q:
                mask[..., 0, :] = False  # a query with every key masked
        else:
            mask = torch.randn(*mask_shape, generator=gen)
            if rng.random() < 0.5:
                mask = mask.masked_fill(torch.rand(*mask_shape, generator=gen) > 0.7, float("-inf"))
    is_causal = rng.random() < 0.3
    scale = rng.choice([None, None, 0.5, 1.7])
    return dict(query=_layout(query, rng), key=_layout(key, rng), value=_layout(value, rng),
                attn_mask=mask, is_causal=is_causal, scale=scale)


# The float32 tests with element-wise bounds run the exact paths and one α by bisection (1.75 and
# 3 run in the row-path tests: for α > 2 a p near the threshold moves as the square root of τ's
# rounding). The bounds are 1e-5 (weights 1e-6) plus 1e-5 relative on well-scaled cases: scores
# below 16 in magnitude, which float32 forms to within about 1e-6. Beyond that (a tenth of the
# random cases, scores up to 55) the rounding of the scores alone moves a sparse map's weights
# by up to as much (their slope is up to 1; softmax's, p·(1−p), at most 1/4, keeps it within the
# bound), and the sparse maps are held to 1e-5 of the largest entry, 1e-4 for gradients.
FLOAT32_NORMALIZERS = NORMALIZERS[:4]
by_float32_normalizer = pytest.mark.parametrize("normalizer,alpha", FLOAT32_NORMALIZERS,
                                                ids=reference.ids(FLOAT32_NORMALIZERS))


def well_scaled(case):
    z = reference.scores(case["query"], case["key"], case["attn_mask"], case["is_causal"],
                         case["scale"])
    z = z[torch.isfinite(z)]
    return z.numel() == 0 or z.abs().max().item() < 16


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
@by_float32_normalizer
def test_random_case_matches_reference(normalizer, alpha, seed):
    case = random_case(seed)
    output, weights = sdpa(**case, need_weights=True, normalizer=normalizer, alpha=alpha)
    output_only, none = sdpa(**case, normalizer=normalizer, alpha=alpha)
    ref_output, ref_weights = reference.attention(**case, normalizer=normalizer, alpha=alpha)
    assert none is None
    assert output.dtype == torch.float32 and output.shape == ref_output.shape
    # Weights come at the output's batch shape (value's batch dimensions broadcast in too).
    assert weights.shape == (*output.shape[:-1], case["key"].shape[-2])
    ref_weights = ref_weights.expand(weights.shape)
    if normalizer == "softmax" or well_scaled(case):
        torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(output_only.double(), ref_output, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)
    else:
        assert_close(output, ref_output, "output", torch.float32)
        assert_close(output_only, ref_output, "output without weights", torch.float32)
        assert_close(weights, ref_weights, "weights", torch.float32)
    assert not torch.isnan(output).any()


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("seed", range(0, RANDOM_CASES, 4))
@by_float32_normalizer
def test_random_case_gradients_match_reference(normalizer, alpha, seed, need_weights):
    # With need_weights the backward reads the stored weights instead of recomputing them.
    case = random_case(seed)
    inputs = {name: case[name].detach().requires_grad_() for name in ("query", "key", "value")}
    output, _ = sdpa(**{**case, **inputs}, need_weights=need_weights, normalizer=normalizer,
                     alpha=alpha)
    # Seeded: the same upstream gradient whatever ran before (a re-run sees the same case).
    grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(output, list(inputs.values()), grad_output)

    ref_inputs = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    ref_output, _ = reference.attention(**{**case, **ref_inputs}, normalizer=normalizer,
                                        alpha=alpha)
    ref_grads = torch.autograd.grad(ref_output, list(ref_inputs.values()), grad_output.double())
    # A gradient that is exactly 0 in the reference (one key: the softmax is constant) is a
    # difference of terms as large as the others in float32: its error is relative to them.
    magnitude = max(1.0, max(float(ref.abs().max()) for ref in ref_grads if ref.numel()))
    strict = normalizer == "softmax" or well_scaled(case)
    for name, grad, ref in zip(inputs, grads, ref_grads):
        assert grad.shape == inputs[name].shape, name
        if strict:
            torch.testing.assert_close(grad.double(), ref, rtol=1e-4, atol=1e-5 * magnitude,
                                       msg=name)
        else:
            assert_close(grad, ref, f"gradient of {name}", torch.float32, gradient=True)


# ---- the kernels' row paths ----------------------------------------------------------------

SHAPES = {  # the sparse kernels' three row paths: short rows (dense, no lists), long sparse rows
    # (support lists, gathered products) and long dense rows (lists turned dense)
    "short": dict(len_q=11, len_k=13, scale=None),
    "long sparse": dict(len_q=9, len_k=300, scale=2.0),
    "long dense": dict(len_q=9, len_k=300, scale=1e-3),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES)
@by_normalizer
def test_row_paths_match_reference(normalizer, alpha, shape, dtype):
    s = SHAPES[shape]
    q, k, v = problem(3, dtype, len_q=s["len_q"], len_k=s["len_k"])
    mask = make(s["len_q"], s["len_k"], seed=9) > -1.0  # boolean, broadcast over the batch
    for causal in (False, True):
        output, weights = sdpa(q, k, v, mask, causal, s["scale"], True, normalizer, alpha)
        ref_out, ref_w = reference.attention(q, k, v, mask, causal, s["scale"], normalizer, alpha)
        assert output.dtype == weights.dtype == dtype
        assert_close(output, ref_out, "output", dtype)
        assert_close(weights, ref_w, "weights", dtype)
        # Same output without the weights.
        out2, none = sdpa(q, k, v, mask, causal, s["scale"], normalizer=normalizer, alpha=alpha)
        assert none is None
        torch.testing.assert_close(out2, output, rtol=0,
                                   atol=1e-12 if dtype == torch.float64 else 2e-6)


# s = p^(2−α) is unbounded as p → 0 for α > 2: float32 gradients of α > 2 lose digits near the
# support's edge, so α = 3 is checked in float64 only.
GRADIENT_CASES = [(n, a, dtype) for (n, a) in NORMALIZERS
                  for dtype in (torch.float64, torch.float32)
                  if not (a is not None and a > 2 and dtype == torch.float32)]


@pytest.mark.parametrize("need_weights", [False, True], ids=["recomputed", "from-weights"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("normalizer,alpha,dtype", GRADIENT_CASES,
                         ids=[f"{reference.normalizer_id(n, a)}-{str(d)[-7:]}"
                              for n, a, d in GRADIENT_CASES])
def test_row_path_gradients_match_reference(normalizer, alpha, dtype, shape, need_weights):
    s = SHAPES[shape]
    q, k, v = problem(21, dtype, len_q=s["len_q"], len_k=s["len_k"])
    mask = make(3, s["len_q"], s["len_k"], seed=4, dtype=dtype)  # float: [heads, L_q, L_k]
    mask = mask.masked_fill(make(s["len_q"], s["len_k"], seed=8) > 1.2, -math.inf)
    causal = shape != "long dense"
    # Away from changes of support, where sparsemax's gradient jumps.
    gaps = reference.support_gaps(q, k, mask, causal, s["scale"], normalizer, alpha)
    assert gaps.min() > 1e-5
    leaves = [t.clone().requires_grad_() for t in (q, k, v, mask)]
    output, _ = sdpa(*leaves[:3], leaves[3], causal, s["scale"], need_weights, normalizer, alpha)
    grad = make(*output.shape, seed=30, dtype=dtype)
    grads = torch.autograd.grad(output, leaves, grad)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, mask)]
    ref_out, _ = reference.attention(*ref_leaves[:3], ref_leaves[3], causal, s["scale"],
                                     normalizer, alpha)
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, grad.double())
    for name, got, want in zip(["query", "key", "value", "attn_mask"], grads, ref_grads):
        assert got.dtype == dtype
        assert_close(got, want, f"gradient of {name}", dtype, gradient=True)


# ---- lengths across the kernels' blocks ----------------------------------------------------

@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("len_q,len_k", [(700, 1100), (300, 129), (1, 600)])
@by_float32_normalizer
def test_long_sequences_cross_block_boundaries(normalizer, alpha, len_q, len_k, is_causal):
    gen = torch.Generator().manual_seed(len_q + len_k)
    q = torch.randn(2, len_q, 24, generator=gen)
    k = torch.randn(1, len_k, 24, generator=gen)
    v = torch.randn(2, len_k, 10, generator=gen, requires_grad=True)
    mask = torch.rand(len_k, generator=gen) > 0.1  # a key-padding style mask
    output, weights = sdpa(q, k, v, mask, is_causal, need_weights=True, normalizer=normalizer,
                           alpha=alpha)
    ref_output, ref_weights = reference.attention(q, k, v, mask, is_causal,
                                                  normalizer=normalizer, alpha=alpha)
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)
    (grad_v,) = torch.autograd.grad(output.sum(), v)
    v_ref = v.detach().double().requires_grad_()
    ref_output, _ = reference.attention(q, k, v_ref, mask, is_causal, normalizer=normalizer,
                                        alpha=alpha)
    (ref_grad_v,) = torch.autograd.grad(ref_output.sum(), v_ref)
    torch.testing.assert_close(grad_v.double(), ref_grad_v, rtol=1e-4, atol=1e-5)


# The two tests below follow the softmax kernel's blocking (its packed K and V panels, its
# causal groups of rows): they run softmax only.

def assert_output_and_gradients_match_reference(q, k, v, mask, is_causal, gen):
    """attnlab's float32 softmax output and its gradients (for a random output gradient drawn
    from gen) against the float64 reference: output within 1e-5, gradients within 1e-4
    relative."""
    output, _ = attnlab.scaled_dot_product_attention(q, k, v, mask, is_causal)
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_output, _ = reference.attention(*ref_inputs, mask, is_causal)
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-5)
    grad_output = torch.randn(output.shape, generator=gen)
    grads = torch.autograd.grad(output, (q, k, v), grad_output)
    ref_grads = torch.autograd.grad(ref_output, ref_inputs, grad_output.double())
    for name, grad, ref in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(grad.double(), ref, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("mask_kind", [None, "float"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("len_q,len_k", [(700, 1100), (1100, 700), (517, 517), (2050, 1030)])
def test_long_sequences_without_weights(len_q, len_k, is_causal, mask_kind):
    """The forward without weights at lengths that span several query and key blocks (a head's
    K and V packed once for all its query blocks, K kept for the next head where it is the
    same and V not; key blocks the causal mask cuts run in groups of rows; lengths and head
    sizes that are not multiples of the groups or panels), and the backward, whose key blocks
    pack K and V once for all of their query blocks."""
    gen = torch.Generator().manual_seed(len_q * 7 + len_k)
    q = torch.randn(3, 2, len_q, 24, generator=gen)
    # Consecutive heads share K but not V: a packed K may be kept, V must be packed again.
    k = torch.randn(3, 1, len_k, 24, generator=gen).expand(3, 2, len_k, 24)
    v = torch.randn(1, 2, len_k, 40, generator=gen).expand(3, 2, len_k, 40)
    mask = None
    if mask_kind == "float":
        mask = torch.randn(len_q, len_k, generator=gen)
        mask[:, 3] = float("-inf")
    q, k, v = (t.requires_grad_() for t in (q, k.detach(), v.detach()))
    assert_output_and_gradients_match_reference(q, k, v, mask, is_causal, gen)


@pytest.mark.parametrize("dim_qk,dim_v", [(24, 32), (64, 64), (40, 48)])
@pytest.mark.parametrize("len_q,len_k", [(517, 517), (700, 1100), (1100, 700), (300, 129),
                                         (2050, 1030)])
def test_long_causal_sequences_with_values_read_in_place(len_q, len_k, dim_qk, dim_v):
    """The causal forward where V's rows are read in place (dim_v a multiple of 16): a key
    block the mask cuts runs as one product each way, whose blocks of rows skip the score
    panels and the P·V steps hidden from all of their rows (the skipped scores are never
    written, so every visible one must still be), across query blocks, key blocks and
    lengths that are not multiples of the panels."""
    gen = torch.Generator().manual_seed(len_q * 13 + len_k + dim_v)
    q, k = (torch.randn(2, 2, n, dim_qk, generator=gen) for n in (len_q, len_k))
    v = torch.randn(2, 2, len_k, dim_v, generator=gen)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert_output_and_gradients_match_reference(q, k, v, None, True, gen)


# ---- edge cases ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@by_normalizer
def test_fully_masked_rows_give_zeros_and_zero_gradients(normalizer, alpha, dtype):
    q = make(2, 4, 8, seed=60, dtype=dtype).requires_grad_()
    k = make(2, 5, 8, seed=61, dtype=dtype).requires_grad_()
    v = make(2, 5, 3, seed=62, dtype=dtype).requires_grad_()
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = False
    mask[1] = False
    output, weights = sdpa(q, k, v, mask, need_weights=True, normalizer=normalizer, alpha=alpha)
    zeros = lambda *shape: torch.zeros(*shape, dtype=dtype)  # noqa: E731
    assert torch.equal(output[0, 1], zeros(3)) and torch.equal(output[1], zeros(4, 3))
    assert torch.equal(weights[0, 1], zeros(5)) and torch.equal(weights[1], zeros(4, 5))
    output.sum().backward()
    assert torch.equal(q.grad[1], zeros(4, 8)) and torch.equal(q.grad[0, 1], zeros(8))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@by_normalizer
def test_no_keys_at_all(normalizer, alpha):
    q = make(2, 4, 3, seed=1).requires_grad_()
    k, v = make(2, 0, 3, seed=2).requires_grad_(), make(2, 0, 5, seed=3).requires_grad_()
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    assert out.shape == (2, 4, 5) and torch.equal(out, torch.zeros_like(out))
    assert w.shape == (2, 4, 0)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(dq, torch.zeros_like(dq)) and dk.shape == (2, 0, 3) and dv.shape == (2, 0, 5)


@by_normalizer
def test_causal_rows_beyond_and_before_the_keys(normalizer, alpha):
    for len_q, len_k in ((9, 4), (4, 9), (70, 70), (3, 100)):
        q, k, v = problem(70, torch.float64, batch=(2,), len_q=len_q, len_k=len_k)
        out, w = sdpa(q, k, v, is_causal=True, need_weights=True, normalizer=normalizer,
                      alpha=alpha)
        ref_out, ref_w = reference.attention(q, k, v, None, True, None, normalizer, alpha)
        assert_close(out, ref_out, "output", torch.float64)
        assert_close(w, ref_w, "weights", torch.float64)
        hidden = ~torch.ones(len_q, len_k, dtype=torch.bool).tril()
        assert torch.equal(w[:, hidden], torch.zeros_like(w[:, hidden]))


@by_normalizer
def test_ties(normalizer, alpha):
    # All scores equal: every normalizer gives the uniform distribution.
    q = torch.zeros(3, 7, 4, dtype=torch.float64)
    k, v = make(3, 10, 4, seed=80), make(3, 10, 2, seed=81)
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    torch.testing.assert_close(w, torch.full_like(w, 0.1), rtol=0, atol=1e-12)
    torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand(3, 7, 2), rtol=0, atol=1e-12)
    # Two tied leaders far above the rest: half each, and exact zeros where the reference has
    # them (everywhere else for the sparse normalizers, nowhere for softmax).
    scores_k = torch.zeros(1, 6, 1, dtype=torch.float64)
    scores_k[0, 1] = scores_k[0, 4] = 50.0
    q1 = torch.ones(1, 2, 1, dtype=torch.float64)
    v1 = make(1, 6, 3, seed=82)
    _, w = sdpa(q1, scores_k, v1, scale=1.0, need_weights=True, normalizer=normalizer,
                alpha=alpha)
    _, ref_w = reference.attention(q1, scores_k, v1, scale=1.0, normalizer=normalizer,
                                   alpha=alpha)
    expected = torch.zeros(1, 2, 6, dtype=torch.float64)
    expected[..., [1, 4]] = 0.5
    assert torch.equal(w == 0, ref_w == 0)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@by_normalizer
def test_huge_and_tiny_logits(normalizer, alpha, dtype):
    q, k, v = problem(90, dtype, batch=(2,), len_q=6, len_k=150)
    # Huge: a one-hot row on the largest score, finite everywhere.
    out, w = sdpa(q, k, v, scale=1e6, need_weights=True, normalizer=normalizer, alpha=alpha)
    ref_out, ref_w = reference.attention(q, k, v, None, False, 1e6, normalizer, alpha)
    assert torch.equal(w, ref_w.to(dtype)) and ((w == 1).sum(-1) == 1).all()
    assert_close(out, ref_out, "output, huge logits", dtype)
    if dtype == torch.float64:
        # The backward recomputes p from the stored τ or log-sum-exp in the inputs' dtype: at
        # logits of 1e6 float64 resolves it (float32 does not, as it would not resolve a
        # log-sum-exp).
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = sdpa(*leaves, scale=1e6, normalizer=normalizer, alpha=alpha)
        grads = torch.autograd.grad(out.sum(), leaves)
        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out, _ = reference.attention(*ref_leaves, None, False, 1e6, normalizer, alpha)
        for got, want in zip(grads, torch.autograd.grad(ref_out.sum(), ref_leaves)):
            assert_close(got, want, "gradient, huge logits", dtype, gradient=True)
    # Scores near the float range: still finite, still one-hot.
    big = torch.tensor([[[1e30], [-1e30], [3e29]]], dtype=dtype)
    _, w = sdpa(torch.ones(1, 1, 1, dtype=dtype), big, big, scale=1.0, need_weights=True,
                normalizer=normalizer, alpha=alpha)
    assert torch.equal(w, torch.tensor([[[1.0, 0.0, 0.0]]], dtype=dtype))
    # Tiny: every key in the support, close to uniform.
    out, w = sdpa(q, k, v, scale=1e-9, need_weights=True, normalizer=normalizer, alpha=alpha)
    ref_out, ref_w = reference.attention(q, k, v, None, False, 1e-9, normalizer, alpha)
    assert (w > 0).all()
    assert_close(w, ref_w, "weights, tiny logits", dtype)
    assert_close(out, ref_out, "output, tiny logits", dtype)


@by_normalizer
def test_nan_stays_in_its_row(normalizer, alpha):
    q, k, v = problem(110, torch.float32, batch=(2,), len_q=4, len_k=70)
    q[1, 2, 0] = math.nan
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    assert torch.isnan(out[1, 2]).all() and torch.isnan(w[1, 2]).all()
    rest = torch.ones(2, 4, dtype=torch.bool)
    rest[1, 2] = False
    assert torch.isfinite(out[rest]).all() and torch.isfinite(w[rest]).all()


@by_normalizer
def test_length_one(normalizer, alpha):
    # One key: it takes everything.
    q, k, v = problem(100, torch.float64, batch=(3,), len_q=5, len_k=1)
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    assert torch.equal(w, torch.ones_like(w))
    torch.testing.assert_close(out, v.expand(3, 5, v.shape[-1]))
    # No batch dimensions, one query and one key of one feature.
    v = torch.randn(1, 6)
    out, w = sdpa(torch.randn(1, 1), torch.randn(1, 1), v, need_weights=True,
                  normalizer=normalizer, alpha=alpha)
    torch.testing.assert_close(out, v)
    assert w.item() == 1.0
    # One query.
    q, k, v = problem(101, torch.float64, batch=(3,), len_q=1, len_k=9)
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    ref_out, ref_w = reference.attention(q, k, v, None, False, None, normalizer, alpha)
    assert_close(w, ref_w, "weights", torch.float64)
    assert_close(out, ref_out, "output", torch.float64)


@by_normalizer
def test_empty_batch(normalizer, alpha):
    out, w = sdpa(torch.randn(0, 3, 4), torch.randn(0, 5, 4), torch.randn(0, 5, 2),
                  need_weights=True, normalizer=normalizer, alpha=alpha)
    assert out.shape == (0, 3, 2) and w.shape == (0, 3, 5)
    q = torch.randn(0, 3, 5, 4, requires_grad=True)
    k = torch.randn(0, 3, 6, 4, requires_grad=True)
    v = torch.randn(0, 3, 6, 2, requires_grad=True)
    out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
    assert out.shape == (0, 3, 5, 2) and w.shape == (0, 3, 5, 6)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


# ---- the public entry points ----------------------------------------------------------------

def test_softmax_matches_torch_sdpa_without_mask():
    q, k, v = torch.randn(3, 2, 17, 16), torch.randn(3, 2, 23, 16), torch.randn(3, 2, 23, 16)
    for is_causal in (False, True):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        output, _ = sdpa(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)


@by_normalizer
def test_reachable_through_torch_ops(normalizer, alpha):
    q = torch.randn(2, 3, 4)
    output, weights = torch.ops.attnlab.scaled_dot_product_attention(
        q, q, q, need_weights=True, normalizer=normalizer, alpha=alpha)
    ref_output, ref_weights = reference.attention(q, q, q, normalizer=normalizer, alpha=alpha)
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)


@by_normalizer
def test_float64_matches_reference_tightly(normalizer, alpha):
    q, k, v = (torch.randn(2, 9, 5, dtype=torch.float64) for _ in range(3))
    output, weights = sdpa(q, k, v, is_causal=True, need_weights=True, normalizer=normalizer,
                           alpha=alpha)
    ref_output, ref_weights = reference.attention(q, k, v, is_causal=True, normalizer=normalizer,
                                                  alpha=alpha)
    assert output.dtype == torch.float64
    torch.testing.assert_close(output, ref_output, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)


@by_normalizer
def test_default_scale_is_inverse_sqrt_of_features(normalizer, alpha):
    # Small scores: at unit ones a very sparse normalizer can put every row on one key at both
    # scales, and the outputs would not tell the scales apart.
    q, k, v = make(5, 12, seed=1, dtype=torch.float32, scale=0.05), make(7, 12, seed=2,
                  dtype=torch.float32), make(7, 3, seed=3, dtype=torch.float32)
    a, _ = sdpa(q, k, v, normalizer=normalizer, alpha=alpha)
    b, _ = sdpa(q, k, v, scale=1 / math.sqrt(12), normalizer=normalizer, alpha=alpha)
    c, _ = sdpa(q, k, v, scale=1.0, normalizer=normalizer, alpha=alpha)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)
