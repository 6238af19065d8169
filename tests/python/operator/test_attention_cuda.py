"""The CUDA kernels of the attnlab operators against the float64 CPU reference.

float32 must be within 1e-5 of the reference, relative to the reference's largest entry;
float16 and bfloat16 must be no more than twice as far from it as torch's own SDPA (or plain
torch ops) at the same precision. Without a GPU every test here but the build check skips.
"""

import math
import os
import random
import shutil

import pytest
import torch

import attnlab
import reference
from test_attention import random_case

requires_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the CUDA kernels are compiled and linked but cannot run")

HALF_DTYPES = [torch.float16, torch.bfloat16]
FLOAT32_TOLERANCE = 1e-5


def relative_error(result, expected):
    """Largest absolute error relative to the reference's largest entry (absolute where that
    is below 1: some gradients are exactly zero, e.g. those of the query with one key)."""
    expected = expected.double().cpu()
    if expected.numel() == 0:
        return 0.0
    error = (result.double().cpu() - expected).abs().max().item()
    return error / max(expected.abs().max().item(), 1.0)


def assert_float32_close(result, expected, what):
    error = relative_error(result, expected)
    assert error <= FLOAT32_TOLERANCE, f"{what}: relative error {error:.2e}"


def assert_no_worse_than_torch(result, torch_result, expected, what):
    """Our error at most twice torch's, both against the float64 reference."""
    ours, theirs = relative_error(result, expected), relative_error(torch_result, expected)
    assert ours <= 2 * theirs + 1e-6, f"{what}: error {ours:.2e}, torch's {theirs:.2e}"


def assert_grads_no_worse_than_torch(output, torch_output, ref_output, ours, theirs, ref_inputs,
                                     grad_output, what=""):
    """The gradients of q, k and v through attnlab's output and torch's, for the same
    grad_output (a CPU tensor of the inputs' dtype, or already on the GPU), each no worse than
    twice torch's error against the float64 reference's."""
    grads = torch.autograd.grad(output, ours, grad_output.to("cuda", output.dtype))
    torch_grads = torch.autograd.grad(torch_output, theirs, grad_output.to("cuda", output.dtype))
    ref_grads = torch.autograd.grad(ref_output, ref_inputs, grad_output.double().cpu())
    for name, grad, torch_grad, ref in zip("qkv", grads, torch_grads, ref_grads):
        assert grad.dtype == output.dtype
        assert_no_worse_than_torch(grad, torch_grad, ref, f"grad of {name}{what}")


def on_cuda(t, layout="contiguous", dtype=None):
    """t on the GPU (as dtype) in one of the memory layouts the CPU tests use."""
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


def cuda_case(seed, dtype=torch.float32):
    """The CPU tests' random case (broadcast batch dims, masks, causal, odd sizes) on the GPU,
    with its CPU tensors kept for the reference."""
    case = random_case(seed)
    rng = random.Random(seed)
    layouts = ["contiguous", "heads_last", "sliced", "column_major"]
    gpu = {name: on_cuda(case[name], rng.choice(layouts), dtype)
           for name in ("query", "key", "value")}
    gpu["attn_mask"] = None if case["attn_mask"] is None else case["attn_mask"].cuda()
    return case, {**case, **gpu}


def cuda_built_here():
    """What CMake decides: a CUDA torch and nvcc, unless ATTNLAB_CUDA says otherwise."""
    switch = os.environ.get("ATTNLAB_CUDA", "")
    if switch:
        return switch.upper() not in ("0", "OFF", "FALSE", "NO")
    return torch.version.cuda is not None and (shutil.which("nvcc") or os.environ.get("CUDACXX"))


@pytest.mark.skipif(not cuda_built_here(), reason="CPU-only build: no nvcc, no CUDA torch, or ATTNLAB_CUDA=0")
def test_build_info_reports_the_cuda_kernels():
    info = attnlab.build_info()
    assert info["cuda"] is True
    assert info["cuda_archs"]  # sm_80 and sm_90 unless CMAKE_CUDA_ARCHITECTURES says otherwise


# ---- float32 ------------------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("seed", range(0, 240, 3))
def test_float32_random_case_matches_reference(seed):
    cpu_case, case = cuda_case(seed)
    output, weights = attnlab.scaled_dot_product_attention(**case, need_weights=True)
    output_only, _ = attnlab.scaled_dot_product_attention(**case)
    ref_output, ref_weights = reference.attention(**cpu_case)
    assert output.is_cuda and output.dtype == torch.float32
    assert output.shape == ref_output.shape
    assert weights.shape == (*output.shape[:-1], cpu_case["key"].shape[-2])
    assert_float32_close(output, ref_output, "output")
    assert_float32_close(output_only, ref_output, "output without weights")
    assert_float32_close(weights, ref_weights.expand(weights.shape), "weights")
    assert not torch.isnan(output).any()


@requires_gpu
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("seed", range(0, 240, 8))
def test_float32_random_case_gradients_match_reference(seed, need_weights):
    cpu_case, case = cuda_case(seed)
    inputs = {name: case[name].detach().requires_grad_() for name in ("query", "key", "value")}
    output, _ = attnlab.scaled_dot_product_attention(**{**case, **inputs},
                                                     need_weights=need_weights)
    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, list(inputs.values()), grad_output)

    ref_inputs = {name: cpu_case[name].detach().double().requires_grad_() for name in inputs}
    ref_output, _ = reference.attention(**{**cpu_case, **ref_inputs})
    ref_grads = torch.autograd.grad(ref_output, list(ref_inputs.values()),
                                    grad_output.double().cpu())
    for name, grad, ref in zip(inputs, grads, ref_grads):
        assert grad.shape == inputs[name].shape and grad.is_cuda, name
        assert_float32_close(grad, ref, f"grad of {name}")


@requires_gpu
@pytest.mark.parametrize("dim,dim_v", [(1, 1), (31, 33), (64, 64), (65, 7), (128, 128),
                                       (129, 200), (256, 256)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("len_q,len_k", [(77, 101), (101, 77)])
def test_float32_every_head_size_family_across_tiles(dim, dim_v, is_causal, len_q, len_k):
    # Lengths that are not multiples of any tile size; L_q ≠ L_k both ways with top-left causal.
    gen = torch.Generator().manual_seed(dim * 1000 + dim_v)
    q = torch.randn(2, 3, len_q, dim, generator=gen)
    k = torch.randn(2, 3, len_k, dim, generator=gen)
    v = torch.randn(2, 3, len_k, dim_v, generator=gen)
    mask = torch.rand(len_q, len_k, generator=gen) > 0.2
    inputs = [on_cuda(t).requires_grad_() for t in (q, k, v)]
    output, weights = attnlab.scaled_dot_product_attention(*inputs, mask.cuda(), is_causal,
                                                           need_weights=True)
    ref_inputs = [t.double().requires_grad_() for t in (q, k, v)]
    ref_output, ref_weights = reference.attention(*ref_inputs, mask, is_causal)
    assert_float32_close(output, ref_output, "output")
    assert_float32_close(weights, ref_weights, "weights")
    grad_output = torch.randn(ref_output.shape, generator=gen)
    grads = torch.autograd.grad(output, inputs, grad_output.cuda())
    ref_grads = torch.autograd.grad(ref_output, ref_inputs, grad_output.double())
    for name, grad, ref in zip("qkv", grads, ref_grads):
        assert_float32_close(grad, ref, f"grad of {name}")


@requires_gpu
@pytest.mark.parametrize("mask_shape", [(2, 4, 37, 45), (37, 45), (45,), (4, 1, 45), (37, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_float32_float_mask_gradient(mask_shape, is_causal):
    # A learnable additive mask receives the scores' gradient summed over its broadcast dims.
    gen = torch.Generator().manual_seed(len(mask_shape))
    q, k, v = (torch.randn(2, 4, n, 16, generator=gen) for n in (37, 45, 45))
    mask = torch.randn(*mask_shape, generator=gen)
    inputs = [on_cuda(t).requires_grad_() for t in (q, k, v, mask)]
    output, _ = attnlab.scaled_dot_product_attention(*inputs[:3], inputs[3], is_causal)
    ref_inputs = [t.double().requires_grad_() for t in (q, k, v, mask)]
    ref_output, _ = reference.attention(*ref_inputs[:3], ref_inputs[3], is_causal)
    grad_output = torch.randn(ref_output.shape, generator=gen)
    grads = torch.autograd.grad(output, inputs, grad_output.cuda())
    ref_grads = torch.autograd.grad(ref_output, ref_inputs, grad_output.double())
    assert grads[3].shape == mask.shape and grads[3].dtype == torch.float32
    for name, grad, ref in zip(["q", "k", "v", "mask"], grads, ref_grads):
        assert_float32_close(grad, ref, f"grad of {name}")


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_and_zero_gradients(dtype, mask_kind):
    q, k, v = (torch.randn(2, n, 8, device="cuda", dtype=dtype, requires_grad=True)
               for n in (4, 5, 5))
    mask = torch.ones(2, 4, 5, dtype=torch.bool, device="cuda")
    mask[0, 1] = False
    mask[1] = False
    if mask_kind == "float":
        mask = torch.zeros(2, 4, 5, device="cuda").masked_fill(~mask, float("-inf"))
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert torch.equal(output[0, 1], torch.zeros_like(output[0, 1]))
    assert torch.equal(output[1], torch.zeros_like(output[1]))
    assert torch.equal(weights[1], torch.zeros_like(weights[1]))
    assert not torch.isnan(output).any()
    output.sum().backward()
    assert torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


@requires_gpu
def test_many_batch_dimensions_and_empty_problems():
    # More broadcast batch dimensions than the kernels index directly, and empty sizes.
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, 2, 2, 2, 2, 2, 5, 4, generator=gen)
    k = torch.randn(2, 1, 2, 2, 1, 2, 2, 6, 4, generator=gen)
    v = torch.randn(6, 3, generator=gen)
    output, _ = attnlab.scaled_dot_product_attention(on_cuda(q), on_cuda(k), on_cuda(v))
    assert_float32_close(output, reference.attention(q, k, v)[0], "output")
    output, weights = attnlab.scaled_dot_product_attention(
        *(torch.randn(0, n, 4, device="cuda") for n in (3, 5, 5)), need_weights=True)
    assert output.shape == (0, 3, 4) and weights.shape == (0, 3, 5)
    output, _ = attnlab.scaled_dot_product_attention(
        torch.randn(3, 4, device="cuda"), torch.randn(0, 4, device="cuda"),
        torch.randn(0, 2, device="cuda"))
    assert torch.equal(output, torch.zeros(3, 2, device="cuda"))


# ---- float16 / bfloat16 ---------------------------------------------------------------------


def _half_inputs(shape_q, shape_k, dim_v, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=gen)
    k = torch.randn(*shape_k, generator=gen)
    v = torch.randn(*shape_k[:-1], dim_v, generator=gen)
    # Rounded to the half type first: every implementation then sees the same values.
    return [t.to(dtype).double() for t in (q, k, v)]


HALF_SHAPES = [  # (batch, len_q, len_k, dim, dim_v)
    ((2, 4), 1, 3, 64, 64),
    ((3,), 100, 37, 32, 32),
    ((2, 2), 129, 257, 64, 64),
    ((1, 8), 300, 300, 128, 128),
    ((2,), 65, 190, 80, 80),
    ((2,), 33, 70, 256, 256),
    ((4,), 50, 50, 16, 16),
    ((3,), 45, 61, 7, 9),
]


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("shape", HALF_SHAPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_no_worse_than_torch(dtype, shape, mask_kind, is_causal):
    batch, len_q, len_k, dim, dim_v = shape
    q, k, v = _half_inputs((*batch, len_q, dim), (*batch, len_k, dim), dim_v, dtype,
                           seed=len_q * 7 + len_k)
    gen = torch.Generator().manual_seed(len_k)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(len_q, len_k, generator=gen) > 0.3
        mask[:, 0] = True  # torch's kernels return NaN for rows with every key masked
    elif mask_kind == "float":
        mask = torch.randn(1, len_k, generator=gen).to(dtype).double()  # 2-D: torch wants that
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_output, _ = reference.attention(*ref_inputs, mask, is_causal)

    ours = [on_cuda(t, dtype=dtype).requires_grad_() for t in (q, k, v)]
    theirs = [on_cuda(t, dtype=dtype).requires_grad_() for t in (q, k, v)]
    gpu_mask = None if mask is None else on_cuda(mask, dtype=dtype if mask_kind == "float" else None)
    output, _ = attnlab.scaled_dot_product_attention(*ours, gpu_mask, is_causal)
    torch_output = torch.nn.functional.scaled_dot_product_attention(
        *theirs, attn_mask=gpu_mask, is_causal=is_causal and mask is None)
    if is_causal and mask is not None:  # torch takes a mask or is_causal, not both
        causal = torch.ones(len_q, len_k, dtype=torch.bool, device="cuda").tril()
        combined = (gpu_mask & causal if mask_kind == "bool"
                    else gpu_mask.expand(len_q, len_k).masked_fill(~causal, float("-inf")))
        torch_output = torch.nn.functional.scaled_dot_product_attention(*theirs,
                                                                        attn_mask=combined)
    assert output.dtype == dtype
    assert_no_worse_than_torch(output, torch_output, ref_output, "output")

    grad_output = torch.randn(ref_output.shape, generator=gen).to(dtype)
    assert_grads_no_worse_than_torch(output, torch_output, ref_output, ours, theirs, ref_inputs,
                                     grad_output)


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_weights_no_worse_than_plain_softmax(dtype, is_causal):
    q, k, v = _half_inputs((2, 3, 90, 64), (2, 3, 140, 64), 64, dtype, seed=3)
    ref_output, ref_weights = reference.attention(q, k, v, is_causal=is_causal)
    gq, gk, gv = (on_cuda(t, dtype=dtype) for t in (q, k, v))
    output, weights = attnlab.scaled_dot_product_attention(gq, gk, gv, is_causal=is_causal,
                                                           need_weights=True)
    scores = gq @ gk.transpose(-2, -1) / math.sqrt(64)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(90, 140, dtype=torch.bool, device="cuda").tril(),
                                    float("-inf"))
    plain_weights = scores.softmax(-1)
    assert weights.dtype == dtype
    assert_no_worse_than_torch(weights, plain_weights, ref_weights, "weights")
    assert_no_worse_than_torch(output, plain_weights @ gv, ref_output, "output")


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("len_q,len_k", [(200, 256), (130, 72), (300, 517)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_weights_across_tiles_and_head_sizes(dtype, dim, len_q, len_k, is_causal):
    # The head sizes and layouts the flash forward takes (with ATTNLAB_CUDA_FLASH_WEIGHTS=1 its
    # second pass writes the weights; otherwise the generic forward does): several query and key
    # tiles, rows of weights 16-byte aligned (256, 72) or not (517), more queries than keys, and
    # under the causal mask key tiles no row of a query block sees. The output is the one
    # without weights, and the weights are no worse than a plain softmax's.
    q, k, v = _half_inputs((1, 2, len_q, dim), (1, 2, len_k, dim), dim, dtype, seed=dim + len_k)
    ref_output, ref_weights = reference.attention(q, k, v, is_causal=is_causal)
    gq, gk, gv = (on_cuda(t, dtype=dtype) for t in (q, k, v))
    output, weights = attnlab.scaled_dot_product_attention(gq, gk, gv, is_causal=is_causal,
                                                           need_weights=True)
    output_only, _ = attnlab.scaled_dot_product_attention(gq, gk, gv, is_causal=is_causal)
    scores = gq @ gk.transpose(-2, -1) / math.sqrt(dim)
    if is_causal:
        allowed = torch.ones(len_q, len_k, dtype=torch.bool, device="cuda").tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
        assert (weights.masked_select(~allowed) == 0).all(), "hidden pairs must weigh 0"
    plain_weights = scores.softmax(-1)
    assert weights.dtype == dtype and weights.shape == (1, 2, len_q, len_k)
    assert_no_worse_than_torch(weights, plain_weights, ref_weights, "weights")
    assert_no_worse_than_torch(output, plain_weights @ gv, ref_output, "output")
    torch.testing.assert_close(output, output_only, rtol=0, atol=2 * relative_error(
        output_only, ref_output) + 1e-6)


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("mask_shape", [(2, 4, 37, 45), (37, 45), (4, 1, 45)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_float_mask_gradient_no_worse_than_plain_ops(dtype, mask_shape, is_causal):
    # The learnable mask's gradient (float32 here) against plain torch ops in the same precision.
    gen = torch.Generator().manual_seed(len(mask_shape) + 10 * is_causal)
    q, k, v = _half_inputs((2, 4, 37, 40), (2, 4, 45, 40), 40, dtype, seed=len(mask_shape))
    mask = torch.randn(*mask_shape, generator=gen).to(dtype).double()
    allowed = torch.ones(37, 45, dtype=torch.bool).tril()
    ref_mask = mask.clone().requires_grad_()
    ref_output, _ = reference.attention(q, k, v, ref_mask, is_causal)
    grad_output = torch.randn(ref_output.shape, generator=gen).to(dtype)
    (ref_grad,) = torch.autograd.grad(ref_output, ref_mask, grad_output.double())

    ours = on_cuda(mask, dtype=torch.float32).requires_grad_()
    output, _ = attnlab.scaled_dot_product_attention(*(on_cuda(t, dtype=dtype) for t in (q, k, v)),
                                                     ours, is_causal)
    (grad,) = torch.autograd.grad(output, ours, grad_output.cuda())
    plain_mask = on_cuda(mask, dtype=dtype).requires_grad_()
    gq, gk, gv = (on_cuda(t, dtype=dtype) for t in (q, k, v))
    scores = gq @ gk.transpose(-2, -1) / math.sqrt(40) + plain_mask
    if is_causal:
        scores = scores.masked_fill(~allowed.cuda(), float("-inf"))
    (plain_grad,) = torch.autograd.grad(scores.softmax(-1) @ gv, plain_mask, grad_output.cuda())
    assert grad.shape == mask.shape and grad.dtype == torch.float32
    assert_no_worse_than_torch(grad, plain_grad, ref_grad, "grad of the mask")


# ---- operator contract on CUDA --------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("mask_kind,is_causal,need_weights",
                         [("none", False, False), ("bool", True, True), ("float", False, False)])
def test_opcheck_on_cuda(dtype, mask_kind, is_causal, need_weights):
    # Fake kernels must agree with the CUDA ones (the log-sum-exp is float32 in half precision).
    q, k, v = (torch.randn(2, 3, n, 8, device="cuda", dtype=dtype) for n in (5, 7, 7))
    mask = {"none": None, "bool": torch.rand(5, 7, device="cuda") > 0.3,
            "float": torch.randn(1, 5, 7, device="cuda")}[mask_kind]
    args = (q, k, v, mask, is_causal, None, need_weights)
    torch.library.opcheck(torch.ops.attnlab._sdpa_forward.default, args)
    output, lse, _ = torch.ops.attnlab._sdpa_forward(*args)
    assert lse.dtype == torch.float32
    backward_args = (torch.randn_like(output), *args[:6], output, lse)
    torch.library.opcheck(torch.ops.attnlab._sdpa_backward.default, backward_args)
    grad_args = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.attnlab.scaled_dot_product_attention.default,
                          (*grad_args, *args[3:]))


@requires_gpu
def test_runs_on_the_current_stream_and_device():
    q = torch.randn(4, 2, 300, 64, device="cuda")
    expected, _ = attnlab.scaled_dot_product_attention(q, q, q, is_causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        output, _ = attnlab.scaled_dot_product_attention(q, q, q, is_causal=True)
    stream.synchronize()
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


@requires_gpu
def test_bad_inputs_on_cuda():
    q = torch.randn(2, 4, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"key is on cpu but query is on cuda"):
        attnlab.scaled_dot_product_attention(q, q.cpu(), q)
    with pytest.raises(RuntimeError, match=r"query must be float32, float16 or bfloat16 on CUDA, got Double"):
        attnlab.scaled_dot_product_attention(q.double(), q.double(), q.double())
    wide = torch.randn(2, 4, 257, device="cuda")
    with pytest.raises(NotImplementedError, match=r"at most 256 features per head, got 257"):
        attnlab.scaled_dot_product_attention(wide, wide, q)
    with pytest.raises(RuntimeError, match=r"attn_mask is on cpu but query is on cuda"):
        attnlab.scaled_dot_product_attention(q, q, q, torch.ones(4, 4, dtype=torch.bool))
    half = q.half()
    output, lse, _ = torch.ops.attnlab._sdpa_forward(half, half, half, None, False, None, False)
    with pytest.raises(RuntimeError, match=r"output has dtype Float, expected the inputs' Half"):
        torch.ops.attnlab._sdpa_backward(output.float(), half, half, half, None, False, None,
                                         output.float(), lse)


@requires_gpu
def test_modules_run_on_cuda_unchanged():
    torch.manual_seed(0)
    layer = attnlab.nn.MultiheadAttention(input_dim=16, embed_dim=32, num_heads=4)
    x = torch.randn(3, 10, 16)
    mask = torch.rand(3, 10, 10) > 0.2
    mask[..., 0] = True
    expected, expected_maps = layer(x, mask, return_attention=True)
    out, maps = layer.cuda()(x.cuda(), mask.cuda(), return_attention=True)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(maps.cpu(), expected_maps, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


# ---- additive scores ------------------------------------------------------------------------


def _additive_reference(query_proj, key_proj, weight):
    return (torch.tanh(query_proj[:, :, None, :] + key_proj[:, None, :, :]) * weight).sum(-1)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("batch,len_q,len_k,hidden", [(1, 1, 1, 1), (3, 9, 40, 33),
                                                      (2, 70, 5, 64), (2, 17, 33, 100)])
def test_additive_scores(dtype, batch, len_q, len_k, hidden):
    gen = torch.Generator().manual_seed(len_q * len_k + hidden)
    inputs = [torch.randn(*s, generator=gen).to(dtype).double()
              for s in ((batch, len_q, hidden), (batch, len_k, hidden), (hidden,))]
    ref_inputs = [t.clone().requires_grad_() for t in inputs]
    ref_scores = _additive_reference(*ref_inputs)
    ours = [on_cuda(t, dtype=dtype).requires_grad_() for t in inputs]
    scores = torch.ops.attnlab.additive_scores(*ours)
    grad_scores = torch.randn(ref_scores.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(scores, ours, grad_scores.cuda())
    ref_grads = torch.autograd.grad(ref_scores, ref_inputs, grad_scores.double())
    names = ["scores", "grad of query_proj", "grad of key_proj", "grad of weight"]
    if dtype == torch.float32:
        for name, got, ref in zip(names, (scores, *grads), (ref_scores, *ref_grads)):
            assert_float32_close(got, ref, name)
        return
    plain = [on_cuda(t, dtype=dtype).requires_grad_() for t in inputs]
    plain_scores = _additive_reference(*plain)
    plain_grads = torch.autograd.grad(plain_scores, plain, grad_scores.cuda())
    for name, got, theirs, ref in zip(names, (scores, *grads), (plain_scores, *plain_grads),
                                      (ref_scores, *ref_grads)):
        assert got.dtype == dtype
        assert_no_worse_than_torch(got, theirs, ref, name)


# ---- a small sweep for compute-sanitizer (tests/cuda_sanitizer.sh) ---------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("dim", [3, 40, 100, 200])
def test_small_problems_every_kernel(dtype, dim):
    # Every kernel once per dtype and head-size family, with masks, causal and weights, at sizes
    # small enough for memcheck and racecheck.
    q = torch.randn(2, 19, dim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(1, 37, dim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(2, 37, 5, device="cuda", dtype=dtype, requires_grad=True)
    mask = torch.randn(19, 37, device="cuda", requires_grad=True)
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, True, need_weights=True)
    output.sum().backward()
    output_bool, _ = attnlab.scaled_dot_product_attention(q, k, v, torch.rand(37, device="cuda") > 0.5)
    output_bool.sum().backward()
    torch.ops.attnlab.additive_scores(q, k[0].expand(2, 37, dim), q[0, 0]).sum().backward()
    torch.cuda.synchronize()
    for t in (output, weights, output_bool, q.grad, k.grad, v.grad, mask.grad):
        assert torch.isfinite(t).all()


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "heads_last", "sliced", "column_major"])
def test_small_problems_tensor_core_path(dtype, dim, is_causal, layout):
    # Half precision at D = 64/128 without a mask takes the tensor-core kernels (the
    # FlashAttention-2-style forward and backward) when rows are contiguous and 16-byte aligned
    # (contiguous, heads_last), the generic ones otherwise; lengths cut the 64-row tiles, both
    # ways round for the causal mask. Small enough for the sanitizers.
    for len_q, len_k in [(70, 130), (130, 70)]:
        q, k, v = _half_inputs((2, 3, len_q, dim), (2, 3, len_k, dim), dim, dtype,
                               seed=len_q + dim)
        ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_output, _ = reference.attention(*ref_inputs, is_causal=is_causal)
        ours = [on_cuda(t, layout, dtype).requires_grad_() for t in (q, k, v)]
        output, _ = attnlab.scaled_dot_product_attention(*ours, is_causal=is_causal)
        # The causal mask spelled out: top-left whichever backend torch picks.
        allowed = torch.ones(len_q, len_k, dtype=torch.bool, device="cuda").tril()
        theirs = [on_cuda(t, dtype=dtype).requires_grad_() for t in (q, k, v)]
        torch_output = torch.nn.functional.scaled_dot_product_attention(
            *theirs, attn_mask=allowed if is_causal else None)
        assert output.dtype == dtype and output.shape == ref_output.shape
        assert_no_worse_than_torch(output, torch_output, ref_output, f"output {len_q}x{len_k}")
        grad_output = torch.randn(ref_output.shape,
                                  generator=torch.Generator().manual_seed(len_k)).to(dtype)
        assert_grads_no_worse_than_torch(output, torch_output, ref_output, ours, theirs,
                                         ref_inputs, grad_output, f" {len_q}x{len_k}")


@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_kernels_on_long_sequences_and_broadcast_keys(dtype, is_causal):
    # Many key and query tiles (the copy pipeline's buffers reused many times, dQ summed over 33
    # key blocks by atomics), keys and values shared by the heads (stride 0), and a grad_output
    # with padded rows (a slice, rows still 16-byte aligned, so the flash backward reads it in
    # place): the flash kernels against the reference.
    len_q, len_k, dim = 2050, 2100, 64
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, len_q, dim, generator=gen).to(dtype).double()
    k, v = (torch.randn(1, 1, len_k, dim, generator=gen).to(dtype).double() for _ in range(2))
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_output, _ = reference.attention(*ref_inputs, is_causal=is_causal)
    ours = [on_cuda(t, dtype=dtype).requires_grad_() for t in (q, k, v)]
    theirs = [on_cuda(t, dtype=dtype).requires_grad_() for t in (q, k, v)]
    output, _ = attnlab.scaled_dot_product_attention(ours[0], ours[1].expand(1, 2, len_k, dim),
                                                     ours[2].expand(1, 2, len_k, dim),
                                                     is_causal=is_causal)
    allowed = torch.ones(len_q, len_k, dtype=torch.bool, device="cuda").tril()
    torch_output = torch.nn.functional.scaled_dot_product_attention(
        theirs[0], theirs[1].expand(1, 2, len_k, dim), theirs[2].expand(1, 2, len_k, dim),
        attn_mask=allowed if is_causal else None)
    assert_no_worse_than_torch(output, torch_output, ref_output, "output")
    grad_output = torch.randn(1, 2, len_q, dim, generator=gen).to(dtype)
    padded = torch.zeros(1, 2, len_q, dim + 8, dtype=dtype, device="cuda")
    padded[..., :dim] = grad_output.cuda()
    assert_grads_no_worse_than_torch(output, torch_output, ref_output, ours, theirs, ref_inputs,
                                     padded[..., :dim])


# ---- non-finite values, as on the CPU (tests/python/operator/test_numerical_edge_cases.py) ------------


@requires_gpu
@pytest.mark.parametrize("mask_kind", ["float", "bool"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_minus_inf_mask_hides_a_nonfinite_score(mask_kind, bad):
    # Rows 0-3 of batch entry 0 cannot see key 3, whose scores are NaN or ±inf: they stay finite,
    # and every row matches the float64 CPU operator (checked there against the reference).
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, n, 40, generator=gen) for n in (6, 7, 7))
    k[0, 3, 0] = bad
    allowed = torch.ones(6, 7, dtype=torch.bool)
    allowed[:4, 3] = False
    mask = allowed if mask_kind == "bool" else torch.zeros(6, 7).masked_fill(~allowed, -math.inf)
    output, weights = attnlab.scaled_dot_product_attention(
        *(on_cuda(t) for t in (q, k, v)), mask.cuda(), need_weights=True)
    cpu_output, cpu_weights = attnlab.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), mask if mask_kind == "bool" else mask.double(),
        need_weights=True)
    assert torch.isfinite(output[0, :4]).all() and torch.isfinite(weights[0, :4]).all()
    for ours, cpu, what in ((output, cpu_output, "output"), (weights, cpu_weights, "weights")):
        finite = torch.isfinite(cpu)
        assert torch.equal(torch.isfinite(ours.cpu()), finite), what
        assert_float32_close(ours.cpu()[finite], cpu[finite], what)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "causal"])
@pytest.mark.parametrize("name,index,bad", [("query", (1, 2, 0), math.nan),
                                            ("key", (0, 3, 5), math.nan),
                                            ("value", (1, 4, 2), math.nan),
                                            ("query", (0, 1, 3), math.inf),
                                            ("key", (1, 0, 0), -math.inf)])
def test_nonfinite_inputs_propagate_like_the_reference(dtype, mask_kind, name, index, bad):
    # float16 at D = 64 without a mask runs the tensor-core forward. Non-finite outputs: exactly
    # where the float64 reference has them for a bad query or key; for a bad value, in every
    # row that gives it a positive weight and in no row the reference keeps finite.
    gen = torch.Generator().manual_seed(11)
    inputs = {n: torch.randn(3, length, 64, generator=gen).to(dtype).double()
              for n, length in (("query", 6), ("key", 7), ("value", 7))}
    inputs[name][index] = bad
    mask = torch.rand(6, 7, generator=gen) > 0.4 if mask_kind == "bool" else None
    is_causal = mask_kind == "causal"
    ref_output, ref_weights = reference.attention(**inputs, attn_mask=mask, is_causal=is_causal)
    output, _ = attnlab.scaled_dot_product_attention(
        **{n: on_cuda(t, dtype=dtype) for n, t in inputs.items()},
        attn_mask=None if mask is None else mask.cuda(), is_causal=is_causal)
    ours, theirs = ~torch.isfinite(output.cpu()), ~torch.isfinite(ref_output)
    assert not (ours & ~theirs).any()
    if name == "value":
        sees = ref_weights[index[0], :, index[1]] > 0
        assert ours[index[0], sees, index[2]].all()
    else:
        assert torch.equal(ours, theirs)


# ---- sizes past 32-bit offsets and 16-bit grid dimensions ----------------------------------


def _free_gpu_bytes():
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


@pytest.mark.skipif(_free_gpu_bytes() < 48 * 2**30,
                    reason="needs 48 GiB of free GPU memory for tensors of more than 2^31 elements")
@requires_gpu  # the reason shown first
def test_more_than_two_to_the_31_elements_and_millions_of_blocks():
    # [2^21 + 7, 16, 64] float16: element offsets past 2^31 and 2 million blocks per launch
    # (gridDim.y/z would allow 65535). The last entries are checked against the reference.
    batch, length, dim = 2**21 + 7, 16, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, length, dim, generator=gen, device="cuda",
                           dtype=torch.float16).requires_grad_() for _ in range(3))
    assert q.numel() > 2**31
    output, _ = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True)  # tensor cores
    output.backward(torch.ones_like(output))
    with torch.no_grad():  # the generic forward, which need_weights selects
        generic_output, weights = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                       need_weights=True)
    assert torch.isfinite(output).all() and torch.isfinite(generic_output).all()

    tail = [t[-3:].detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref_output, ref_weights = reference.attention(*tail, is_causal=True)
    ref_output.backward(torch.ones_like(ref_output))
    torch_tail = [t[-3:].detach().clone().requires_grad_() for t in (q, k, v)]
    allowed = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()
    torch_output = torch.nn.functional.scaled_dot_product_attention(*torch_tail, attn_mask=allowed)
    torch_output.backward(torch.ones_like(torch_output))
    torch_weights = (torch_tail[0] @ torch_tail[1].transpose(-2, -1) / math.sqrt(dim)).masked_fill(
        ~allowed, -math.inf).softmax(-1)
    assert_no_worse_than_torch(output[-3:], torch_output, ref_output, "output")
    assert_no_worse_than_torch(generic_output[-3:], torch_output, ref_output, "generic output")
    assert_no_worse_than_torch(weights[-3:], torch_weights, ref_weights, "weights")
    for name, ours, theirs, ref in zip("qkv", (q, k, v), torch_tail, tail):
        assert_no_worse_than_torch(ours.grad[-3:], theirs.grad, ref.grad, f"grad of {name}")
