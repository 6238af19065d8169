"""Autograd, operator registration and torch.compile for the attention operator."""

import pytest
import torch

import attnlab


def _inputs(batch, len_q, len_k, dim, dim_v, dtype=torch.float64, requires_grad=True):
    gen = torch.Generator().manual_seed(len_q * 100 + len_k)
    make = lambda *s: torch.randn(*s, generator=gen, dtype=dtype, requires_grad=requires_grad)  # noqa: E731
    return make(*batch, len_q, dim), make(*batch, len_k, dim), make(*batch, len_k, dim_v)


GRADCHECK_CASES = [
    dict(batch=(2,), len_q=3, len_k=4, dim=5, dim_v=2, mask=None, is_causal=False),
    dict(batch=(), len_q=1, len_k=1, dim=1, dim_v=1, mask=None, is_causal=False),
    dict(batch=(2, 2), len_q=5, len_k=5, dim=3, dim_v=4, mask=None, is_causal=True),
    dict(batch=(2,), len_q=4, len_k=6, dim=3, dim_v=3, mask="bool", is_causal=False),
    dict(batch=(1, 2), len_q=3, len_k=5, dim=2, dim_v=3, mask="float", is_causal=True),
]


@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=lambda c: f"{c['mask']}-causal{c['is_causal']}-L{c['len_q']}x{c['len_k']}")
def test_gradcheck_float64(case):
    q, k, v = _inputs(case["batch"], case["len_q"], case["len_k"], case["dim"], case["dim_v"])
    mask = None
    if case["mask"] == "bool":
        mask = torch.rand(case["len_q"], case["len_k"]) > 0.4
        mask[0] = False  # a fully masked row
    elif case["mask"] == "float":
        mask = torch.randn(case["len_k"], dtype=torch.float64)

    def fn(q, k, v):
        return attnlab.scaled_dot_product_attention(q, k, v, mask, case["is_causal"])[0]

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_broadcast_key_and_value():
    q = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 1, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnlab.scaled_dot_product_attention(q, k, v)[0], (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck_with_stored_weights(is_causal):
    q, k, v = _inputs((2,), 4, 6, 3, 2)
    mask = torch.rand(4, 6) > 0.3
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnlab.scaled_dot_product_attention(q, k, v, mask, is_causal,
                                                             need_weights=True)[0], (q, k, v))


@pytest.mark.parametrize("mask_shape", [(2, 4, 6), (4, 6), (6,), (2, 1, 6)])
@pytest.mark.parametrize("is_causal,need_weights", [(False, False), (True, False), (False, True)])
def test_gradcheck_through_a_float_mask(mask_shape, is_causal, need_weights):
    # A learnable additive mask (a relative-position bias, say) gets the scores' gradient,
    # summed over the dimensions it broadcasts along.
    q, k, v = _inputs((2,), 4, 6, 3, 2)
    mask = torch.randn(*mask_shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: attnlab.scaled_dot_product_attention(
            q, k, v, m, is_causal, need_weights=need_weights)[0], (q, k, v, mask))


def test_weights_are_not_differentiable_but_output_is():
    q, k, v = _inputs((2,), 3, 4, 5, 2, dtype=torch.float32)
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
    assert output.requires_grad and not weights.requires_grad


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_input_requires_grad"])
def test_calls_autograd_does_not_record_give_the_recorded_results(mode):
    # Such calls skip the autograd function and run the forward operator alone.
    q, k, v = _inputs((2, 3), 5, 7, 4, 6, dtype=torch.float32)
    mask = torch.randn(5, 7, requires_grad=True)
    recorded = attnlab.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert recorded[0].grad_fn is not None
    if mode == "no_input_requires_grad":
        args = [t.detach() for t in (q, k, v, mask)]
        context = torch.enable_grad()
    else:
        args = [q, k, v, mask]
        context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with context:
        output, weights = attnlab.scaled_dot_product_attention(*args, need_weights=True)
        output_only, no_weights = attnlab.scaled_dot_product_attention(*args)
    for t in (output, weights, output_only):
        assert t.grad_fn is None and not t.requires_grad
    assert no_weights is None
    torch.testing.assert_close(output, recorded[0], rtol=0, atol=0)
    torch.testing.assert_close(weights, recorded[1], rtol=0, atol=0)
    torch.testing.assert_close(output_only, recorded[0], rtol=0, atol=0)


@pytest.mark.parametrize("grad_mode", [True, False])
def test_forward_mode_tangents_are_refused_with_or_without_grad_mode(grad_mode):
    import torch.autograd.forward_ad as fwAD
    q, k, v = _inputs((2,), 3, 4, 5, 2, requires_grad=False)
    with fwAD.dual_level(), torch.set_grad_enabled(grad_mode):
        dual_q = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            attnlab.scaled_dot_product_attention(dual_q, k, v)


OPCHECK_CASES = [
    dict(mask=None, is_causal=False, need_weights=False),
    dict(mask="bool", is_causal=False, need_weights=True),
    dict(mask="float", is_causal=True, need_weights=False),
]


def _opcheck_args(case, requires_grad):
    q, k, v = _inputs((2, 3), 5, 7, 4, 6, dtype=torch.float32, requires_grad=requires_grad)
    mask = {None: None, "bool": torch.rand(5, 7) > 0.3,
            "float": torch.randn(1, 5, 7, requires_grad=requires_grad)}[case["mask"]]
    return (q, k, v, mask, case["is_causal"], None, case["need_weights"])


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=str)
def test_opcheck_public_operator(case):
    torch.library.opcheck(torch.ops.attnlab.scaled_dot_product_attention.default,
                          _opcheck_args(case, requires_grad=True))


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=str)
def test_opcheck_forward_and_backward_operators(case):
    args = _opcheck_args(case, requires_grad=False)
    torch.library.opcheck(torch.ops.attnlab._sdpa_forward.default, args)
    output, lse, weights = torch.ops.attnlab._sdpa_forward(*args)
    backward_args = (torch.randn_like(output), *args[:6], output, lse)
    torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default, backward_args)
    if case["mask"] == "float":
        torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default,
                              (*backward_args, None, True))
    if case["need_weights"]:
        torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default, (*backward_args, weights))
    # grad_weights: dP = grad_output·valueᵀ as a fifth result (attnlab.interpret's recorder).
    torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default,
                          (*backward_args, weights if case["need_weights"] else None,
                           case["mask"] == "float", True))


@pytest.mark.long  # inductor compiles: about 20 s on 2 cores with its cache empty (as in CI)
def test_torch_compile_fullgraph_matches_eager():
    def block(x, w_qkv, mask):
        q, k, v = (x @ w_qkv).chunk(3, dim=-1)
        out, weights = attnlab.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                            need_weights=True)
        return torch.relu(out).sum(-1), weights

    x = torch.randn(4, 9, 8, requires_grad=True)
    w = torch.randn(8, 24, requires_grad=True)
    mask = torch.rand(9, 9) > 0.2
    compiled = torch.compile(block, fullgraph=True)
    eager_out, eager_weights = block(x, w, mask)
    out, weights = compiled(x, w, mask)
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(weights, eager_weights)
    eager_grads = torch.autograd.grad(eager_out.sum(), (x, w))
    grads = torch.autograd.grad(out.sum(), (x, w))
    for got, expected in zip(grads, eager_grads):
        torch.testing.assert_close(got, expected)
