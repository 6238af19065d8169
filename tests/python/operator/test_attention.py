"""attnlab.scaled_dot_product_attention against the float64 reference on random cases."""

import math
import random

import pytest
import torch

import attnlab
import reference

RANDOM_CASES = 240


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


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_case_matches_reference(seed):
    case = random_case(seed)
    output, weights = attnlab.scaled_dot_product_attention(**case, need_weights=True)
    output_only, none = attnlab.scaled_dot_product_attention(**case)
    ref_output, ref_weights = reference.attention(**case)
    assert none is None
    assert output.dtype == torch.float32 and output.shape == ref_output.shape
    # Weights come at the output's batch shape (value's batch dimensions broadcast in too).
    assert weights.shape == (*output.shape[:-1], case["key"].shape[-2])
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output_only.double(), ref_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.double(), ref_weights.expand(weights.shape),
                               rtol=1e-5, atol=1e-6)
    assert not torch.isnan(output).any()


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("seed", range(0, RANDOM_CASES, 4))
def test_random_case_gradients_match_reference(seed, need_weights):
    # With need_weights the backward reads the stored weights instead of recomputing them.
    case = random_case(seed)
    inputs = {name: case[name].detach().requires_grad_() for name in ("query", "key", "value")}
    output, _ = attnlab.scaled_dot_product_attention(**{**case, **inputs},
                                                     need_weights=need_weights)
    # Seeded: the same upstream gradient whatever ran before (a re-run sees the same case).
    grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(output, list(inputs.values()), grad_output)

    ref_inputs = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    ref_output, _ = reference.attention(**{**case, **ref_inputs})
    ref_grads = torch.autograd.grad(ref_output, list(ref_inputs.values()), grad_output.double())
    # A gradient that is exactly 0 in the reference (one key: the softmax is constant) is a
    # difference of terms as large as the others in float32: its error is relative to them.
    magnitude = max(1.0, max(float(ref.abs().max()) for ref in ref_grads if ref.numel()))
    for name, grad, ref in zip(inputs, grads, ref_grads):
        assert grad.shape == inputs[name].shape, name
        torch.testing.assert_close(grad.double(), ref, rtol=1e-4, atol=1e-5 * magnitude,
                                   msg=name)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("len_q,len_k", [(700, 1100), (300, 129), (1, 600)])
def test_long_sequences_cross_block_boundaries(len_q, len_k, is_causal):
    gen = torch.Generator().manual_seed(len_q + len_k)
    q = torch.randn(2, len_q, 24, generator=gen)
    k = torch.randn(1, len_k, 24, generator=gen)
    v = torch.randn(2, len_k, 10, generator=gen, requires_grad=True)
    mask = torch.rand(len_k, generator=gen) > 0.1  # a key-padding style mask
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, is_causal,
                                                           need_weights=True)
    ref_output, ref_weights = reference.attention(q, k, v, mask, is_causal)
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)
    (grad_v,) = torch.autograd.grad(output.sum(), v)
    v_ref = v.detach().double().requires_grad_()
    (ref_grad_v,) = torch.autograd.grad(reference.attention(q, k, v_ref, mask, is_causal)[0].sum(), v_ref)
    torch.testing.assert_close(grad_v.double(), ref_grad_v, rtol=1e-4, atol=1e-5)


def assert_output_and_gradients_match_reference(q, k, v, mask, is_causal, gen):
    """attnlab's float32 output and its gradients (for a random output gradient drawn from gen)
    against the float64 reference: output within 1e-5, gradients within 1e-4 relative."""
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


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    q = torch.randn(2, 4, 8, requires_grad=True)
    k = torch.randn(2, 5, 8, requires_grad=True)
    v = torch.randn(2, 5, 3, requires_grad=True)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = False
    mask[1] = False
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert torch.equal(output[0, 1], torch.zeros(3)) and torch.equal(output[1], torch.zeros(4, 3))
    assert torch.equal(weights[0, 1], torch.zeros(5)) and torch.equal(weights[1], torch.zeros(4, 5))
    output.sum().backward()
    assert torch.equal(q.grad[1], torch.zeros(4, 8)) and torch.equal(q.grad[0, 1], torch.zeros(8))
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_matches_torch_sdpa_without_mask():
    q, k, v = torch.randn(3, 2, 17, 16), torch.randn(3, 2, 23, 16), torch.randn(3, 2, 23, 16)
    for is_causal in (False, True):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        output, _ = attnlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)


def test_reachable_through_torch_ops():
    q = torch.randn(2, 3, 4)
    output, weights = torch.ops.attnlab.scaled_dot_product_attention(q, q, q, need_weights=True)
    ref_output, ref_weights = reference.attention(q, q, q)
    torch.testing.assert_close(output.double(), ref_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)


def test_float64_matches_reference_tightly():
    q, k, v = (torch.randn(2, 9, 5, dtype=torch.float64) for _ in range(3))
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                           need_weights=True)
    ref_output, ref_weights = reference.attention(q, k, v, is_causal=True)
    assert output.dtype == torch.float64
    torch.testing.assert_close(output, ref_output, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)


def test_empty_batch_and_single_position():
    output, weights = attnlab.scaled_dot_product_attention(
        torch.randn(0, 3, 4), torch.randn(0, 5, 4), torch.randn(0, 5, 2), need_weights=True)
    assert output.shape == (0, 3, 2) and weights.shape == (0, 3, 5)
    v = torch.randn(1, 6)
    output, weights = attnlab.scaled_dot_product_attention(torch.randn(1, 1), torch.randn(1, 1), v,
                                                           need_weights=True)
    torch.testing.assert_close(output, v)
    assert weights.item() == 1.0


def test_default_scale_is_inverse_sqrt_of_features():
    q, k, v = torch.randn(5, 12), torch.randn(7, 12), torch.randn(7, 3)
    a, _ = attnlab.scaled_dot_product_attention(q, k, v)
    b, _ = attnlab.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(12))
    c, _ = attnlab.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)
