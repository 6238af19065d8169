"""Numerical edge cases of the attention operator, each with its documented result (README,
"Reliability"): huge scores, every key masked, -inf in a float mask, NaN and inf in the inputs,
length 1 and empty batches."""

import math

import pytest
import torch

import attnlab
import reference

sdpa = attnlab.scaled_dot_product_attention
DTYPES = [torch.float32, torch.float64]


def inputs(*batch, len_q=6, len_k=7, dim=16, dim_v=5, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, length, width, generator=gen, dtype=dtype)
                 for length, width in ((len_q, dim), (len_k, dim), (len_k, dim_v)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_scores_of_magnitude_1e4_stay_finite_and_match_the_reference(dtype, sign):
    q, k, v = inputs(3, dtype=dtype)
    scale = sign * 1e4 / (q.double() @ k.double().transpose(-2, -1)).abs().max().item()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    output, weights = sdpa(q, k, v, scale=scale, need_weights=True)
    ref_output, ref_weights = reference.attention(q.detach(), k.detach(), v.detach(), scale=scale)
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 6, dtype=dtype))
    # float32 rounds scores of 1e4 to about 1e-3, which moves the weights by as much.
    tol = 1e-9 if dtype == torch.float64 else 5e-3
    torch.testing.assert_close(output.double(), ref_output, rtol=tol, atol=tol)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=tol, atol=tol)
    output.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["bool", "float -inf", "causal and bool"])
def test_all_keys_masked_gives_zero_output_weights_and_gradients(dtype, mask_kind):
    q, k, v = (t.requires_grad_() for t in inputs(2, dtype=dtype))
    blocked = torch.zeros(6, 7, dtype=torch.bool)
    mask = blocked if mask_kind != "float -inf" else torch.full((6, 7), -math.inf, dtype=dtype)
    output, weights = sdpa(q, k, v, mask, is_causal=mask_kind.startswith("causal"),
                           need_weights=True)
    assert torch.equal(output, torch.zeros_like(output))
    assert torch.equal(weights, torch.zeros_like(weights))
    output.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad, torch.zeros_like(t))


@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_inf_in_a_float_mask_equals_false_in_a_boolean_mask(dtype):
    q, k, v = inputs(2, dtype=dtype)
    allowed = torch.rand(6, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    allowed[2] = False  # and one query with every key masked
    additive = torch.zeros(6, 7, dtype=dtype).masked_fill(~allowed, -math.inf)
    from_bool = sdpa(q, k, v, allowed, need_weights=True)
    from_float = sdpa(q, k, v, additive, need_weights=True)
    for a, b in zip(from_bool, from_float):
        assert torch.equal(a, b)
    torch.testing.assert_close(from_bool[0].double(), reference.attention(q, k, v, allowed)[0])


def test_minus_inf_mask_hides_a_nan_score():
    # A key masked out by -inf (or False) is ignored even when its score is NaN: the rows that
    # cannot see it stay finite.
    q, k, v = inputs(1)
    k[0, 3] = math.nan
    additive = torch.zeros(6, 7)
    additive[:4, 3] = -math.inf
    output, _ = sdpa(q, k, v, additive)
    assert torch.isfinite(output[0, :4]).all() and output[0, 4:].isnan().all()


def nonfinite_pattern(t):
    return ~torch.isfinite(t)


NONFINITE_CASES = {
    # which input gets the value, at which [batch, position, feature]
    "NaN in a query": ("query", (1, 2, 0), math.nan),
    "NaN in a key": ("key", (0, 3, 5), math.nan),
    "NaN in a value": ("value", (1, 4, 2), math.nan),
    "inf in a query": ("query", (0, 1, 3), math.inf),
    "-inf in a key": ("key", (1, 0, 0), -math.inf),
    "inf in a value": ("value", (0, 6, 1), math.inf),
}


@pytest.mark.parametrize("mask_kind", ["none", "bool", "causal"])
@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_nan_and_inf_propagate_exactly_where_the_reference_puts_them(case, mask_kind):
    name, index, value = NONFINITE_CASES[case]
    q, k, v = inputs(3, dtype=torch.float64)
    mask = torch.rand(6, 7, generator=torch.Generator().manual_seed(2)) > 0.5 \
        if mask_kind == "bool" else None
    clean, _ = sdpa(q, k, v, attn_mask=mask, is_causal=mask_kind == "causal", need_weights=True)
    args = dict(query=q, key=k, value=v)
    args[name] = args[name].clone()
    args[name][index] = value
    output, weights = sdpa(**args, attn_mask=mask, is_causal=mask_kind == "causal",
                           need_weights=True)
    ref_output, ref_weights = reference.attention(**args, attn_mask=mask,
                                                  is_causal=mask_kind == "causal")
    # Never invented: non-finite only where the float64 reference is, never in another batch
    # entry; and propagated: wherever a NaN/inf query or key enters a score.
    ours, ref = nonfinite_pattern(output), nonfinite_pattern(ref_output)
    assert not (ours & ~ref).any()
    if name == "value":
        # Every query that gives the bad value row a positive weight carries it. One that gives
        # it weight 0 may (IEEE 0·NaN, as in the reference) when the kernel multiplies that row
        # in the same block, or may not when the causal mask skips the block.
        sees = ref_weights[index[0], :, index[1]] > 0
        assert ours[index[0], sees, index[2]].all()
    else:
        assert torch.equal(ours, ref)
    # The same rows of weights are non-finite; within them, keys the causal mask hides keep
    # weight 0 where the reference's softmax spreads NaN over the whole row.
    assert torch.equal(nonfinite_pattern(weights).any(-1), nonfinite_pattern(ref_weights).any(-1))
    assert not (nonfinite_pattern(weights) & ~nonfinite_pattern(ref_weights)).any()
    untouched = [b for b in range(3) if b != index[0]]
    assert torch.equal(output[untouched], clean[untouched])
    finite = torch.isfinite(ref_output)
    torch.testing.assert_close(output[finite], ref_output[finite], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_a_single_key_returns_its_value_exactly(dtype, batch):
    q, k, v = inputs(*batch, len_q=5, len_k=1, dtype=dtype)
    output, weights = sdpa(q, k, v, need_weights=True)
    assert torch.equal(weights, torch.ones(*batch, 5, 1, dtype=dtype))
    assert torch.equal(output, v.expand(*batch, 5, v.shape[-1]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_single_query_matches_the_reference(dtype):
    q, k, v = inputs(2, len_q=1, len_k=9, dtype=dtype)
    output, weights = sdpa(q, k, v, is_causal=True, need_weights=True)
    # Causal, top-left aligned: the only query sees key 0 alone.
    assert torch.equal(output, v[:, :1])
    torch.testing.assert_close(weights.double(), reference.attention(q, k, v, is_causal=True)[1])


@pytest.mark.parametrize("batch,len_q,len_k", [((0,), 6, 7), ((2, 0), 6, 7), ((2,), 0, 7),
                                               ((2,), 6, 0)])
def test_empty_inputs_give_empty_or_zero_results_and_gradients(batch, len_q, len_k):
    q, k, v = (t.requires_grad_() for t in inputs(*batch, len_q=len_q, len_k=len_k))
    output, weights = sdpa(q, k, v, need_weights=True)
    assert output.shape == (*batch, len_q, 5) and weights.shape == (*batch, len_q, len_k)
    # No keys at all is the same as every key masked: zeros.
    assert torch.equal(output, torch.zeros_like(output))
    output.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and torch.equal(t.grad, torch.zeros_like(t))
