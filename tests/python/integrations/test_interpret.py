"""attnlab.interpret: the operator's gradient of the weights (dP), the recorder, rollout,
attention flow and gradient-weighted relevance, each against float64 references written here."""

import copy
import importlib.util
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import functional
from attnlab.interpret import (attention_flow, explain, gradient_relevance, record,
                               rollout)
from attnlab.models import TransformerPredictor

# attention_flow needs networkx (CI installs it); only its tests skip without it.
needs_networkx = pytest.mark.skipif(importlib.util.find_spec("networkx") is None,
                                    reason="attention_flow needs networkx, not installed")


def close(actual, expected, rtol=1e-5):
    """actual within rtol of expected, relative to expected's largest entry."""
    expected = expected.double()
    scale = max(expected.abs().max().item(), 1e-30)
    error = (actual.double() - expected).abs().max().item()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert error <= rtol * scale, f"max error {error:.3g} > {rtol:g} × {scale:.3g}"


# ---------------------------------------------------------------- the operator's dP ----------


def _backward(q, k, v, mask, is_causal, grad_output, keep_weights, grad_mask=False):
    output, lse, weights = torch.ops.attnlab._sdpa_forward(q, k, v, mask, is_causal, None,
                                                           keep_weights)
    grad_output = grad_output(output)
    with_dp = torch.ops.attnlab._sdpa_backward(grad_output, q, k, v, mask, is_causal, None,
                                               output, lse, weights if keep_weights else None,
                                               grad_mask, True)
    without = torch.ops.attnlab._sdpa_backward(grad_output, q, k, v, mask, is_causal, None,
                                               output, lse, weights if keep_weights else None,
                                               grad_mask, False)
    return grad_output, with_dp, without


OPERATOR_CASES = {
    # name: (batch of q, k, v, L_q, L_k, mask kind, causal); lengths cross the backward's
    # 64-query and 128-key blocks so that the causal mask skips whole blocks.
    "plain": ((2, 3), (2, 3), (2, 3), 5, 7, None, False),
    "bool mask, fully masked rows": ((2, 2), (2, 2), (2, 2), 9, 11, "bool", False),
    "float mask": ((2,), (2,), (2,), 6, 6, "float", False),
    "causal, skipped blocks": ((2,), (2,), (2,), 150, 300, None, True),
    "causal, more queries than keys": ((1,), (1,), (1,), 300, 150, "bool", True),
    "broadcast batch": ((2, 3), (1, 3), (2, 1), 8, 5, "bool", False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("keep_weights", [False, True], ids=["recomputed", "stored weights"])
@pytest.mark.parametrize("case", OPERATOR_CASES, ids=str)
def test_grad_weights_is_grad_output_times_value_transposed(case, keep_weights, dtype):
    bq, bk, bv, len_q, len_k, mask_kind, causal = OPERATOR_CASES[case]
    gen = torch.Generator().manual_seed(len_q * 1000 + len_k)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    # Non-contiguous inputs: heads transposed out of [B, L, H, E], a sliced value.
    if len(bq) == 2:
        q = randn(bq[0], len_q, bq[1], 4).transpose(-3, -2)
    else:
        q = randn(*bq, len_q, 4)
    k = randn(*bk, len_k, 4)
    v = randn(*bv, len_k, 6)[..., ::2]
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(len_q, len_k, generator=gen) > 0.3
        mask[1] = False  # a query that sees no key: zero weights, dP still dO·Vᵀ
    elif mask_kind == "float":
        mask = randn(len_q, len_k)
    # A non-contiguous upstream gradient.
    def grad_output(out):
        return randn(*out.shape[:-2], out.shape[-1], out.shape[-2]).transpose(-2, -1)

    dout, with_dp, without = _backward(q, k, v, mask, causal, grad_output, keep_weights)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    expected = (dout.double() @ v.double().transpose(-2, -1)).expand(*batch, len_q, len_k)
    assert with_dp[4].dtype == dtype and with_dp[4].is_contiguous()
    close(with_dp[4], expected, rtol=1e-5 if dtype == torch.float32 else 1e-12)
    # The other gradients are those of the call without grad_weights, bitwise.
    for a, b in zip(with_dp[:4], without[:4]):
        assert torch.equal(a, b)
    assert without[4].numel() == 0


def test_grad_weights_with_a_mask_gradient_and_empty_problems():
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 2)
    mask = torch.randn(4, 5)
    dout, with_dp, without = _backward(q, k, v, mask, False, torch.randn_like, False,
                                       grad_mask=True)
    close(with_dp[4], dout.double() @ v.double().mT)
    assert torch.equal(with_dp[3], without[3]) and with_dp[3].shape == (4, 5)
    for shape_q, shape_k in (((0, 4, 3), (0, 5, 3)), ((2, 0, 3), (2, 5, 3)),
                             ((2, 4, 3), (2, 0, 3))):
        q, k = torch.randn(shape_q), torch.randn(shape_k)
        v = torch.randn(*shape_k[:-1], 2)
        _, with_dp, _ = _backward(q, k, v, None, True, torch.randn_like, False)
        assert with_dp[4].shape == (shape_q[0], shape_q[1], shape_k[1])


@pytest.mark.parametrize("mask_kind,is_causal,keep_weights",
                         [(None, False, False), ("bool", True, True), ("float", False, False)])
def test_opcheck_backward_with_grad_weights(mask_kind, is_causal, keep_weights):
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(1, 3, 7, 6)
    mask = {None: None, "bool": torch.rand(5, 7) > 0.3, "float": torch.randn(1, 5, 7)}[mask_kind]
    output, lse, weights = torch.ops.attnlab._sdpa_forward(q, k, v, mask, is_causal, None,
                                                           keep_weights)
    args = (torch.randn_like(output), q, k, v, mask, is_causal, None, output, lse,
            weights if keep_weights else None, mask_kind == "float", True)
    torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default, args)


# ---------------------------------------------------------------- the recorder ---------------


def test_gradcheck_through_the_recorder():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, n, 3, generator=gen, dtype=torch.float64, requires_grad=True)
               for n in (4, 5, 5))
    mask = torch.randn(4, 5, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, mask):
        with record():
            return functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           is_causal=True)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v, mask))


def _reference_mha(module, x, mask=None):
    """attnlab.nn.MultiheadAttention in float64 plain ops; returns (output, A) with A's
    gradient retained."""
    B, L, _ = x.shape
    H, hd = module.num_heads, module.head_dim
    W, b = module.qkv_proj.weight.double(), module.qkv_proj.bias.double()
    qkv = (x @ W.T + b).reshape(B, L, H, 3, hd)
    q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    A = torch.softmax(scores, dim=-1)
    A.retain_grad()
    values = (A @ v).transpose(1, 2).reshape(B, L, H * hd)
    return values @ module.o_proj.weight.double().T + module.o_proj.bias.double(), A


def _reference_block(block, x, mask=None):
    """attnlab.nn.EncoderBlock (no dropout) in float64 plain ops; returns (y, A)."""
    def ln(t, norm):
        mean = t.mean(-1, keepdim=True)
        var = ((t - mean) ** 2).mean(-1, keepdim=True)
        return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()

    def ff(t):
        l1, l2 = block.linear_net[0], block.linear_net[3]
        hidden = torch.relu(t @ l1.weight.double().T + l1.bias.double())
        return hidden @ l2.weight.double().T + l2.bias.double()

    if block.norm_first:
        attn, A = _reference_mha(block.self_attn, ln(x, block.norm1), mask)
        h = x + attn
        return h + ff(ln(h, block.norm2)), A
    attn, A = _reference_mha(block.self_attn, x, mask)
    h = ln(x + attn, block.norm1)
    return ln(h + ff(h), block.norm2), A


def test_recorder_on_multihead_attention_matches_explicit_float64_model():
    torch.manual_seed(0)
    layer = attnlab.nn.MultiheadAttention(input_dim=6, embed_dim=8, num_heads=2)
    x = torch.randn(3, 7, 6)
    mask = torch.rand(3, 7, 7) > 0.3
    mask[..., 0] = True
    r = torch.randn(3, 7, 8)
    _, maps = layer(x, mask, return_attention=True)
    with record() as rec:
        out = layer(x, mask)
    (out * r).sum().backward()
    ref_out, A = _reference_mha(layer, x.double(), mask[:, None])
    (ref_out * r.double()).sum().backward()
    assert len(rec) == 1 and rec.weights[0].shape == (3, 2, 7, 7)
    assert torch.equal(rec.weights[0], maps)
    close(out, ref_out)
    close(rec.weights[0], A)
    close(rec.grads[0], A.grad)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_recorder_on_an_encoder_takes_the_module_path_and_matches_float64(norm_first):
    torch.manual_seed(1)
    encoder = attnlab.nn.TransformerEncoder(num_layers=2, input_dim=8, num_heads=2,
                                            dim_feedforward=12, norm_first=norm_first).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    r = torch.randn(2, 5, 8)
    assert encoder.layers[0]._fusable(x, mask)  # the fused operator, outside a recording
    fused = encoder(x, mask)
    (fused * r).sum().backward()
    fused_grads = [p.grad.clone() for p in encoder.parameters()] + [x.grad.clone()]
    encoder.zero_grad()
    x.grad = None
    with record() as rec:
        assert not encoder.layers[0]._fusable(x, mask)
        out = encoder(x, mask)
    (out * r).sum().backward()
    # Two recorded calls: the fused operator, which hides its attention, was not used.
    assert len(rec) == 2
    close(out, fused)
    for a, b in zip([p.grad for p in encoder.parameters()] + [x.grad], fused_grads):
        close(a, b, rtol=2e-5)
    expected = encoder.get_attention_maps(x.detach(), mask)
    h = x.detach().double()
    references = []
    for block in encoder.layers:
        h, A = _reference_block(block, h, mask)
        references.append(A)
    (h * r.double()).sum().backward()
    for recorded, maps, A in zip(rec.weights, expected, references):
        close(recorded, A)
        close(maps, A)
    for recorded, A in zip(rec.grads, references):
        close(recorded, A.grad)


def test_recorder_keeps_other_modules_results_and_a_learnable_mask_gradient():
    torch.manual_seed(2)
    cross = attnlab.nn.MultiHeadAttention(d_model=8, num_heads=2)
    xq, xk = torch.randn(2, 3, 8), torch.randn(2, 6, 8)
    additive = attnlab.nn.AdditiveAttention(5, 4, 6)
    features, queries = torch.randn(2, 6, 5), torch.randn(2, 3, 4)
    params = list(cross.parameters()) + list(additive.parameters())

    def run():
        h, maps = cross(xq, xk, xk)
        out = additive.attend(features, queries)
        return (h, out), (maps, additive.last_weights)

    expected, expected_maps = run()
    grads = torch.autograd.grad(sum(t.sum() for t in expected), params)
    with record() as rec:
        got, maps = run()
    grads_recorded = torch.autograd.grad(sum(t.sum() for t in got), params)
    for a, b in zip(got, expected):
        close(a, b)
    for a, b in zip(rec.weights, expected_maps):
        assert torch.equal(a, b)
    for a, b in zip(grads_recorded, grads):
        close(a, b)
    assert [tuple(w.shape) for w in rec.weights] == [(2, 2, 3, 6), (2, 3, 6)]
    # ∂loss/∂A = dO·Vᵀ. Cross attention: the loss sums W_h's outputs, so dO[b, h, q, d] is
    # the sum of W_h's column h·d_k + d. Additive attention: dO = 1, each row of V summed.
    v_cross = (xk.double() @ cross.W_v.weight.double().T).reshape(2, 6, 2, 4).transpose(1, 2)
    d_out = cross.W_h.weight.double().sum(0).reshape(2, 4)
    close(rec.grads[0], torch.einsum("hd,bhjd->bhj", d_out, v_cross)[:, :, None, :]
          .expand(2, 2, 3, 6))
    close(rec.grads[1], features.double().sum(-1)[:, None, :].expand(2, 3, 6))


def test_recorder_bookkeeping():
    q = torch.randn(2, 3, 4, requires_grad=True)
    sdpa = functional.scaled_dot_product_attention
    assert not functional.has_attention_hooks()
    with record() as outer:
        out1, w = sdpa(q, q, q)
        assert w is None and functional.has_attention_hooks()
        with pytest.raises(RuntimeError, match=r"no gradient recorded yet"):
            outer.grads
        with record() as inner:
            out2, _ = sdpa(q, q, q, is_causal=True, need_weights=True)
        unused, _ = sdpa(q, q, q)
        with pytest.raises(RuntimeError, match=r"already active"):
            outer.__enter__()
    assert not functional.has_attention_hooks()
    sdpa(q, q, q)  # not recorded
    assert len(outer) == 2 and len(inner) == 1
    (out1.sum() + out2.sum()).backward(retain_graph=True)  # after the blocks
    expected = torch.ones(2, 3, 3)  # dO = 1, V = q: dP[b, i, j] = Σ_c q[b, j, c]
    close(outer.grads[0], expected * q.detach().double().sum(-1)[:, None, :])
    assert torch.equal(outer.grads[1], torch.zeros(2, 3, 3))  # its output reached no loss
    close(inner.grads[0], expected * q.detach().double().sum(-1)[:, None, :])
    out1.sum().backward()  # a second backward adds up, as .grad does
    close(outer.grads[0], 2 * expected * q.detach().double().sum(-1)[:, None, :])
    outer.clear()
    assert len(outer) == 0
    with pytest.raises(RuntimeError, match=r"no attention call was recorded"):
        outer.grads


def test_attention_hook_sees_every_call_and_leaves_results_unchanged():
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    sdpa = functional.scaled_dot_product_attention
    expected_out, _ = sdpa(q, k, v, is_causal=True)
    calls = []
    with pytest.raises(TypeError, match=r"hook must be callable"):
        functional.register_attention_hook(3)
    with functional.register_attention_hook(calls.append):
        out, w = sdpa(q, k, v, is_causal=True)
        out2, w2 = sdpa(q, k, v, need_weights=True, normalizer="sparsemax")
    assert w is None and torch.equal(out, expected_out)
    assert [c.normalizer for c in calls] == ["softmax", "sparsemax"] and calls[0].is_causal
    # The hook is given the weights even when the caller did not ask for them.
    scores = (q @ k.transpose(-2, -1)) / 2 + torch.full((5, 5), float("-inf")).triu(1)
    close(calls[0].weights, scores.softmax(-1))
    assert calls[1].weights is w2 and calls[0].output is out
    sdpa(q, k, v)
    assert len(calls) == 2 and not functional.has_attention_hooks()
    handle = functional.register_attention_hook(calls.append)
    handle.remove()
    handle.remove()  # a second remove is harmless
    sdpa(q, k, v)
    assert len(calls) == 2


# ---------------------------------------------------------------- the methods ----------------


def _random_maps(batch, heads, length, layers, seed, dtype=torch.float32, masked_row=False):
    gen = torch.Generator().manual_seed(seed)
    maps = []
    for _ in range(layers):
        a = torch.softmax(2 * torch.randn(batch, heads, length, length, generator=gen,
                                          dtype=torch.float64), dim=-1)
        if masked_row:
            a[:, :, 1] = 0  # a query that saw no key
        maps.append(a.to(dtype))
    return tuple(maps)


def _reference_layer(a, residual, head_fusion):
    """One layer's matrix, per entry, in float64."""
    a = a.double()
    fused = {"mean": lambda t: t.sum(0) / t.shape[0], "max": lambda t: t.max(0).values,
             "min": lambda t: t.min(0).values}[head_fusion](a)
    n = fused.shape[0]
    out = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        row = [0.5 * fused[i, j].item() + (0.5 if (residual and i == j) else 0.0)
               for j in range(n)]
        total = sum(row)
        for j in range(n):
            out[i, j] = row[j] / total if total > 0 else 0.0
    return out


def _reference_rollout(maps, residual, head_fusion, start_layer):
    batch, length = maps[0].shape[0], maps[0].shape[-1]
    result = torch.empty(batch, length, length, dtype=torch.float64)
    for b in range(batch):
        r = torch.eye(length, dtype=torch.float64)
        for a in maps[start_layer:]:
            layer = _reference_layer(a[b], residual, head_fusion)
            r = torch.einsum("ik,kj->ij", layer, r)
        result[b] = r
    return result


@pytest.mark.parametrize("residual,head_fusion,start_layer,masked_row",
                         [(True, "mean", 0, False), (False, "mean", 0, False),
                          (True, "max", 1, True), (False, "min", 2, False),
                          (True, "mean", 0, True)])
def test_rollout_matches_float64_reference(residual, head_fusion, start_layer, masked_row):
    maps = _random_maps(2, 3, 6, 3, seed=7, masked_row=masked_row)
    got = rollout(maps, residual=residual, head_fusion=head_fusion, start_layer=start_layer)
    assert got.shape == (2, 6, 6) and got.dtype == torch.float32
    close(got, _reference_rollout(maps, residual, head_fusion, start_layer))
    if residual:
        close(got.sum(-1), torch.ones(2, 6, dtype=torch.float64))


@needs_networkx
def test_rollout_and_flow_on_a_hand_checked_graph():
    # Two layers, two tokens, no residual. Layer 0: every query looks half at each key.
    # Layer 1: output 0 looks half at each position, output 1 only at position 1.
    first = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    second = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    maps = (first[None, None], second[None, None])
    # Rollout multiplies: second @ first.
    close(rollout(maps, residual=False), torch.tensor([[[0.5, 0.5], [0.5, 0.5]]]))
    # Flow from output 0 to input 0: 0.5 along each of two paths, both edges into input 0 of
    # capacity 0.5: 1. From output 1: one edge of capacity 1, then 0.5 into either input.
    close(attention_flow(maps, residual=False), torch.tensor([[[1.0, 1.0], [0.5, 0.5]]]),
          rtol=1e-8)
    close(attention_flow(maps, residual=False, output_positions=[1]),
          torch.tensor([[[0.5, 0.5]]]), rtol=1e-8)


def _reference_flow(maps, residual, head_fusion, start_layer):
    """Maximum flow as the minimum cut (max-flow min-cut theorem), by trying every cut."""
    batch, length = maps[0].shape[0], maps[0].shape[-1]
    layers = maps[start_layer:]
    levels = len(layers) + 1
    nodes = levels * length
    node = lambda level, i: level * length + i  # noqa: E731
    result = torch.empty(batch, length, length, dtype=torch.float64)
    for b in range(batch):
        cap = torch.zeros(nodes, nodes, dtype=torch.float64)
        for level, a in enumerate(layers):
            m = _reference_layer(a[b], residual, head_fusion)
            for i, j in itertools.product(range(length), repeat=2):
                cap[node(level + 1, i), node(level, j)] = m[i, j]
        for i, j in itertools.product(range(length), repeat=2):
            source, sink = node(levels - 1, i), node(0, j)
            others = [n for n in range(nodes) if n not in (source, sink)]
            choices = torch.tensor(list(itertools.product([0.0, 1.0], repeat=len(others))),
                                   dtype=torch.float64)
            side = torch.zeros(len(choices), nodes, dtype=torch.float64)
            side[:, others] = choices
            side[:, source] = 1.0
            cut = ((side @ cap) * (1 - side)).sum(-1)
            result[b, i, j] = cut.min()
    return result


@needs_networkx
@pytest.mark.parametrize("residual,head_fusion,layers,start_layer",
                         [(True, "mean", 2, 0), (False, "max", 2, 0), (True, "mean", 3, 1),
                          (True, "min", 3, 0)])
def test_attention_flow_matches_minimum_cut_reference(residual, head_fusion, layers, start_layer):
    maps = _random_maps(2, 2, 3, layers, seed=11)
    got = attention_flow(maps, residual=residual, head_fusion=head_fusion,
                         start_layer=start_layer, progress=False)
    assert got.shape == (2, 3, 3) and got.dtype == torch.float64
    close(got, _reference_flow(maps, residual, head_fusion, start_layer), rtol=1e-7)
    subset = attention_flow(maps, residual=residual, head_fusion=head_fusion,
                            start_layer=start_layer, output_positions=[2, 0])
    assert torch.equal(subset, got[:, [2, 0]])


def _reference_relevance(weights, grads, start_layer):
    batch, length = weights[0].shape[0], weights[0].shape[-1]
    result = torch.empty(batch, length, length, dtype=torch.float64)
    for b in range(batch):
        r = torch.eye(length, dtype=torch.float64)
        for a, g in zip(weights[start_layer:], grads[start_layer:]):
            heads = a.shape[1]
            bar = torch.zeros(length, length, dtype=torch.float64)
            for h in range(heads):
                product = a[b, h].double() * g[b, h].double()
                bar += torch.where(product > 0, product, torch.zeros_like(product)) / heads
            r = r + torch.einsum("ik,kj->ij", bar, r)
        result[b] = r
    return result


@pytest.mark.parametrize("start_layer", [0, 2])
def test_gradient_relevance_matches_float64_reference(start_layer):
    weights = _random_maps(2, 3, 5, 3, seed=5)
    gen = torch.Generator().manual_seed(6)
    grads = tuple(torch.randn(w.shape, generator=gen) for w in weights)
    got = gradient_relevance(weights, grads, start_layer=start_layer)
    assert got.shape == (2, 5, 5) and got.dtype == torch.float32
    close(got, _reference_relevance(weights, grads, start_layer))
    # One layer: R = I + Ā.
    one = gradient_relevance(weights[:1], grads[:1])
    close(one, torch.eye(5) + (weights[0].double() * grads[0].double()).clamp(min=0).mean(1))


@needs_networkx
def test_explain_matches_the_float64_model_and_leaves_parameter_grads_alone():
    torch.manual_seed(4)
    model = TransformerPredictor(input_dim=5, model_dim=8, num_classes=3, num_heads=2,
                                 num_layers=2).eval()
    x = torch.randn(2, 6, 5)
    label = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 2, 1, 1, 0, 0]])
    exp = explain(lambda: model(x), target=label)
    assert all(p.grad is None for p in model.parameters())
    assert len(exp.weights) == 2 and exp.relevance.shape == (2, 6, 6)
    # The same model in float64 plain ops, A's gradient retained.
    h = model.embed(x).double()
    references = []
    for block in model.transformer.layers:
        h, A = _reference_block(block, h)
        references.append(A)
    logits = copy.deepcopy(model.output_net).double()(h)
    logits.gather(-1, label.unsqueeze(-1)).sum().backward()
    for recorded, A in zip(exp.grads, references):
        close(recorded, A.grad, rtol=2e-5)
    close(exp.relevance, _reference_relevance(references, [A.grad for A in references], 0),
          rtol=2e-5)
    close(exp.score, logits.gather(-1, label.unsqueeze(-1)).sum(), rtol=1e-5)
    # The other methods and targets.
    by_int = explain(lambda: model(x), target=1)
    close(by_int.score, logits[..., 1].sum(), rtol=1e-5)
    by_fn = explain(lambda: model(x), target=lambda out: out[0, 3, 2])
    close(by_fn.score, logits[0, 3, 2], rtol=1e-5)
    rolled = explain(lambda: model(x), method="rollout", head_fusion="max")
    close(rolled.relevance, _reference_rollout(references, True, "max", 0))
    assert rolled.grads is None and rolled.score is None
    flowed = explain(lambda: model(x), method="flow", output_positions=0)
    assert flowed.relevance.shape == (2, 1, 6)


# ---------------------------------------------------------------- bad inputs -----------------


MAPS = _random_maps(2, 2, 4, 2, seed=1)
BAD_MAPS = {
    "a tensor, not a tuple": (MAPS[0], TypeError, r"maps must be a tuple or list .* got Tensor"),
    "empty": ((), ValueError, r"maps is empty"),
    "not a tensor": ((MAPS[0], [[1.0]]), TypeError, r"maps\[1\] must be a tensor, got list"),
    "integer maps": ((MAPS[0].long(),), TypeError, r"maps\[0\] must be floating point"),
    "three dimensions": ((MAPS[0][:, 0],), ValueError,
                         r"maps\[0\] must have 4 dimensions \[batch, heads, L, L\], got shape \[2, 4, 4\]"),
    "not square": ((MAPS[0][..., :3],), ValueError, r"maps\[0\] is not square: shape \[2, 2, 4, 3\]"),
    "mismatched layers": ((MAPS[0], MAPS[1][:1]), ValueError,
                          r"maps\[1\] has shape \[1, 2, 4, 4\] but maps\[0\] has \[2, 2, 4, 4\]"),
    "NaN": ((MAPS[0], MAPS[1] * float("nan")), ValueError, r"maps\[1\] contains NaN"),
}


@pytest.mark.parametrize("method", ["rollout", "flow"])
@pytest.mark.parametrize("case", BAD_MAPS, ids=str)
def test_bad_maps_are_refused(case, method):
    maps, error, message = BAD_MAPS[case]
    fn = rollout if method == "rollout" else attention_flow
    with pytest.raises(error, match=message):
        fn(maps)


BAD_OPTIONS = {
    "unknown head_fusion": (lambda: rollout(MAPS, head_fusion="median"), ValueError,
                            r"head_fusion must be one of 'mean', 'max', 'min', got 'median'"),
    "start_layer out of range": (lambda: rollout(MAPS, start_layer=2), ValueError,
                                 r"start_layer must be in \[0, 1\] for 2 layers, got 2"),
    "start_layer not an int": (lambda: rollout(MAPS, start_layer=1.0), TypeError,
                               r"start_layer must be an integer, got float"),
    "output position out of range": (lambda: attention_flow(MAPS, output_positions=[4]),
                                     ValueError, r"output_positions must hold ints in \[0, 3\], got 4"),
    "no output positions": (lambda: attention_flow(MAPS, output_positions=[]), ValueError,
                            r"output_positions must be an int or a non-empty sequence"),
    "progress not a bool": (lambda: attention_flow(MAPS, progress="yes"), TypeError,
                            r"progress must be True, False or None"),
    "relevance, layer counts differ": (lambda: gradient_relevance(MAPS, MAPS[:1]), ValueError,
                                       r"weights has 2 layers but grads has 1"),
    "relevance, shapes differ": (
        lambda: gradient_relevance(MAPS[:1], (MAPS[0][:, :1],)), ValueError,
        r"grads\[0\] has shape \[2, 1, 4, 4\] but weights\[0\] has \[2, 2, 4, 4\]"),
    "relevance, empty grads": (lambda: gradient_relevance(MAPS, ()), ValueError,
                               r"grads is empty"),
}


@pytest.mark.parametrize("case", BAD_OPTIONS, ids=str)
def test_bad_options_are_refused(case):
    fn, error, message = BAD_OPTIONS[case]
    with pytest.raises(error, match=message):
        fn()


def test_bad_explain_calls_are_refused():
    torch.manual_seed(0)
    model = TransformerPredictor(input_dim=3, model_dim=4, num_classes=2, num_heads=1,
                                 num_layers=1).eval()
    x = torch.randn(1, 4, 3)
    cases = [
        (lambda: explain(lambda: model(x)), ValueError,
         r"the output has shape \[1, 4, 2\]; pass target"),
        (lambda: explain(lambda: model(x), target=2), ValueError,
         r"target must be a class index in \[0, 1\], got 2"),
        (lambda: explain(lambda: model(x), target=torch.zeros(4, dtype=torch.long)), ValueError,
         r"a tensor target must have the output's leading shape \[1, 4\]"),
        (lambda: explain(lambda: model(x), target=torch.full((1, 4), 5)), ValueError,
         r"target holds class indices outside \[0, 1\]"),
        (lambda: explain(lambda: model(x), target="cat"), TypeError,
         r"target must be None, an int, an integer tensor or a function"),
        (lambda: explain(lambda: model(x), target=lambda out: out), ValueError,
         r"target\(output\) must return a one-element tensor"),
        (lambda: explain(lambda: model(x), method="saliency"), ValueError,
         r"method must be one of 'gradient', 'rollout', 'flow', got 'saliency'"),
        (lambda: explain(lambda: model(x), target=0, head_fusion="max"), TypeError,
         r"method 'gradient' takes no options, got head_fusion"),
        (lambda: explain(model(x)), TypeError, r"forward must be a function"),
        (lambda: explain(lambda: x.sum()), RuntimeError, r"forward\(\) made no attention call"),
        (lambda: explain(lambda: model(x).detach()[0, 0, 0]), RuntimeError,
         r"the score does not depend on the recorded attention"),
    ]
    for fn, error, message in cases:
        with pytest.raises(error, match=message):
            fn()
    frozen = TransformerPredictor(input_dim=3, model_dim=4, num_classes=2, num_heads=1,
                                  num_layers=1).eval().requires_grad_(False)
    with pytest.raises(RuntimeError, match=r"parameters frozen"):
        explain(lambda: frozen(x), target=0)


def test_attention_flow_without_networkx_says_what_to_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "networkx", None)  # import networkx now fails
    with pytest.raises(ImportError, match=r"attention_flow needs networkx: pip install networkx"):
        attention_flow(MAPS)


requires_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or not attnlab.build_info()["cuda"],
    reason="no CUDA device here (or a build without CUDA kernels)")


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_grad_weights_and_the_recorder_on_cuda(dtype):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=gen).to("cuda", dtype) for n in (40, 70, 70))
    mask = torch.rand(40, 70, generator=gen).cuda() > 0.3
    output, lse, weights = torch.ops.attnlab._sdpa_forward(q, k, v, mask, True, None, True)
    dout = torch.randn(output.shape, generator=gen).to("cuda", dtype)
    grads = torch.ops.attnlab._sdpa_backward(dout, q, k, v, mask, True, None, output, lse,
                                             None, False, True)
    assert grads[4].dtype == dtype and grads[4].shape == (2, 3, 40, 70)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    close(grads[4].cpu(), dout.cpu().double() @ v.cpu().double().mT, rtol=tolerance)
    with record() as rec:
        out, _ = functional.scaled_dot_product_attention(q.requires_grad_(), k, v, mask, True)
    (out.float() * dout.float()).sum().backward()
    close(rec.grads[0].cpu(), grads[4].cpu().double(), rtol=tolerance)
    close(rec.weights[0].cpu(), weights.cpu().double(), rtol=tolerance)
