"""torch.ops.attnlab.encoder_block, the fused encoder block: against the tutorial's equations
in float64 (forward and every gradient), gradcheck, opcheck, torch.compile, and the module's
choice between the fused and the module-by-module path."""

import copy

import pytest
import torch

import attnlab

from attnlab.nn import EncoderBlock, TransformerEncoder
from reference import tutorial_block


def random_block(dim, heads, dim_ff, norm_first, dtype=torch.float64, seed=0):
    """A block whose parameters are all random (LayerNorm scales and biases too), so every
    gradient is exercised."""
    torch.manual_seed(seed)
    block = EncoderBlock(dim, heads, dim_ff, norm_first=norm_first).to(dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        block.norm1.weight.add_(1.0)
        block.norm2.weight.add_(1.0)
    return block


def fused(block, x, mask=None):
    """The operator called directly, with the module's parameters."""
    return torch.ops.attnlab.encoder_block(
        x, *block._fused_parameters(), block.self_attn.num_heads, mask, block.norm_first,
        block.norm1.eps, block.norm2.eps)


def masks(batch, heads, length):
    torch.manual_seed(1)
    keep = torch.rand(batch, heads, length, length) > 0.4
    keep[..., 0] = True  # every query sees a key, so the plain-ops reference has no NaN rows
    return {
        None: None,
        "causal [L, L]": torch.ones(length, length, dtype=torch.bool).tril(),
        "bool [B, 1, L, L]": keep[:, :1],
        "bool [B, H, L, L]": keep,
        "float [B, H, L, L]": torch.randn(batch, heads, length, length, dtype=torch.float64),
    }


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
# (2, 128): heads of 64 features in the token rows, where the small kernels prefetch each
# next batch entry's rows.
@pytest.mark.parametrize("heads,dim", [(1, 8), (2, 12), (4, 16), (2, 128)])
@pytest.mark.parametrize("mask_kind", list(masks(1, 1, 1)))
def test_matches_tutorial_equations_with_gradients(norm_first, heads, dim, mask_kind):
    batch, length = 3, 6
    block = random_block(dim, heads, 20, norm_first)
    mask = masks(batch, heads, length)[mask_kind]
    x = torch.randn(batch, length, dim, dtype=torch.float64, requires_grad=True)
    out = fused(block, x, mask)
    expected = tutorial_block(block, x, mask)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    grad = torch.randn_like(out)
    inputs = [x, *block.parameters()]
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(expected, inputs, grad)
    names = ["x"] + [name for name, _ in block.named_parameters()]
    for name, g, w in zip(names, got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_parameter_gradients_without_input_gradient(norm_first):
    # x needs no gradient: the backward skips dx, and must still get every parameter's right.
    block = random_block(8, 2, 12, norm_first)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    grad = torch.randn(2, 5, 8, dtype=torch.float64)
    got = torch.autograd.grad(fused(block, x), list(block.parameters()), grad)
    want = torch.autograd.grad(tutorial_block(block, x), list(block.parameters()), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_float32_close_to_float64_reference():
    block64 = random_block(32, 4, 64, norm_first=False)
    block32 = copy.deepcopy(block64).float()
    x = torch.randn(8, 10, 32, dtype=torch.float64)
    expected = tutorial_block(block64, x)
    got = fused(block32, x.float()).double()
    rel = ((got - expected).abs().max() / expected.abs().max()).item()
    assert rel < 1e-5


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_gradcheck(norm_first):
    block = random_block(4, 2, 6, norm_first)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    params = [p.detach().requires_grad_() for p in block._fused_parameters()]

    def run(x, *params):
        return torch.ops.attnlab.encoder_block(x, *params, 2, mask, norm_first, 1e-5, 1e-5)
    assert torch.autograd.gradcheck(run, (x, *params))


def test_opcheck():
    block = random_block(8, 2, 12, norm_first=False)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 5, 5) > 0.3
    args = (x, *block._fused_parameters(), 2, mask, False, 1e-5, 1e-5)
    torch.library.opcheck(torch.ops.attnlab.encoder_block, args)
    forward_args = (x.detach(), [p.detach() for p in block._fused_parameters()], 2, mask, True,
                    1e-5, 1e-5)
    torch.library.opcheck(torch.ops.attnlab._encoder_block_forward, forward_args)


def test_torch_compile_fullgraph():
    block = random_block(8, 2, 12, norm_first=False, dtype=torch.float32)
    x = torch.randn(2, 5, 8, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, block(x))
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_module_takes_the_fused_path_only_when_it_computes_the_same(monkeypatch):
    calls = []
    real = torch.ops.attnlab.encoder_block

    class Spy:
        def __call__(self, *args):
            calls.append(args)
            return real(*args)
    monkeypatch.setattr(torch.ops.attnlab, "encoder_block", Spy())
    block = EncoderBlock(8, 2, 16, dropout=0.5)
    x = torch.randn(2, 5, 8)
    block.train()
    block(x)  # dropout active: module by module
    assert not calls
    block.eval()
    block(x)
    assert len(calls) == 1
    learnable = torch.zeros(5, 5, requires_grad=True)
    block(x, mask=learnable)  # a mask that wants a gradient: module by module
    assert len(calls) == 1


def test_module_paths_agree():
    # A learnable mask sends the module down the module-by-module path; an all-zero one changes
    # nothing, so both paths must give the same block.
    torch.manual_seed(3)
    block = EncoderBlock(16, 4, 32).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    zero_mask = torch.zeros(7, 7, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(block(x), block(x, mask=zero_mask), rtol=1e-12, atol=1e-12)


def test_encoder_attention_maps_unchanged_by_fusion():
    torch.manual_seed(4)
    encoder = TransformerEncoder(2, input_dim=8, num_heads=2, dim_feedforward=16).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    maps = encoder.get_attention_maps(x)
    h = x
    for layer, got in zip(encoder.layers, maps):
        _, expected = layer.self_attn(h, return_attention=True)
        torch.testing.assert_close(got, expected)
        h = tutorial_block(layer, h)
    torch.testing.assert_close(encoder(x), h, rtol=1e-9, atol=1e-9)


BAD_INPUTS = [
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x[0], *p, 2), r"x must have shape \[batch"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x.half(), *p, 2), r"qkv_weight is Float on cpu but x is Half on cpu"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x.to(torch.int32), *p, 2),
     r"x must be float32, float64, float16 or bfloat16, got Int"),
    (lambda b, x, p: torch.ops.attnlab._encoder_block_forward(x.bfloat16(), [t.bfloat16() for t in p], 2, None, False, 1e-5, 1e-5),
     r"the kernel takes float32 or float64 \(attnlab.encoder_block widens float16 and bfloat16 itself\)"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x, *p, 3),
     r"num_heads \(3\) must be positive and divide the width of x \(8\)"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x[..., :6], *p, 2),
     r"qkv_weight must have shape \[18, 6\] for x of width 6, got \[24, 8\]"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x, *p, 2, torch.ones(4, 4, dtype=torch.bool)),
     r"attn_mask of shape \[4, 4\] does not broadcast to \[batch, heads, length, length\]"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x, *p, 2, torch.ones(5, 5, dtype=torch.int)),
     r"attn_mask must be bool"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x, *p[:4], p[4].double(), *p[5:], 2),
     r"norm1_weight is Double on cpu but x is Float on cpu"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(x, *p, 2, None, False, float("nan")),
     r"LayerNorm eps must be a finite number >= 0, got nan"),
    (lambda b, x, p: torch.ops.attnlab.encoder_block(
        x, *p, 2, torch.zeros(5, 5, requires_grad=True)), r"attn_mask gets no gradient here"),
]


@pytest.mark.parametrize("call,message", BAD_INPUTS)
def test_bad_inputs(call, message):
    block = EncoderBlock(8, 2, 12)
    x = torch.randn(2, 5, 8)
    with pytest.raises(RuntimeError, match=message):
        call(block, x, list(block._fused_parameters()))


def test_thread_counts_agree():
    # Each thread runs the block on its share of the batch, and then sums the parameters'
    # gradients of its share of their features over all rows. In float64 the products go to
    # the BLAS or a small kernel by size, so the shares may round differently.
    block = random_block(16, 4, 24, norm_first=False)
    x = torch.randn(9, 6, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(9, 6, 16, dtype=torch.float64)
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            out = fused(block, x)
            results.append((out, *torch.autograd.grad(out, [x, *block.parameters()], grad)))
    finally:
        torch.set_num_threads(previous)
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(attnlab.build_info()["cpu_float32_products"] != "avx512",
                    reason="float32 products go to the BLAS on this CPU, whose rounding may "
                           "depend on a product's size")
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("need_input_grad", [True, False], ids=["dx", "no dx"])
@pytest.mark.parametrize("shape", [(37, 7, 64, 4, 96), (600, 7, 16, 2, 24)],
                         ids=["B37", "4200 rows"])
def test_float32_bitwise_the_same_for_every_thread_count_and_call(norm_first, need_input_grad,
                                                                    shape):
    # The threads' shares of the batch (forward, and the backward's first pass) and of the
    # parameters' features (its second pass) follow how fast each thread ran its last parts, so
    # they change from call to call; what a row or a feature computes does not. Before the
    # backward summed every feature over all rows in one order, the parameters' gradients of 2
    # threads differed from those of 1 in the last bits.
    # 4200 rows: the parameters' gradients sum more rows than one product of f32_gemm takes.
    batch, length, dim, heads, dim_ff = shape
    block = random_block(dim, heads, dim_ff, norm_first, dtype=torch.float32)
    x = torch.randn(batch, length, dim, requires_grad=need_input_grad)
    grad = torch.randn(batch, length, dim)
    mask = masks(batch, heads, length)["bool [B, H, L, L]"]
    inputs = ([x] if need_input_grad else []) + list(block.parameters())
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3, 2):
            torch.set_num_threads(threads)
            for _ in range(4):
                out = fused(block, x, mask)
                results.append((threads, out, *torch.autograd.grad(out, inputs, grad)))
    finally:
        torch.set_num_threads(previous)
    first = results[0]
    for other in results[1:]:
        for i, (got, want) in enumerate(zip(other[1:], first[1:])):
            assert torch.equal(got, want), (
                f"{other[0]} threads, result {i}: max difference {(got - want).abs().max()}")
