"""Property-based comparison (hypothesis) of the CUDA attention operator with float64 references.

The cases are test_properties' (lengths 1 to 600, L_q ≠ L_k, E_v ≠ E, up to three leading batch
dimensions that broadcast, boolean and float masks with -inf entries broadcast along any
dimension, causal, scales in [-3, 3], transposed, sliced, row-strided and expanded inputs),
with head sizes up to 256 (every kernel family: 32, 64, 128, 256 and the sizes around them).
Each input is rebuilt on the GPU with the same strides and storage offset as on the CPU, so the
kernels read the same non-contiguous layouts. need_weights is drawn; gradients of query, key,
value and a float mask are compared too.

- float32: the CUDA operator against the float64 reference is at most 1e-5 (relative to the
  largest reference entry, at least 1) plus twice the CPU float32 operator's own error.
- float16 / bfloat16: the CUDA operator against the float64 reference (tests/python/
  reference.py: plain torch ops with the case's mask, causal flag and scale, on the inputs
  rounded to the dtype) is no worse than twice torch's own error at that precision against the
  same reference (F.scaled_dot_product_attention in that dtype on the GPU for outputs and
  gradients, matmul → softmax in that dtype for the weights). At least a third of these cases
  meet the FlashAttention-2-style kernels' conditions (flash_eligible: head size 64 or 128 for
  query, key and value, no attn_mask, unit column stride and 16-byte-aligned rows, as
  cpp/src/cuda/ops.cpp dispatches): the strategy draws such shapes on purpose (with a mask or
  weights now and then, which take the generic kernels), and a test without a GPU counts them.

2,000 examples in the default run (ATTNLAB_CUDA_FUZZ_EXAMPLES changes that; 3/5 float32, 2/5
half precision), 10 times as many in the `slow` run. With ATTNLAB_CUDA_FLASH_WEIGHTS=1 (the
flash forward writes the weights) the flash-shaped cases ask for weights half of the time. For
a run that may crash the process: ATTNLAB_CUDA_FUZZ_TRACE=FILE rewrites FILE with each case
(shapes, strides, dtypes, flags) before it runs, and ATTNLAB_CUDA_FUZZ_NO_SHRINK=1 reports the
first failing case as drawn, without shrinking it. Without a GPU those tests skip ("no CUDA
device"); the same checks then run a few derandomized examples on the CPU (the CPU float32
operator standing in for the kernels, its results rounded for half precision), so the
generators and comparisons stay exercised.
"""

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import attnlab
import reference
from test_properties import Case, attention_cases, largest, lay_out, lengths, upstream_gradient

HALF_DTYPES = [torch.float16, torch.bfloat16]
FLOAT32_TOLERANCE = 1e-5
HALF_SLACK = 1e-5  # an absolute floor, far below half precision's rounding (≥ 4.9e-4)
EXAMPLES = int(os.environ.get("ATTNLAB_CUDA_FUZZ_EXAMPLES", "2000"))
FLOAT32_EXAMPLES = max(1, EXAMPLES * 3 // 5)
HALF_EXAMPLES = max(1, EXAMPLES - FLOAT32_EXAMPLES)
SLOW_FACTOR = 10
CPU_EXAMPLES = 12  # per test, without a GPU

# Head sizes around every kernel family's edge, drawn half of the time; else any of 1..256.
HEAD_SIZES = (1, 7, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 200, 255, 256)
cuda_cases = attention_cases(dtypes=(torch.float32,), head_sizes=HEAD_SIZES, max_dim=256,
                             max_dim_v=256)

# The flash kernels' dispatch conditions, as cpp/src/cuda/ops.cpp reads them.
FLASH_HEAD_SIZES = (64, 128)
FLASH_VECTOR = 8  # half-precision elements in 16 bytes
FLASH_WEIGHTS = os.environ.get("ATTNLAB_CUDA_FLASH_WEIGHTS") == "1"

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
on_cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="the GPU runs the full property tests instead")


TRACE = os.environ.get("ATTNLAB_CUDA_FUZZ_TRACE")
if os.environ.get("ATTNLAB_CUDA_FUZZ_NO_SHRINK") == "1":
    NO_SHRINK = {"phases": [Phase.explicit, Phase.reuse, Phase.generate]}
else:
    NO_SHRINK = {}


def fuzz(strategy, examples, **extra):
    """The settings every property here shares."""
    extra = {**NO_SHRINK, **extra}

    def decorate(check):
        return settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow,
                                               HealthCheck.data_too_large], **extra)(
            given(strategy)(check))
    return decorate


# ---- helpers --------------------------------------------------------------------------------


def describe(case, need_weights, dtype):
    """One line per input: what a crashed run's trace file shows of the case it was in."""
    lines = [f"dtype {dtype}, need_weights {need_weights}, is_causal {case.is_causal}, "
             f"scale {case.scale}, seed {case.seed}"]
    for name in ("query", "key", "value", "attn_mask"):
        t = getattr(case, name)
        lines.append(f"{name}: None" if t is None else
                     f"{name}: {t.dtype} shape {list(t.shape)} stride {list(t.stride())} "
                     f"offset {t.storage_offset()}")
    return "\n".join(lines) + "\n"


def trace(case, need_weights, dtype):
    if TRACE:
        Path(TRACE).write_text(describe(case, need_weights, dtype))


def like_on(t, device, dtype=None):
    """t's values on device (as dtype) with t's strides and storage offset; dimensions t
    broadcasts with stride 0 stay broadcast."""
    if t is None:
        return None
    dtype = dtype or t.dtype
    one = t[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in t.stride())]
    if one.numel() == 0:
        return torch.empty(t.shape, device=device, dtype=dtype)
    span = 1 + sum((n - 1) * s for n, s in zip(one.shape, one.stride()))
    buffer = torch.zeros(one.storage_offset() + span, device=device, dtype=dtype)
    out = buffer.as_strided(one.shape, one.stride(), one.storage_offset())
    out.copy_(one)
    return out.expand(t.shape)


def relative_error(result, expected, magnitude=None):
    """Largest absolute error relative to `magnitude` (default: the largest expected entry),
    at least 1."""
    expected = expected.detach().double().cpu()
    if expected.numel() == 0:
        return 0.0
    result = result.detach().double().cpu()
    assert result.shape == expected.shape, \
        f"shape {list(result.shape)}, expected {list(expected.shape)}"
    scale = max(1.0, largest([expected]) if magnitude is None else magnitude)
    return (result - expected).abs().max().item() / scale


def blocked_rows(ref_weights, batch_shape):
    """[*batch, L_q]: True where the reference's weights are all zero (every key masked)."""
    weights = ref_weights.expand(*batch_shape, *ref_weights.shape[-2:])
    return weights.sum(-1) == 0


def with_grad(tensors):
    return [None if t is None else t.detach().requires_grad_() for t in tensors]


def differentiable_mask(mask):
    return mask is not None and mask.is_floating_point()


def operator_run(query, key, value, mask, is_causal, scale, need_weights, grad_output):
    """attnlab's output, weights and gradients (query, key, value, and a float mask's)."""
    q, k, v = with_grad([query, key, value])
    m = with_grad([mask])[0] if differentiable_mask(mask) else mask
    output, weights = attnlab.scaled_dot_product_attention(q, k, v, m, is_causal, scale,
                                                           need_weights=need_weights)
    inputs = [q, k, v] + ([m] if differentiable_mask(mask) else [])
    grads = torch.autograd.grad(output, inputs, grad_output.to(output.device, output.dtype))
    return output, weights, grads


def upstream(case, query, key, value, mask, dtype=torch.float32):
    """The upstream gradient at the output's shape (the batch dimensions of query, key, value
    and the mask broadcast), drawn from the case's seed and rounded to dtype."""
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2],
                                   () if mask is None else mask.shape[:-2])
    like = torch.empty(*batch, query.shape[-2], value.shape[-1])
    return upstream_gradient(like, case.seed).to(dtype)


def reference_run(query, key, value, mask, is_causal, scale, grad_output):
    """The float64 reference's output, weights and gradients."""
    q, k, v = (t.detach().double().requires_grad_() for t in (query, key, value))
    m = mask.detach().double().requires_grad_() if differentiable_mask(mask) else mask
    output, weights = reference.attention(q, k, v, m, is_causal, scale)
    inputs = [q, k, v] + ([m] if differentiable_mask(mask) else [])
    grads = torch.autograd.grad(output, inputs, grad_output.double())
    return output.detach(), weights.detach(), grads


GRAD_NAMES = ["query", "key", "value", "attn_mask"]


# ---- float32: CUDA against the CPU operator --------------------------------------------------


def check_float32(case, need_weights, device):
    trace(case, need_weights, torch.float32)
    grad_output = upstream(case, case.query, case.key, case.value, case.attn_mask)
    args = (case.attn_mask, case.is_causal, case.scale)
    gpu = [like_on(t, device) for t in (case.query, case.key, case.value, case.attn_mask)]
    out, weights, grads = operator_run(*gpu[:3], gpu[3], *args[1:], need_weights, grad_output)
    cpu_out, cpu_weights, cpu_grads = operator_run(case.query, case.key, case.value, *args,
                                                   need_weights, grad_output)
    ref_out, ref_weights, ref_grads = reference_run(case.query, case.key, case.value, *args,
                                                    grad_output)

    assert out.device.type == torch.device(device).type and out.dtype == torch.float32
    assert out.shape == ref_out.shape

    def compare(what, ours, cpu, ref, magnitude=None):
        err, cpu_err = (relative_error(t, ref, magnitude) for t in (ours, cpu))
        assert err <= FLOAT32_TOLERANCE + 2 * cpu_err, \
            f"{what}: CUDA error {err:.2e}, CPU float32 error {cpu_err:.2e}"

    compare("output", out, cpu_out, ref_out)
    blocked = blocked_rows(ref_weights, out.shape[:-2])
    assert not out.detach().cpu()[blocked].any(), "rows with every key masked must be zero"
    if need_weights:
        assert weights.shape == (*out.shape[:-1], case.key.shape[-2])
        compare("weights", weights, cpu_weights, ref_weights.expand(weights.shape))
    else:
        assert weights is None
    # A saturated softmax gives a key gradient near 0 made of cancelling terms as large as the
    # other gradients: errors are relative to the largest gradient.
    magnitude = largest(ref_grads)
    for name, grad, cpu_grad, ref_grad in zip(GRAD_NAMES, grads, cpu_grads, ref_grads):
        assert grad.shape == ref_grad.shape, name
        compare(f"gradient of {name}", grad, cpu_grad, ref_grad, magnitude)


@requires_gpu
@fuzz(st.tuples(cuda_cases, st.booleans()), FLOAT32_EXAMPLES)
def test_float32_cuda_matches_cpu_operator(drawn):
    check_float32(*drawn, "cuda")


@requires_gpu
@pytest.mark.slow
@fuzz(st.tuples(cuda_cases, st.booleans()), FLOAT32_EXAMPLES * SLOW_FACTOR)
def test_float32_cuda_matches_cpu_operator_slow(drawn):
    check_float32(*drawn, "cuda")


@on_cpu_only
@fuzz(st.tuples(cuda_cases, st.booleans()), CPU_EXAMPLES, derandomize=True)
def test_float32_checks_run_on_cpu(drawn):
    check_float32(*drawn, "cpu")


def saturated_case(seed):
    """The shape of a case the GPU fuzz run found (H200, 2026-11-27): one query over two keys
    (per batch entry, the keys shared), head size 164, scale 2, so that the scores are tens
    apart and the softmax sits on one key. A backward that recomputes the probabilities as
    exp(s − lse) from a float32 log-sum-exp left up to 2.7e-5 (relative) in dQ for these
    seeds (seeds 0 and 2 above 1e-5, in a float32 model of the kernel's arithmetic)."""
    draw = torch.Generator().manual_seed(seed)
    return Case(torch.randn(2, 1, 164, generator=draw), torch.randn(2, 164, generator=draw),
                torch.randn(2, 2, 164, generator=draw), None, False, 2.0, seed)


@requires_gpu
@pytest.mark.parametrize("seed", range(10))
def test_float32_saturated_softmax_gradients(seed):
    check_float32(saturated_case(seed), False, "cuda")


@on_cpu_only
@pytest.mark.parametrize("seed", range(3))
def test_float32_saturated_softmax_checks_run_on_cpu(seed):
    check_float32(saturated_case(seed), False, "cpu")


# ---- float16 / bfloat16: CUDA against the CPU operator, bounded by torch's own error ---------


def torch_baseline(q, k, v, mask, is_causal, scale, blocked, grad_output):
    """torch's F.scaled_dot_product_attention at the inputs' precision, as a user would call
    it: every input broadcast to the full batch shape and flattened to [N, 1, L, E], the causal
    mask folded into attn_mask (torch takes one or the other). Rows with every key masked
    (NaN in torch) attend everywhere instead and get a zero upstream gradient, so that they
    neither count nor spread NaN into the key and value gradients. Returns the output and the
    gradients of q, k, v and a float mask."""
    batch = blocked.shape[:-1]
    len_q, len_k = q.shape[-2], k.shape[-2]
    leaves = with_grad([q, k, v]) + ([with_grad([mask])[0]] if differentiable_mask(mask) else [])

    def flat(t, rows, cols):
        return t.expand(*batch, rows, cols).reshape(-1, 1, rows, cols)

    allowed = torch.ones(len_q, len_k, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    open_rows = blocked[..., None].to(q.device)
    if mask is None or mask.dtype == torch.bool:
        combined = allowed if mask is None else mask & allowed
        combined = combined.expand(*batch, len_q, len_k) | open_rows
    else:
        combined = leaves[3].masked_fill(~allowed, -math.inf).expand(*batch, len_q, len_k)
        combined = torch.where(open_rows, torch.zeros((), dtype=combined.dtype,
                                                      device=q.device), combined)
    grad = grad_output.to(q.device).masked_fill(open_rows, 0)

    def run():
        output = F.scaled_dot_product_attention(
            flat(leaves[0], len_q, q.shape[-1]), flat(leaves[1], len_k, k.shape[-1]),
            flat(leaves[2], len_k, v.shape[-1]), attn_mask=flat(combined, len_q, len_k),
            scale=scale).reshape(*batch, len_q, v.shape[-1])
        return output.detach(), torch.autograd.grad(output, leaves, grad)

    result = run()
    if not all(t.isfinite().all() for t in (result[0], *result[1])):
        # No error bar from a NaN. torch 2.11's default backend on an H200 returned NaN query
        # gradients at scale=0 (one query over two keys, float16), where every value is finite;
        # then torch's math backend, at the same precision, sets the bar.
        with sdpa_kernel(SDPBackend.MATH):
            result = run()
    return result


def plain_weights(q, k, mask, is_causal, scale):
    """matmul → softmax at the inputs' precision (the weights torch users compute)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.nan_to_num(scores.softmax(-1), nan=0.0)


def check_half(case, need_weights, dtype, device):
    trace(case, need_weights, dtype)
    # Every implementation sees the same values: the inputs (and a float mask) rounded to dtype.
    def rounded(t):
        return None if t is None or t.dtype == torch.bool else t.to(dtype).to(t.dtype)
    query, key, value = (rounded(t) for t in (case.query, case.key, case.value))
    mask = case.attn_mask if case.attn_mask is None or case.attn_mask.dtype == torch.bool \
        else rounded(case.attn_mask)
    grad_output = upstream(case, query, key, value, mask, dtype)
    ref_out, ref_weights, ref_grads = reference_run(query, key, value, mask, case.is_causal,
                                                    case.scale, grad_output)

    if device == "cpu":  # the CPU float32 operator, rounded, stands in for the kernels
        cpu_out, weights, cpu_grads = operator_run(query, key, value, mask, case.is_causal,
                                                   case.scale, need_weights, grad_output.float())
        out = cpu_out.to(dtype)
        weights = None if weights is None else weights.to(dtype)
        grads = [g.to(dtype if i < 3 else g.dtype) for i, g in enumerate(cpu_grads)]
    else:
        gpu_mask = None if mask is None else like_on(mask, device)
        out, weights, grads = operator_run(
            *(like_on(t, device, dtype) for t in (case.query, case.key, case.value)),
            gpu_mask, case.is_causal, case.scale, need_weights, grad_output)
        assert out.is_cuda

    assert out.dtype == dtype and out.shape == ref_out.shape
    blocked = blocked_rows(ref_weights, ref_out.shape[:-2])
    on_device = [t.to(device, dtype) for t in (query, key, value)]
    torch_mask = None if mask is None else mask.to(device, dtype if mask.is_floating_point()
                                                   else torch.bool)
    torch_out, torch_grads = torch_baseline(*on_device, torch_mask, case.is_causal, case.scale,
                                            blocked, grad_output.to(device))

    def compare(what, ours, theirs, ref, magnitude=None):
        err = relative_error(ours, ref, magnitude)
        torch_err = relative_error(theirs, ref, magnitude)
        assert err <= 2 * torch_err + HALF_SLACK, \
            f"{what} ({dtype}): error {err:.2e} against the float64 reference, " \
            f"torch's {torch_err:.2e}"

    compare("output", out, torch_out.cpu().masked_fill(blocked[..., None], 0), ref_out)
    assert not out.detach().cpu()[blocked].any(), "rows with every key masked must be zero"
    if need_weights:
        assert weights.dtype == dtype and weights.shape == (*out.shape[:-1], key.shape[-2])
        theirs = plain_weights(on_device[0], on_device[1], torch_mask, case.is_causal,
                               case.scale)
        compare("weights", weights, theirs.expand(weights.shape),
                ref_weights.expand(weights.shape))
    magnitude = largest(ref_grads)
    for name, grad, torch_grad, ref_grad in zip(GRAD_NAMES, grads, torch_grads, ref_grads):
        assert grad.shape == ref_grad.shape, name
        compare(f"gradient of {name}", grad, torch_grad, ref_grad, magnitude)


# ---- the flash kernels' conditions, and cases drawn to meet them ------------------------------


def aligned_rows(t, batch):
    """Whether t, broadcast to the batch shape `batch`, has the layout the flash kernels read:
    unit column stride, rows and batch strides in whole 16-byte vectors, and a 16-byte-aligned
    start (like_on puts the storage offset past a fresh allocation, which is aligned). The
    batch dimensions of size 1 are dropped before the check, as BatchIndexer does."""
    e = t.expand(*batch, *t.shape[-2:])
    if e.stride(-1) != 1 or e.stride(-2) % FLASH_VECTOR or e.storage_offset() % FLASH_VECTOR:
        return False
    return all(e.stride(d) % FLASH_VECTOR == 0 for d, size in enumerate(batch) if size > 1)


def flash_eligible(case, need_weights, dtype, flash_weights=None):
    """Whether the CUDA forward of this case runs the FlashAttention-2-style kernel
    (cpp/src/cuda/ops.cpp, tensor_core_kernels_apply): float16 or bfloat16, query, key and value
    of head size 64 or 128 alike, no attn_mask (causal is fine), no weights unless the flash
    forward writes them (flash_weights; default ATTNLAB_CUDA_FLASH_WEIGHTS=1), and rows laid
    out as aligned_rows says. The backward's condition is the same with need_weights False (its
    upstream gradient is contiguous here)."""
    flash_weights = FLASH_WEIGHTS if flash_weights is None else flash_weights
    if dtype not in HALF_DTYPES or case.attn_mask is not None:
        return False
    if need_weights and not flash_weights:
        return False
    dims = {case.query.shape[-1], case.key.shape[-1], case.value.shape[-1]}
    if len(dims) != 1 or dims.pop() not in FLASH_HEAD_SIZES:
        return False
    batch = torch.broadcast_shapes(case.query.shape[:-2], case.key.shape[:-2],
                                   case.value.shape[:-2])
    return all(aligned_rows(t, batch) for t in (case.query, case.key, case.value))


# "One time in six" is drawn as integers(0, 5) == RARE, a middle value: hypothesis draws the
# bounds of a range (and 0, where shrinking goes) more often than the values between them.
RARE = 3

# Layouts of test_properties that keep rows aligned at head size 64 and 128 ("sliced" starts
# 2 elements in, "column_major" has a column stride of L).
ALIGNED_LAYOUTS = ("contiguous", "heads_transposed", "strided_rows", "expanded")


@st.composite
def flash_shaped_cases(draw):
    """A Case with the flash kernels' shapes and layouts: head size 64 or 128 for query, key and
    value, aligned layouts, test_properties' lengths (1 to 600: across the 64-row tiles) and
    broadcast batch dimensions, causal or not, any scale; one case in six has a boolean or float
    mask, which sends it to the generic kernels at the same shapes."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    len_q, len_k = draw(lengths()), draw(lengths())
    if math.prod(batch) * len_q * len_k > 20_000:  # keep one example's float64 reference cheap
        batch = (1,) * min(len(batch), 1)
    dim = draw(st.sampled_from(FLASH_HEAD_SIZES))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = torch.Generator().manual_seed(seed)

    def input_batch():
        dims = batch[draw(st.integers(0, len(batch))):] if draw(st.booleans()) else batch
        return tuple(1 if draw(st.integers(0, 4)) == 0 else d for d in dims)

    def make(*shape):
        t = torch.randn(*shape, generator=gen)
        return lay_out(t, draw(st.sampled_from(ALIGNED_LAYOUTS)), batch)

    query = make(*input_batch(), len_q, dim)
    key = make(*input_batch(), len_k, dim)
    value = make(*input_batch(), len_k, dim)
    mask = None
    if draw(st.integers(0, 5)) == RARE:
        full = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        shape = [*full, len_q, len_k][draw(st.integers(0, len(full))):]
        if draw(st.booleans()):
            mask = torch.rand(*shape, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.9]))
        else:
            mask = torch.randn(*shape, generator=gen)
            mask = mask.masked_fill(torch.rand(*shape, generator=gen) > 0.9, float("-inf"))
    scale = draw(st.one_of(st.none(), st.floats(-3.0, 3.0, allow_nan=False)))
    return Case(query, key, value, mask, draw(st.booleans()), scale, seed)


@st.composite
def half_cases(draw):
    """(case, need_weights, dtype): three draws in five flash-shaped (weights one time in six,
    or half of the time where the flash forward writes them), the others any case of cuda_cases."""
    if draw(st.integers(0, 4)) < 3:
        case = draw(flash_shaped_cases())
        need_weights = draw(st.booleans()) if FLASH_WEIGHTS else draw(st.integers(0, 5)) == RARE
    else:
        case, need_weights = draw(cuda_cases), draw(st.booleans())
    return case, need_weights, draw(st.sampled_from(HALF_DTYPES))


@requires_gpu
@fuzz(half_cases(), HALF_EXAMPLES)
def test_half_precision_cuda_within_twice_torchs_error(drawn):
    check_half(*drawn, "cuda")


@requires_gpu
@pytest.mark.slow
@fuzz(half_cases(), HALF_EXAMPLES * SLOW_FACTOR)
def test_half_precision_cuda_within_twice_torchs_error_slow(drawn):
    check_half(*drawn, "cuda")


@on_cpu_only
@fuzz(half_cases(), CPU_EXAMPLES, derandomize=True)
def test_half_precision_checks_run_on_cpu(drawn):
    check_half(*drawn, "cpu")


FLASH_FRACTION_DRAWS = 300


def test_at_least_a_third_of_the_half_precision_cases_meet_the_flash_conditions():
    # Runs without a GPU: the strategy alone, derandomized, as the fuzz run draws from it (with
    # the weights switch as set here); flash_eligible is the predicate that test uses too.
    seen = []

    @settings(max_examples=FLASH_FRACTION_DRAWS, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(half_cases())
    def draw(drawn):
        case, need_weights, dtype = drawn
        seen.append((flash_eligible(case, need_weights, dtype),
                     case.query.shape[-1] in FLASH_HEAD_SIZES and case.attn_mask is not None))

    draw()
    eligible = sum(flag for flag, _ in seen)
    print(f"{eligible} of {len(seen)} drawn half-precision cases meet the flash conditions")
    assert len(seen) >= FLASH_FRACTION_DRAWS * 0.9, f"only {len(seen)} cases drawn"
    assert eligible >= len(seen) / 3, f"{eligible} of {len(seen)} cases meet the flash conditions"
    assert any(masked for _, masked in seen), "no masked case at the flash head sizes"


def test_flash_eligible_follows_the_dispatch_conditions():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 20, 64, generator=gen) for _ in range(3))
    base = Case(q, k, v, None, True, None, 0)
    assert flash_eligible(base, False, torch.float16, flash_weights=False)
    assert flash_eligible(base, False, torch.bfloat16, flash_weights=False)
    assert not flash_eligible(base, False, torch.float32, flash_weights=False)
    assert not flash_eligible(base, True, torch.float16, flash_weights=False)
    assert flash_eligible(base, True, torch.float16, flash_weights=True)
    assert not flash_eligible(Case(q, k, v, torch.ones(20, 20, dtype=torch.bool), False, None, 0),
                              False, torch.float16, flash_weights=False)
    assert not flash_eligible(Case(q, k, v[..., :32], None, False, None, 0), False,
                              torch.float16, flash_weights=False)
    assert not flash_eligible(Case(q[..., :48], k[..., :48], v[..., :48], None, False, None, 0),
                              False, torch.float16, flash_weights=False)
    batch = (2, 3)
    for layout, aligned in [("contiguous", True), ("heads_transposed", True),
                            ("strided_rows", True), ("expanded", True), ("sliced", False),
                            ("column_major", False)]:
        laid = lay_out(q, layout, batch)
        assert flash_eligible(Case(laid, k, v, None, False, None, 0), False, torch.float16,
                              flash_weights=False) is aligned, layout
    # A batch dimension of size 1 broadcast against 3 reads with stride 0; one of size 3 with
    # an odd stride does not align.
    assert flash_eligible(Case(q[:, :1], k, v, None, False, None, 0), False, torch.float16,
                          flash_weights=False)
    odd = torch.randn(2, 3 * 20 * 64 + 4)[:, :3 * 20 * 64].reshape(2, 3, 20, 64)
    assert odd.stride(0) % FLASH_VECTOR == 4 and not flash_eligible(
        Case(odd, k, v, None, False, None, 0), False, torch.float16, flash_weights=False)


def shrunk_flash_case():
    """The half-precision property's failure shrunk on an NVIDIA H200 (CUDA code of commit
    a9c2fc3 with the generic backward's fix of c6521cc): one query over three keys, head size
    128, scale -1.5, float16, no mask; the query gradient was 6.7e-4 off where torch's was
    2.2e-4. It meets the flash conditions: the flash backward's dQ."""
    gen = torch.Generator().manual_seed(0)
    return Case(torch.randn(1, 128, generator=gen), torch.randn(3, 128, generator=gen),
                torch.randn(3, 128, generator=gen), None, False, -1.5, 0)


def test_the_shrunk_case_meets_the_flash_conditions():
    assert flash_eligible(shrunk_flash_case(), False, torch.float16, flash_weights=False)


@requires_gpu
def test_half_precision_shrunk_flash_case():
    check_half(shrunk_flash_case(), False, torch.float16, "cuda")


@on_cpu_only
def test_half_precision_shrunk_flash_case_checks_run_on_cpu():
    check_half(shrunk_flash_case(), False, torch.float16, "cpu")


def kernels_run(run):
    """The names of the CUDA kernels that run() launches, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return {event.name for event in prof.events()}


@requires_gpu
@fuzz(half_cases(), 30, derandomize=True)
def test_flash_eligible_cases_run_the_flash_kernels(drawn):
    # The predicate the strategy is built on, checked against the kernels the GPU runs.
    case, need_weights, dtype = drawn
    grad_output = upstream(case, case.query, case.key, case.value, case.attn_mask, dtype)
    inputs = with_grad([like_on(t, "cuda", dtype) for t in (case.query, case.key, case.value)])
    mask = None if case.attn_mask is None else like_on(case.attn_mask, "cuda")
    result = {}

    def forward():
        result["out"] = attnlab.scaled_dot_product_attention(
            *inputs, mask, case.is_causal, case.scale, need_weights=need_weights)[0]

    def backward():
        torch.autograd.grad(result["out"], inputs, grad_output.to("cuda", dtype))

    launched = kernels_run(forward)
    assert any("attnlab" in name for name in launched), \
        f"the profiler saw no attnlab kernel: {sorted(launched)}"
    assert any("sdpa_flash_forward_kernel" in name for name in launched) == \
        flash_eligible(case, need_weights, dtype), sorted(launched)
    if not need_weights:  # (with weights the backward's route is not the question here)
        launched = kernels_run(backward)
        assert any("sdpa_flash_backward_kernel" in name for name in launched) == \
            flash_eligible(case, False, dtype), sorted(launched)


# ---- the helpers themselves ------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda t: t,
    lambda t: t.transpose(-2, -1),
    lambda t: t[..., 1:4],
    lambda t: t[:, ::2],
    lambda t: t[:1].expand(3, 4, 5),
    lambda t: t[:, :0],
], ids=["contiguous", "transposed", "sliced", "strided", "expanded", "empty"])
def test_like_on_keeps_values_strides_and_offset(make):
    t = make(torch.randn(3, 4, 5))
    copy = like_on(t, "cpu", torch.float64)
    assert copy.dtype == torch.float64 and torch.equal(copy, t.double())
    if t.numel():
        assert copy.stride() == t.stride() and copy.storage_offset() == t.storage_offset()
        assert copy.data_ptr() != t.data_ptr()


def test_relative_error_is_scaled_by_the_largest_entry_at_least_one():
    expected = torch.tensor([4.0, -2.0])
    assert relative_error(torch.tensor([4.0, -1.0]), expected) == 0.25
    assert relative_error(torch.tensor([0.1, 0.0]), torch.tensor([0.2, 0.0])) == pytest.approx(0.1)
    assert relative_error(torch.tensor([4.0, -1.0]), expected, magnitude=10.0) == 0.1
