"""The register-resident CPU path taken when every key fits one vector (L_k <= 16 in float32,
8 in float64): query counts that split into whole and partial groups of 16 rows (one per
lane), key counts below, at and above the key passes' splits (passes of eight keys, four for a
short last one; with AVX2, passes of six up to 12 keys, and two groups' scores at once above),
head sizes that are not multiples of the vector width, causal masks with
L_q != L_k and fully masked rows in each group, forward, weights and gradients against the
float64 reference. Head sizes 32 and 64 (equal for queries and values) run their own compiled
copies of the kernels, so they are checked next to sizes that take the general one."""

import pytest
import torch

import attnlab

import reference

LEN_Q = [1, 3, 4, 5, 8, 9, 10, 12, 13, 16, 17, 20, 33]
LEN_K = [1, 2, 4, 5, 8, 9, 10, 11, 12, 13, 15, 16]
DIMS = [(1, 1), (7, 16), (16, 17), (32, 32), (33, 48), (64, 64)]


def _inputs(len_q, len_k, dim, dim_v, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, len_q, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(2, len_k, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(2, len_k, dim_v, generator=gen, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def _check(q, k, v, mask=None, is_causal=False, need_weights=True, rtol=1e-5):
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           is_causal=is_causal,
                                                           need_weights=need_weights)
    grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(7),
                              dtype=output.dtype)
    grads = torch.autograd.grad(output, [q, k, v], grad_output)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_output, ref_weights = reference.attention(*refs, attn_mask=mask, is_causal=is_causal)
    ref_grads = torch.autograd.grad(ref_output, refs, grad_output.double())
    torch.testing.assert_close(output.double(), ref_output, rtol=rtol, atol=rtol)
    if need_weights:
        torch.testing.assert_close(weights.double(), ref_weights, rtol=rtol, atol=rtol / 10)
    magnitude = max(1.0, max(float(ref.abs().max()) for ref in ref_grads))
    for name, grad, ref in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(grad.double(), ref, rtol=10 * rtol, atol=rtol * magnitude,
                                   msg=name)


@pytest.mark.parametrize("len_k", LEN_K)
@pytest.mark.parametrize("len_q", LEN_Q)
def test_every_row_split_key_count_and_head_size_matches_the_reference(len_q, len_k):
    for dim, dim_v in DIMS:
        for is_causal in (False, True):
            for need_weights in (False, True):
                q, k, v = _inputs(len_q, len_k, dim, dim_v, seed=len_q * 100 + len_k + dim)
                _check(q, k, v, is_causal=is_causal, need_weights=need_weights)


@pytest.mark.parametrize("len_k", [3, 8])
@pytest.mark.parametrize("len_q", [1, 4, 8, 10, 16, 17])
def test_float64_small_path_matches_the_reference(len_q, len_k):
    for dim, dim_v in [(3, 5), (8, 8), (20, 9)]:
        for is_causal in (False, True):
            q, k, v = _inputs(len_q, len_k, dim, dim_v, seed=len_q + len_k, dtype=torch.float64)
            _check(q, k, v, is_causal=is_causal, rtol=1e-10)


@pytest.mark.parametrize("dim", [24, 32, 64])
@pytest.mark.parametrize("dead", [0, 3, 7, 8, 9, 15, 16])
def test_a_fully_masked_row_in_any_pass_gives_zeros_while_the_others_match(dead, dim):
    len_q, len_k = 17, 10
    q, k, v = _inputs(len_q, len_k, dim, dim, seed=dead)
    gen = torch.Generator().manual_seed(dead)
    mask = torch.randn(len_q, len_k, generator=gen, dtype=torch.float64).float()
    mask = mask.masked_fill(torch.rand(len_q, len_k, generator=gen) > 0.6, float("-inf"))
    mask[:, 0] = 0.0  # every other row keeps a key
    mask[dead] = float("-inf")
    _check(q, k, v, mask=mask)
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           need_weights=True)
    assert torch.equal(output[:, dead], torch.zeros_like(output[:, dead]))
    assert torch.equal(weights[:, dead], torch.zeros_like(weights[:, dead]))
    assert not torch.isnan(output).any()


def test_a_nan_score_in_a_fully_masked_row_still_makes_that_row_nan_only():
    # Row 9 sees one key, whose score is NaN (q row 9 is NaN): NaN output there, finite elsewhere.
    q, k, v = (t.detach() for t in _inputs(12, 6, 16, 16, seed=3))
    q[:, 9] = float("nan")
    mask = torch.zeros(12, 6)
    mask[9, 1:] = float("-inf")
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           need_weights=True)
    assert torch.isnan(output[:, 9]).all()
    assert torch.isnan(weights[:, 9, 0]).all()
    others = torch.cat([output[:, :9], output[:, 10:]], dim=1)
    assert torch.isfinite(others).all()


@pytest.mark.parametrize("dim", [24, 32, 64])
@pytest.mark.parametrize("from_weights", [False, True])
@pytest.mark.parametrize("len_q", [5, 16, 17, 33])
def test_mask_gradient_and_weights_gradient_in_every_group_match_the_reference(len_q,
                                                                              from_weights, dim):
    # The backward's dS (a learnable float mask's gradient) and dP = dO·Vᵀ (the gradient with
    # respect to the weights) come back to rows from the per-key vectors of each 16-row group.
    len_k = 11
    q, k, v = (t.detach() for t in _inputs(len_q, len_k, dim, dim, seed=len_q))
    gen = torch.Generator().manual_seed(len_q + 1)
    mask = torch.randn(len_q, len_k, generator=gen)
    mask[len_q // 2, 3:] = float("-inf")
    output, lse, weights = torch.ops.attnlab._sdpa_forward(q, k, v, mask, True, None, True)
    grad_output = torch.randn(output.shape, generator=gen)
    dq, dk, dv, dmask, dweights = torch.ops.attnlab._sdpa_backward(
        grad_output, q, k, v, mask, True, None, output, lse,
        weights if from_weights else None, True, True)
    refs = [t.double().requires_grad_() for t in (q, k, v, mask)]
    ref_output, _ = reference.attention(*refs[:3], attn_mask=refs[3], is_causal=True)
    ref_grads = torch.autograd.grad(ref_output, refs, grad_output.double())
    magnitude = max(float(ref.abs().max()) for ref in ref_grads)
    for name, grad, ref in zip(["q", "k", "v", "mask"], [dq, dk, dv, dmask], ref_grads):
        torch.testing.assert_close(grad.double(), ref, rtol=1e-4, atol=1e-5 * magnitude,
                                   msg=name)
    torch.testing.assert_close(dweights.double(),
                               grad_output.double() @ v.double().transpose(-2, -1),
                               rtol=1e-5, atol=1e-5)
