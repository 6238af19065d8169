"""Property-based tests (hypothesis) of every attnlab operator against the float64 reference.

Hypothesis draws the shape of a problem (lengths from 1 to a few hundred, odd sizes, L_q ≠ L_k,
E_v ≠ E, leading batch dimensions that broadcast), the mask (none, boolean or floating point with
-inf entries, broadcast along any dimension), causality, the scale, the dtype and the memory
layout of every input (transposed, sliced, strided, expanded); the values come from a seeded
generator. Each property runs twice: a default run (about 2,100 examples in all) and a
`slow`-marked run with 25 times as many (`python3 -m pytest -m slow tests/python/operator/test_properties.py`).
"""

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
import reference

SLOW_FACTOR = 25  # the slow run: 25 × 2,100 = 52,500 examples


def property_tests(strategy, examples):
    """Turns ``check(case)`` into a default test of ``examples`` examples and a slow one."""
    def decorate(check):
        def variant(count):
            return settings(max_examples=count, deadline=None, database=None,
                            suppress_health_check=[HealthCheck.too_slow])(given(strategy)(check))
        return variant(examples), pytest.mark.slow(variant(examples * SLOW_FACTOR))
    return decorate


def lengths():
    """1, small and odd, across a query/key block boundary (32/64), or long (past 512 keys)."""
    ranges = [(1, 1)] + [(2, 17)] * 5 + [(18, 140)] * 3 + [(141, 600)]  # long ones: 1 in 10
    return st.sampled_from(ranges).flatmap(lambda bounds: st.integers(*bounds))


LAYOUTS = ["contiguous", "column_major", "heads_transposed", "sliced", "strided_rows", "expanded"]


def lay_out(t: torch.Tensor, layout: str, batch: tuple) -> torch.Tensor:
    """The same values as ``t`` in another memory layout (``expanded`` also broadcasts ``t``
    to the full batch shape, with stride 0 along the broadcast dimensions)."""
    if layout == "column_major":
        return t.transpose(-2, -1).contiguous().transpose(-2, -1)
    if layout == "heads_transposed" and t.dim() >= 3:  # heads taken out of [B, L, H, E]
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if layout == "sliced":  # a slice of a wider buffer: rows longer than the features
        wide = t.new_zeros(*t.shape[:-1], t.shape[-1] + 3)
        wide[..., 2:t.shape[-1] + 2] = t
        return wide[..., 2:t.shape[-1] + 2]
    if layout == "strided_rows":  # every other row of a taller buffer
        tall = t.new_zeros(*t.shape[:-2], 2 * t.shape[-2], t.shape[-1])
        tall[..., ::2, :] = t
        return tall[..., ::2, :]
    if layout == "expanded":
        return t.expand(*torch.broadcast_shapes(t.shape[:-2], batch), *t.shape[-2:])
    return t


@dataclass
class Case:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    seed: int  # of the upstream gradient: a re-run of an example must see the same one

    def args(self, **overrides):
        return dict(query=self.query, key=self.key, value=self.value, attn_mask=self.attn_mask,
                    is_causal=self.is_causal, scale=self.scale) | overrides


@st.composite
def attention_cases(draw, dtypes=(torch.float32, torch.float64), head_sizes=(1, 8, 16, 64),
                    max_dim=70, max_dim_v=40):
    """A Case: head sizes drawn from ``head_sizes`` or 1..``max_dim`` (value: the same, or
    1..``max_dim_v``), inputs of a dtype from ``dtypes``; masks float32/float64 or bool."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    len_q, len_k = draw(lengths()), draw(lengths())
    if math.prod(batch) * len_q * len_k > 20_000:  # keep one example's float64 reference cheap
        batch = batch[-1:] if batch else ()
        batch = (1,) * len(batch)
    dim = draw(st.one_of(st.sampled_from(list(head_sizes)), st.integers(1, max_dim)))
    dim_v = draw(st.one_of(st.just(dim), st.integers(1, max_dim_v)))
    dtype = draw(st.sampled_from(list(dtypes)))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = torch.Generator().manual_seed(seed)

    def input_batch():
        # Fewer leading dimensions, or size 1 where the others have more: both broadcast.
        dims = batch[draw(st.integers(0, len(batch))):] if draw(st.booleans()) else batch
        return tuple(1 if draw(st.integers(0, 4)) == 0 else d for d in dims)

    def make(*shape):
        t = torch.randn(*shape, generator=gen, dtype=dtype)
        return lay_out(t, draw(st.sampled_from(LAYOUTS)), batch)

    query = make(*input_batch(), len_q, dim)
    key = make(*input_batch(), len_k, dim)
    value = make(*input_batch(), len_k, dim_v)

    mask = None
    mask_kind = draw(st.sampled_from(["none", "bool", "float"]))
    if mask_kind != "none":
        full = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        shape = [*full, len_q, len_k][draw(st.integers(0, len(full))):]
        shape = [1 if draw(st.integers(0, 3)) == 0 else d for d in shape]  # any may broadcast
        if mask_kind == "bool":
            mask = torch.rand(*shape, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.9]))
        else:
            mask = torch.randn(*shape, generator=gen,
                               dtype=draw(st.sampled_from([torch.float32, torch.float64])))
            if draw(st.booleans()):
                blocked = torch.rand(*shape, generator=gen) > draw(st.sampled_from([0.5, 0.95]))
                mask = mask.masked_fill(blocked, float("-inf"))
        if mask.dim() >= 2 and draw(st.booleans()):  # a transposed mask is read correctly too
            mask = mask.transpose(-2, -1).contiguous().transpose(-2, -1)
    scale = draw(st.one_of(st.none(), st.floats(-3.0, 3.0, allow_nan=False)))
    return Case(query, key, value, mask, draw(st.booleans()), scale, seed)


def upstream_gradient(like, seed):
    return torch.randn(like.shape, generator=torch.Generator().manual_seed(seed + 1),
                       dtype=like.dtype)


def largest(tensors):
    return max((t.abs().max().item() for t in tensors if t.numel()), default=0.0)


def assert_matches(actual, expected, what, precision, gradient=False, magnitude=None):
    """Results computed in float64 (``precision``) to 1e-9; in float32 to the error float32
    arithmetic makes, relative to ``magnitude`` (default: the largest expected entry; a sum
    over up to 600 keys and 70 features). A float64 mask's gradient is computed at the inputs'
    precision."""
    assert actual.shape == expected.shape, f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    if precision == torch.float64:
        rtol, atol = 1e-9, 1e-9
    else:
        rtol, atol = (2e-3, 2e-4) if gradient else (2e-4, 2e-5)
    magnitude = max(1.0, largest([expected]) if magnitude is None else magnitude)
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol * magnitude,
                               msg=lambda m: f"{what}: {m}")


def gradient_precision(case: Case, grad: torch.Tensor):
    """The coarser of the inputs' dtype and the gradient's (a float32 mask's gradient is
    rounded to float32 even when the inputs are float64)."""
    return torch.float32 if torch.float32 in (case.query.dtype, grad.dtype) else torch.float64


def leaves(case: Case):
    """Copies of the differentiable inputs, same strides, requiring grad."""
    def leaf(t):
        return t.detach().requires_grad_() if t is not None else None
    mask = case.attn_mask
    grad_mask = mask is not None and mask.is_floating_point()
    return leaf(case.query), leaf(case.key), leaf(case.value), leaf(mask) if grad_mask else mask


def reference_gradients(case: Case, grad_output: torch.Tensor):
    q, k, v = (t.detach().double().requires_grad_()
               for t in (case.query, case.key, case.value))
    mask = case.attn_mask
    if mask is not None and mask.is_floating_point():
        mask = mask.detach().double().requires_grad_()
    output, _ = reference.attention(**case.args(query=q, key=k, value=v, attn_mask=mask))
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    return torch.autograd.grad(output, inputs, grad_output.double())


@property_tests(attention_cases(), examples=1000)
def check_attention_values_weights_and_gradients(case):
    q, k, v, mask = leaves(case)
    need_weights = q.numel() % 2 == 0  # both backward paths: stored weights or recomputed
    output, weights = attnlab.scaled_dot_product_attention(
        q, k, v, mask, case.is_causal, case.scale, need_weights=need_weights)
    ref_output, ref_weights = reference.attention(**case.args())
    assert output.dtype == case.query.dtype
    assert_matches(output, ref_output, "output", case.query.dtype)
    if need_weights:
        assert_matches(weights, ref_weights.expand(weights.shape), "weights", case.query.dtype)
    else:
        assert weights is None

    grad_output = upstream_gradient(output, case.seed)
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    grads = torch.autograd.grad(output, inputs, grad_output)
    # A saturated softmax gives a key gradient near 0 made of cancelling terms as large as the
    # other gradients: its float32 error scales with those.
    refs = reference_gradients(case, grad_output)
    for name, grad, ref in zip(["query", "key", "value", "attn_mask"], grads, refs):
        assert_matches(grad, ref, f"gradient of {name}", gradient_precision(case, grad),
                       gradient=True, magnitude=largest(refs))


test_attention_matches_reference, test_attention_matches_reference_slow = \
    check_attention_values_weights_and_gradients


@property_tests(attention_cases(), examples=300)
def check_forward_operator_logsumexp(case):
    output, logsumexp, weights = torch.ops.attnlab._sdpa_forward(
        case.query, case.key, case.value, case.attn_mask, case.is_causal, case.scale, True)
    ref_output, ref_weights = reference.attention(**case.args())
    assert_matches(output, ref_output, "output", case.query.dtype)
    assert_matches(weights, ref_weights.expand(weights.shape), "weights", case.query.dtype)
    # Rows that see at least one key store log Σ exp(score); exp(score − lse) are the weights.
    scores = case.query.double() @ case.key.double().transpose(-2, -1)
    scores = scores * (case.scale if case.scale is not None else case.query.shape[-1] ** -0.5)
    if case.attn_mask is not None:
        scores = (scores.masked_fill(~case.attn_mask, -math.inf) if case.attn_mask.dtype == torch.bool
                  else scores + case.attn_mask.double())
    if case.is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, -math.inf)
    ref_lse = torch.logsumexp(scores, dim=-1).expand(logsumexp.shape)
    seen = ref_lse > -math.inf
    assert_matches(logsumexp[seen], ref_lse[seen], "logsumexp", case.query.dtype)


test_forward_operator_matches_reference, test_forward_operator_matches_reference_slow = \
    check_forward_operator_logsumexp


@property_tests(attention_cases(), examples=300)
def check_backward_operator_called_directly(case):
    output, logsumexp, weights = torch.ops.attnlab._sdpa_forward(
        case.query, case.key, case.value, case.attn_mask, case.is_causal, case.scale, False)
    grad_output = upstream_gradient(output, case.seed)
    grad_mask = case.attn_mask is not None and case.attn_mask.is_floating_point()
    grads = torch.ops.attnlab._sdpa_backward(
        grad_output, case.query, case.key, case.value, case.attn_mask, case.is_causal,
        case.scale, output, logsumexp, None, grad_mask)
    # A saturated softmax gives a key gradient near 0 made of cancelling terms as large as the
    # other gradients: its float32 error scales with those.
    refs = reference_gradients(case, grad_output)
    for name, grad, ref in zip(["query", "key", "value", "attn_mask"], grads, refs):
        assert_matches(grad, ref, f"gradient of {name}", gradient_precision(case, grad),
                       gradient=True, magnitude=largest(refs))
    if not grad_mask:
        assert grads[3].numel() == 0


test_backward_operator_matches_reference, test_backward_operator_matches_reference_slow = \
    check_backward_operator_called_directly


@st.composite
def additive_cases(draw):
    batch, len_q, len_k = draw(st.integers(1, 4)), draw(lengths()), draw(lengths())
    if batch * len_q * len_k > 4_000:  # the reference holds [B, Q, K, hidden] in float64
        batch, len_k = 1, min(len_k, 4_000 // len_q + 1)
    hidden = draw(st.one_of(st.sampled_from([1, 8, 16, 64]), st.integers(1, 70)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = torch.Generator().manual_seed(seed)
    magnitude = draw(st.sampled_from([0.1, 1.0, 5.0]))  # tanh near 0, mid-range, saturated

    def make(*shape):
        t = magnitude * torch.randn(*shape, generator=gen, dtype=dtype)
        return lay_out(t, draw(st.sampled_from(LAYOUTS[:5])), (batch,))

    inputs = make(batch, len_q, hidden), make(batch, len_k, hidden), \
        torch.randn(hidden, generator=gen, dtype=dtype)
    return inputs, seed


def reference_additive(query_proj, key_proj, weight):
    t = torch.tanh(query_proj.double()[:, :, None, :] + key_proj.double()[:, None, :, :])
    return (t * weight.double()).sum(-1)


@property_tests(additive_cases(), examples=500)
def check_additive_scores(case):
    inputs, seed = case
    leaves_ = [t.detach().requires_grad_() for t in inputs]
    scores = torch.ops.attnlab.additive_scores(*leaves_)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    ref_scores = reference_additive(*ref_leaves)
    assert_matches(scores, ref_scores, "scores", scores.dtype)
    assert_matches(torch.ops.attnlab._additive_scores_forward(*inputs), ref_scores,
                   "forward operator", scores.dtype)
    grad = upstream_gradient(scores, seed)
    ref_grads = torch.autograd.grad(ref_scores, ref_leaves, grad.double())
    names = ["query_proj", "key_proj", "weight"]
    for name, got, ref in zip(names, torch.autograd.grad(scores, leaves_, grad), ref_grads):
        assert_matches(got, ref, f"gradient of {name}", scores.dtype, gradient=True,
                       magnitude=largest(ref_grads))
    direct = torch.ops.attnlab._additive_scores_backward(grad, *inputs)
    for name, got, ref in zip(names, direct, ref_grads):
        assert_matches(got, ref, f"backward operator: gradient of {name}", scores.dtype,
                       gradient=True, magnitude=largest(ref_grads))


test_additive_scores_match_reference, test_additive_scores_match_reference_slow = \
    check_additive_scores


# ---- sparse normalizers (sparsemax, entmax-1.5, α-entmax) ------------------------------------

NORMALIZER_CHOICES = st.one_of(
    st.sampled_from([("sparsemax", None), ("entmax15", None), ("entmax", 2.5)]),
    st.floats(1.1, 1.9).map(lambda a: ("entmax", a)))


def near_threshold(case, alpha):
    """Whether a visible score lies within float32 rounding of its row's threshold, where
    sparsemax's gradient jumps (a float32 kernel may then find the other support)."""
    z = reference.scores(case.query, case.key, case.attn_mask, case.is_causal, case.scale)
    _, tau = reference.normalize(z, alpha)
    gap = ((alpha - 1) * z - tau).abs()
    finite = torch.isfinite(gap)
    if not finite.any():
        return False
    tolerance = 1e-4 * max(1.0, z[torch.isfinite(z)].abs().max().item())
    return bool((gap[finite] < tolerance).any())


@property_tests(st.tuples(attention_cases(), NORMALIZER_CHOICES), examples=300)
def check_sparse_attention(drawn):
    """Output, weights, tau and U against the float64 references; gradients of query, key,
    value and a float mask against autograd through them. Gradients are not compared for
    α > 2 (s = p^(2−α) is unbounded at the support's edge) nor, in float32, for sparsemax
    examples with a score within rounding of the threshold (its gradient jumps there)."""
    case, (normalizer, alpha) = drawn
    a = reference.alpha_of(normalizer, alpha)
    q, k, v, mask = leaves(case)
    need_weights = q.numel() % 2 == 0  # both backward paths: stored weights or recomputed
    output, weights = attnlab.scaled_dot_product_attention(
        q, k, v, mask, case.is_causal, case.scale, need_weights, normalizer, alpha)
    ref_output, ref_weights = reference.attention(**case.args(), normalizer=normalizer,
                                                  alpha=alpha)
    ref_tau = reference.threshold(case.query, case.key, case.attn_mask, case.is_causal,
                                  case.scale, normalizer, alpha)
    dtype = case.query.dtype
    assert output.dtype == dtype
    assert_matches(output, ref_output, "output", dtype)
    if need_weights:
        assert_matches(weights, ref_weights.expand(weights.shape), "weights", dtype)
        assert (weights >= 0).all()
    else:
        assert weights is None

    _, tau, support_value, _ = torch.ops.attnlab._sparse_sdpa_forward(
        case.query, case.key, case.value, case.attn_mask, case.is_causal, case.scale, False, a)
    ref_tau = ref_tau.expand(tau.shape)
    seen = torch.isfinite(ref_tau)
    assert torch.equal(torch.isinf(tau), ~seen)
    z_max = reference.scores(case.query, case.key, case.attn_mask, case.is_causal,
                             case.scale).amax(-1).expand(tau.shape)
    # tau sits at the scores' scale: compare relative to it.
    assert_matches(tau[seen], ref_tau[seen], "tau", dtype,
                   magnitude=(a - 1) * z_max[seen].abs().max().item() if seen.any() else None)
    assert support_value.shape == output.shape

    sparsemax_f32 = a == 2.0 and torch.float32 in (dtype, mask.dtype if mask is not None else dtype)
    if a > 2 or (sparsemax_f32 and near_threshold(case, a)):
        return
    grad_output = upstream_gradient(output, case.seed)
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    grads = torch.autograd.grad(output, inputs, grad_output)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    ref_mask = ref_leaves[3] if len(ref_leaves) > 3 else case.attn_mask
    ref_out, _ = reference.attention(
        *ref_leaves[:3], ref_mask, case.is_causal, case.scale, normalizer, alpha)
    refs = torch.autograd.grad(ref_out, ref_leaves, grad_output.double())
    for name, grad, ref in zip(["query", "key", "value"], grads, refs):
        assert_matches(grad, ref, f"gradient of {name}", gradient_precision(case, grad),
                       gradient=True, magnitude=largest(refs))
    if len(grads) > 3:
        assert_sparse_mask_gradient(grads[3], refs[3], ref_weights, a, case, grad_output,
                                    gradient_precision(case, grads[3]), largest(refs))


def assert_sparse_mask_gradient(grad, ref, weights, a, case, grad_output, precision, magnitude):
    """The mask's gradient sums dz = s·(dP − delta) over every score it is added to (s =
    p^(2−α) on the support). The kernels take delta_i = dO_i·U_i from the forward's U (the
    support's s-weighted mean of V), rounded to the inputs' precision: its rounding,
    about eps·Σ_c |dO_ic·U_ic|, does not cancel in that sum but adds up s times per score,
    the support's size per row for sparsemax. A broadcast mask over flat scores (a scale of 0)
    sums it over every query and key, so the bound grows with those sums."""
    if precision == torch.float64:
        assert_matches(grad, ref, "gradient of attn_mask", precision, gradient=True,
                       magnitude=magnitude)
        return
    s = torch.where(weights > 0, weights.clamp_min(1e-300) ** (2 - a), torch.zeros_like(weights))
    u = (s @ case.value.double()) / s.sum(-1, keepdim=True).clamp_min(1e-300)  # (broadcasts)
    rounding = (grad_output.double().abs() * u.abs()).sum(-1, keepdim=True)  # [..., L_q, 1]
    bound = (s * rounding).sum_to_size(ref.shape) * 4 * torch.finfo(torch.float32).eps
    error = (grad.double() - ref).abs()
    allowed = 2e-3 * ref.abs() + 2e-4 * max(1.0, magnitude) + bound
    assert bool((error <= allowed).all()), \
        f"gradient of attn_mask: error {error.max().item():.3g} beyond {allowed.min().item():.3g}"


test_sparse_attention_matches_reference, test_sparse_attention_matches_reference_slow = \
    check_sparse_attention
