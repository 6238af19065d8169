"""Summaries of the attention weights computed inside the fused kernel (summary=), against the
same reductions of the float64 reference weights, for every normalizer."""

import math

import pytest
import torch

import attnlab
import reference
from attnlab import WeightSummary

sdpa = attnlab.scaled_dot_product_attention
NORMALIZERS = reference.NORMALIZERS
by_normalizer = pytest.mark.parametrize("normalizer,alpha", NORMALIZERS,
                                        ids=reference.ids(NORMALIZERS))
EVERY = WeightSummary(received=True, entropy=True, topk=3, pool=4, to=[0, 2, 5])


def _make(*shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=dtype)


def expected_summaries(weights, summary):
    """The same reductions of full weights [..., L_q, L_k], in plain torch ops."""
    w = weights.double()
    out = {}
    if summary.received:
        out["received"] = w.sum(-2)
    if summary.entropy:
        out["entropy"] = -(w * torch.where(w > 0, w, torch.ones_like(w)).log()).sum(-1)
    if summary.topk:
        out["topk_weights"] = w.topk(summary.topk, dim=-1).values
    if summary.pool:
        pool = summary.pool
        len_q, len_k = w.shape[-2:]
        bq, bk = math.ceil(len_q / pool), math.ceil(len_k / pool)
        padded = torch.nn.functional.pad(w, (0, bk * pool - len_k, 0, bq * pool - len_q))
        sums = padded.unflatten(-1, (bk, pool)).unflatten(-3, (bq, pool)).sum((-3, -1))
        rows = (len_q - torch.arange(bq) * pool).clamp(max=pool).double()
        cols = (len_k - torch.arange(bk) * pool).clamp(max=pool).double()
        out["pooled"] = sums / (rows[:, None] * cols[None, :])
    if summary.to:
        out["to"] = w[..., list(summary.to)]
    return out


def assert_summaries(result, weights, summary, dtype):
    expected = expected_summaries(weights, summary)
    for name, value in expected.items():
        reference.assert_close(getattr(result, name), value, name, dtype)
    for name in {"received", "entropy", "topk_weights", "pooled", "to"} - set(expected):
        assert getattr(result, name) is None, f"{name} was not asked for"
    if summary.topk:
        indices = result.topk_indices
        assert indices.dtype == torch.int64 and indices.shape == result.topk_weights.shape
        # The indices point at the weights reported (where the top-k is unambiguous: the gaps
        # to the neighbouring weights exceed float32 rounding).
        w = weights.double()
        torch.testing.assert_close(w.gather(-1, indices), result.topk_weights.double(),
                                   rtol=0, atol=1e-5)
        ranked = w.sort(-1, descending=True)
        k = summary.topk
        edge = torch.full_like(ranked.values[..., :1], math.inf)
        values = torch.cat([edge, ranked.values, -edge], -1)  # +inf, descending, -inf
        gaps = torch.minimum(values[..., :k] - values[..., 1:k + 1],
                             values[..., 1:k + 1] - values[..., 2:k + 2])
        clear = gaps > 1e-5
        assert torch.equal(indices[clear], ranked.indices[..., :summary.topk][clear])


CASES = [
    dict(shape=((2, 3), 9, 13, 8, 5), mask=None, is_causal=False),
    dict(shape=((2,), 11, 11, 8, 5), mask=None, is_causal=True),
    dict(shape=((2, 3), 9, 13, 8, 5), mask="bool", is_causal=False),
    dict(shape=((3,), 10, 7, 8, 6), mask="float", is_causal=True),
    # Over several of the blocked kernel's query and key blocks, L not a multiple of pool.
    dict(shape=((2,), 150, 301, 16, 8), mask="bool", is_causal=True),
    dict(shape=((1,), 70, 530, 32, 16), mask=None, is_causal=False),
    # Long enough rows for the top-k's groups of four vectors.
    dict(shape=((1,), 20, 1000, 16, 8), mask="bool", is_causal=False),
]


def _case(case, dtype=torch.float32):
    batch, len_q, len_k, dim, dim_v = case["shape"]
    q = _make(*batch, len_q, dim, seed=1, dtype=dtype)
    k = _make(*batch, len_k, dim, seed=2, dtype=dtype)
    v = _make(*batch, len_k, dim_v, seed=3, dtype=dtype)
    mask = None
    if case["mask"] == "bool":
        mask = torch.rand(len_q, len_k, generator=torch.Generator().manual_seed(4)) > 0.3
        mask[1] = False  # a fully masked row
    elif case["mask"] == "float":
        mask = _make(len_q, len_k, seed=5, dtype=dtype)
    return q, k, v, mask


@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: f"{c['shape'][1]}x{c['shape'][2]}-{c['mask']}-causal"
                                       f"{c['is_causal']}")
@by_normalizer
def test_every_summary_equals_the_reduction_of_the_full_weights(normalizer, alpha, case):
    q, k, v, mask = _case(case)
    output, result = sdpa(q, k, v, mask, case["is_causal"], normalizer=normalizer, alpha=alpha,
                          summary=EVERY)
    ref_output, ref_weights = reference.attention(q, k, v, mask, case["is_causal"],
                                                  normalizer=normalizer, alpha=alpha)
    reference.assert_close(output, ref_output, "output", torch.float32)
    assert_summaries(result, ref_weights, EVERY, torch.float32)


@pytest.mark.parametrize("case", [CASES[2], CASES[6]], ids=["short-rows", "long-rows"])
@by_normalizer
def test_float64_summaries_are_tight(normalizer, alpha, case):
    # (long rows: a sparse normalizer's summaries come from its support lists)
    q, k, v, mask = _case(case, torch.float64)
    _, result = sdpa(q, k, v, mask, normalizer=normalizer, alpha=alpha, summary=EVERY)
    _, ref_weights = reference.attention(q, k, v, mask, normalizer=normalizer, alpha=alpha)
    assert result.entropy.dtype == torch.float64
    assert_summaries(result, ref_weights, EVERY, torch.float64)


@pytest.mark.parametrize("summary", [
    WeightSummary(received=True), WeightSummary(entropy=True), WeightSummary(topk=1),
    WeightSummary(pool=5), WeightSummary(to=(3,)), WeightSummary(topk=13, pool=1)],
    ids=["received", "entropy", "top1", "pool5", "to", "all-keys"])
def test_each_summary_alone(summary):
    q, k, v, mask = _case(CASES[0])
    _, result = sdpa(q, k, v, mask, summary=summary)
    _, ref_weights = reference.attention(q, k, v, mask)
    assert_summaries(result, ref_weights, summary, torch.float32)


@by_normalizer
def test_a_fully_masked_row_has_zero_summaries(normalizer, alpha):
    q, k, v, _ = _case(CASES[0])
    mask = torch.ones(9, 13, dtype=torch.bool)
    mask[4] = False
    _, result = sdpa(q, k, v, mask, normalizer=normalizer, alpha=alpha, summary=EVERY)
    assert (result.entropy[..., 4] == 0).all()
    assert (result.topk_weights[..., 4, :] == 0).all()
    assert (result.topk_indices[..., 4, :] == torch.arange(3)).all()
    assert (result.to[..., 4, :] == 0).all()


@by_normalizer
def test_tied_zeros_in_the_top_k_go_to_the_lower_keys(normalizer, alpha):
    # Long rows (a sparse normalizer's support lists) with large scores: most supports are
    # shorter than k, so the top-k ends in zeros, which must sit at the lowest keys outside the
    # support, as in a dense row's (stable) descending sort. A repeated key in `to` is reported
    # at each of its places; a fully masked row is all zeros at keys 0 .. k-1.
    q, k, v = _make(2, 20, 16, seed=9, scale=3.0), _make(2, 300, 16, seed=10), _make(2, 300, 4,
                                                                                     seed=11)
    mask = torch.ones(20, 300, dtype=torch.bool)
    mask[7] = False
    mask[3, :150] = False
    summary = WeightSummary(topk=8, to=[5, 0, 5])
    _, result = sdpa(q, k, v, mask, normalizer=normalizer, alpha=alpha, summary=summary)
    _, ref_weights = reference.attention(q, k, v, mask, normalizer=normalizer, alpha=alpha)
    assert_summaries(result, ref_weights, summary, torch.float32)
    stable = ref_weights.sort(dim=-1, descending=True, stable=True).indices[..., :8]
    zeros = result.topk_weights == 0
    assert torch.equal(result.topk_indices[zeros], stable[zeros])
    assert (result.topk_indices[:, 7] == torch.arange(8)).all()
    assert torch.equal(result.to[..., 0], result.to[..., 2])
    if normalizer != "softmax":
        assert zeros.any(), "no row with a support shorter than k: the case is not exercised"


def test_the_output_keeps_its_gradient_and_the_summaries_have_none():
    q, k, v, mask = _case(CASES[2])
    q.requires_grad_()
    output, result = sdpa(q, k, v, mask, summary=EVERY)
    plain, _ = sdpa(q, k, v, mask)
    torch.testing.assert_close(output, plain, rtol=0, atol=0)
    grad = torch.autograd.grad(output.sum(), q)[0]
    assert torch.equal(grad, torch.autograd.grad(plain.sum(), q)[0])
    assert not any(t.requires_grad for t in (result.received, result.entropy, result.pooled))


def test_grouped_query_heads():
    q = _make(2, 4, 9, 8, seed=6)
    k, v = _make(2, 2, 13, 8, seed=7), _make(2, 2, 13, 5, seed=8)
    output, result = sdpa(q, k, v, enable_gqa=True, summary=EVERY)
    ref_output, ref_weights = reference.attention(q, k.repeat_interleave(2, -3),
                                                  v.repeat_interleave(2, -3))
    reference.assert_close(output, ref_output, "output", torch.float32)
    assert_summaries(result, ref_weights, EVERY, torch.float32)
    assert result.received.shape == (2, 4, 13) and result.pooled.shape == (2, 4, 3, 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_summaries_are_float32(dtype):
    q, k, v, mask = _case(CASES[4])
    q, k, v = (t.to(dtype) for t in (q, k, v))
    output, result = sdpa(q, k, v, mask, True, summary=EVERY)
    assert output.dtype == dtype and result.entropy.dtype == torch.float32
    # The summaries of the rounded inputs, as float32 computes them.
    _, ref_weights = reference.attention(q, k, v, mask, True)
    assert_summaries(result, ref_weights, EVERY, torch.float32)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(topk=0), ValueError, "topk must be a positive int"),
    (dict(topk=-2), ValueError, "topk must be a positive int"),
    (dict(topk=2.5), TypeError, "topk must be a positive int"),
    (dict(pool=0), ValueError, "pool must be a positive int"),
    (dict(to=[]), TypeError, "to must be a non-empty sequence"),
    (dict(to=[1.0]), TypeError, "to must be a non-empty sequence"),
    (dict(received=1), TypeError, "received must be a bool"),
    (dict(), ValueError, "at least one summary"),
])
def test_bad_summaries_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        WeightSummary(**kwargs)


@pytest.mark.parametrize("summary,match", [
    (WeightSummary(topk=14), "topk must be at most the number of keys L_k = 13"),
    (WeightSummary(to=[13]), "to holds key 13, outside"),
    (WeightSummary(to=[-1]), "to holds key -1, outside"),
])
def test_summaries_that_do_not_fit_the_keys_are_refused(summary, match):
    q, k, v, _ = _case(CASES[0])
    with pytest.raises(RuntimeError, match=match):
        sdpa(q, k, v, summary=summary)


def test_summary_with_need_weights_or_of_the_wrong_kind_is_refused():
    q, k, v, _ = _case(CASES[0])
    with pytest.raises(ValueError, match="summary= replaces the weights"):
        sdpa(q, k, v, need_weights=True, summary=EVERY)
    with pytest.raises(TypeError, match="summary must be an attnlab.WeightSummary"):
        sdpa(q, k, v, summary={"entropy": True})


def test_summaries_off_the_cpu_raise_not_implemented():
    q, k, v = (torch.empty(2, 9, 8, device="meta") for _ in range(3))
    with pytest.raises(NotImplementedError, match="CPU kernels only"):
        sdpa(q, k, v, summary=EVERY)
