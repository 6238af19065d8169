"""float16 and bfloat16 on the CPU: the operator, its gradients, the modules and the fused encoder
block accept them, compute in float32 (bfloat16's blocked products on bfloat16 operands, as torch's
own kernel does, where the CPU's bfloat16 dot products outrun its float32 FMAs), and are no less accurate than torch's own SDPA
at the same dtype (error against a float64 reference of the same rounded inputs at most 2x
torch's)."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.nn import EncoderBlock, MultiheadAttention
from cpuinfo import cpu_flags
from reference import attention as reference_attention

DTYPES = [torch.float16, torch.bfloat16]
EPS = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}

CASES = {
    "plain": dict(shape=(3, 2, 17, 16), mask=None, causal=False),
    "causal": dict(shape=(2, 3, 33, 32), mask=None, causal=True),
    "bool mask": dict(shape=(2, 2, 9, 8), mask="bool", causal=False),
    "float mask": dict(shape=(2, 2, 12, 24), mask="float", causal=False),
    "long keys": dict(shape=(1, 2, 7, 64), mask=None, causal=False, len_k=600),
    "tutorial shape": dict(shape=(128, 1, 16, 32), mask=None, causal=True),
}


def _inputs(case, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H, L, E = case["shape"]
    Lk = case.get("len_k", L)
    q = torch.randn(B, H, L, E, generator=gen).to(dtype)
    k = torch.randn(B, H, Lk, E, generator=gen).to(dtype)
    v = torch.randn(B, H, Lk, E, generator=gen).to(dtype)
    mask = None
    if case["mask"] == "bool":
        mask = torch.rand(L, Lk, generator=gen) > 0.3
        mask[:, 0] = True
    elif case["mask"] == "float":
        mask = (torch.randn(B, 1, L, Lk, generator=gen) * 2).to(dtype)
    return q, k, v, mask


def _max_err(x, ref):
    return (x.double() - ref).abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_at_most_twice_torch_error(name, dtype):
    case = CASES[name]
    q, k, v, mask = _inputs(case, dtype)
    ref, _ = reference_attention(q, k, v, mask, case["causal"])
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, case["causal"])
    theirs = F.scaled_dot_product_attention(q, k, v, mask, is_causal=case["causal"])
    assert out.dtype == dtype and out.shape == ref.shape
    assert weights is None
    ours_err, torch_err = _max_err(out, ref), _max_err(theirs, ref)
    assert ours_err <= 2 * torch_err, (ours_err, torch_err)
    # float32 sums (and for bfloat16 at most the probabilities rounded in P·V): within an ulp of
    # the largest output.
    assert ours_err <= EPS[dtype] * ref.abs().max().item(), ours_err


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["plain", "causal", "float mask"])
def test_weights_are_the_rounded_probabilities(name, dtype):
    case = CASES[name]
    q, k, v, mask = _inputs(case, dtype)
    _, ref_w = reference_attention(q, k, v, mask, case["causal"])
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, case["causal"],
                                                        need_weights=True)
    assert weights.dtype == dtype and weights.shape == ref_w.shape
    # Relative rounding, and float16's subnormal spacing for the tiniest probabilities.
    tiny = 2.0 ** -24 if dtype == torch.float16 else 0.0
    torch.testing.assert_close(weights.double(), ref_w, atol=tiny, rtol=EPS[dtype])
    # The same float32 result as without weights, up to the last rounding.
    plain_out, _ = attnlab.scaled_dot_product_attention(q, k, v, mask, case["causal"])
    torch.testing.assert_close(out.float(), plain_out.float(), rtol=2 * EPS[dtype],
                               atol=2 * EPS[dtype])
    if case["causal"]:
        hidden = ~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        assert (weights[..., hidden] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["plain", "causal", "float mask", "long keys"])
def test_gradients_at_most_twice_torch_error(name, dtype):
    case = CASES[name]
    q, k, v, mask = _inputs(case, dtype)
    if mask is not None:
        mask = mask.requires_grad_()
    grad_out = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(1))

    def grads(fn, *inputs):
        inputs = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
        out = fn(*inputs)
        leaves = [t for t in inputs if t is not None]
        return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))

    ref = grads(lambda *a: reference_attention(*a, is_causal=case["causal"])[0], q, k, v, mask)
    ours = grads(lambda *a: attnlab.scaled_dot_product_attention(*a, is_causal=case["causal"])[0],
                 q, k, v, mask)
    theirs = grads(lambda *a: F.scaled_dot_product_attention(*a, is_causal=case["causal"]),
                   q, k, v, mask)
    for label, mine, other, exact in zip("qkvm", ours, theirs, ref):
        assert mine.dtype == dtype, label
        ours_err, torch_err = _max_err(mine, exact), _max_err(other, exact)
        assert ours_err <= 2 * torch_err + EPS[dtype] * exact.abs().max().item() / 2, \
            (label, ours_err, torch_err)


# The blocked kernel's shapes (more than 16 keys, several query and key blocks, ragged ends), where
# bfloat16 inputs run their products on bfloat16 operands (AVX512-BF16) like torch's kernel.
BLOCKED = {
    "64 keys": dict(shape=(2, 2, 64, 64), mask=None, causal=False),
    "ragged 300 causal": dict(shape=(1, 2, 300, 64), mask=None, causal=True),
    # an odd length: causal row groups that end on an odd number of keys (their last key's
    # product added on its own, where bfloat16 products pair keys)
    "ragged 301 causal, odd head size": dict(shape=(2, 1, 301, 33), mask=None, causal=True),
    "ragged 300 bool mask": dict(shape=(2, 1, 300, 64), mask="bool", causal=False),
    "ragged 300 float mask": dict(shape=(1, 2, 300, 32), mask="float", causal=False),
    "several key blocks": dict(shape=(1, 1, 1100, 64), mask=None, causal=False),
    "several key blocks causal": dict(shape=(1, 1, 1100, 64), mask=None, causal=True),
}


def _grads(fn, inputs, grad_out):
    """fn's output and its gradients with respect to the floating-point inputs."""
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None
              for t in inputs]
    out = fn(*inputs)
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    return [out.detach()] + list(torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BLOCKED))
def test_blocked_forward_and_gradients_at_most_twice_torch_error(name, dtype):
    case = BLOCKED[name]
    q, k, v, mask = _inputs(case, dtype, seed=2)
    if mask is not None and mask.is_floating_point():
        mask = mask.requires_grad_()
    causal = case["causal"]
    grad_out = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(3))
    ref = _grads(lambda *a: reference_attention(*a, is_causal=causal)[0], (q, k, v, mask), grad_out)
    ours = _grads(lambda *a: attnlab.scaled_dot_product_attention(*a, is_causal=causal)[0],
                  (q, k, v, mask), grad_out)
    theirs = _grads(lambda *a: F.scaled_dot_product_attention(*a, is_causal=causal),
                    (q, k, v, mask), grad_out)
    for label, mine, other, exact in zip(["out", "q", "k", "v", "mask"], ours, theirs, ref):
        assert mine.dtype == dtype and mine.shape == exact.shape, label
        assert torch.isfinite(mine).all(), label
        ours_err, torch_err = _max_err(mine, exact), _max_err(other, exact)
        # torch's error, doubled, is the bound; a quarter ulp of the largest value absorbs the
        # cases where torch happens to land within a rounding of the exact values.
        assert ours_err <= 2 * torch_err + EPS[dtype] * exact.abs().max().item() / 4, \
            (label, ours_err, torch_err)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["64 keys", "ragged 300 causal", "ragged 300 float mask",
                                  "several key blocks"])
def test_blocked_weights_and_the_backward_that_reuses_them(name, dtype):
    case = BLOCKED[name]
    q, k, v, mask = _inputs(case, dtype, seed=4)
    causal = case["causal"]
    _, ref_w = reference_attention(q, k, v, mask, causal)
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, causal, need_weights=True)
    # The scores' products are exact in float32 (bfloat16 operands): the weights are the float64
    # probabilities up to the final rounding (and float16's subnormal spacing for the tiniest).
    tiny = 2.0 ** -24 if dtype == torch.float16 else 0.0
    torch.testing.assert_close(weights.double(), ref_w, atol=tiny, rtol=EPS[dtype])
    # The backward reuses the kept weights as P: its gradients against float64, bounded by
    # torch's at the same dtype as above.
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    ours = _grads(lambda *a: attnlab.scaled_dot_product_attention(*a, mask, causal,
                                                                  need_weights=True)[0],
                  (q, k, v), grad_out)
    ref = _grads(lambda *a: reference_attention(*a, mask, causal)[0], (q, k, v), grad_out)
    theirs = _grads(lambda *a: F.scaled_dot_product_attention(*a, mask, is_causal=causal),
                    (q, k, v), grad_out)
    for label, mine, other, exact in zip(["out", "q", "k", "v"], ours, theirs, ref):
        assert mine.dtype == dtype, label
        ours_err, torch_err = _max_err(mine, exact), _max_err(other, exact)
        assert ours_err <= 2 * torch_err + EPS[dtype] * exact.abs().max().item() / 4, \
            (label, ours_err, torch_err)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32], ids=str)
@pytest.mark.parametrize("need_weights", [False, True], ids=["output", "weights"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_blocked_large_scores_keep_their_shift(causal, need_weights, dtype):
    # Scores up to about ±150: exp overflows float32 past 88, so every route must shift each row
    # by its own max (on float32 products the score products find it; the others search the
    # row). A missing or stale shift gives inf or NaN here where moderate scores hide it.
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 300, 64, generator=gen) * s for s in (7.0, 7.0, 1.0))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                        need_weights=need_weights)
    exact, exact_w = reference_attention(q, k, v, None, causal)
    assert (q.double() @ k.double().transpose(-2, -1) / 8).abs().max() > 100
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.isfinite(out).all()
    eps = EPS.get(dtype, 2.0 ** -24)
    ours_err, torch_err = _max_err(out, exact), _max_err(theirs, exact)
    assert ours_err <= 2 * torch_err + eps * exact.abs().max().item() / 4, (ours_err, torch_err)
    if need_weights:
        # Against torch's weights from the plain formulation at the same dtype (scores this
        # large carry their rounding, |s|·2^-24 and more, into every weight).
        scores = q @ k.transpose(-2, -1) / 8
        if causal:
            scores = scores.masked_fill(torch.ones(300, 300, dtype=torch.bool).triu(1),
                                        float("-inf"))
        their_w = torch.softmax(scores, dim=-1)
        assert torch.isfinite(weights).all()
        assert _max_err(weights, exact_w) <= 2 * _max_err(their_w, exact_w) + eps / 4


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_blocked_forward_of_broadcast_and_strided_inputs(causal, dtype):
    # The forward widens float16/bfloat16 inputs one batch entry at a time, keeping an entry's
    # widened and packed K and V for the next task when they are the same rows: broadcast K
    # (over heads) and V (over the batch), and queries whose rows are not contiguous, must each
    # be read as the batch entry's own.
    gen = torch.Generator().manual_seed(6)
    L = 300
    q = torch.randn(2, L, 3, 64, generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(2, 1, L, 64, generator=gen).to(dtype)
    v = torch.randn(1, 3, L, 48, generator=gen).to(dtype)
    mask = None if causal else torch.randn(L, L, generator=gen).to(dtype)
    full = [t.expand(2, 3, L, t.shape[-1]) for t in (q, k, v)]
    ref, ref_w = reference_attention(*full, mask, causal)
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, causal, need_weights=True)
    theirs = F.scaled_dot_product_attention(*full, mask, is_causal=causal)
    assert out.dtype == dtype and out.shape == (2, 3, L, 48)
    ours_err, torch_err = _max_err(out, ref), _max_err(theirs, ref)
    assert ours_err <= 2 * torch_err + EPS[dtype] * ref.abs().max().item() / 4, \
        (ours_err, torch_err)
    plain, _ = attnlab.scaled_dot_product_attention(q, k, v, mask, causal)
    assert _max_err(plain, ref) <= 2 * torch_err + EPS[dtype] * ref.abs().max().item() / 4
    tiny = 2.0 ** -24 if dtype == torch.float16 else 0.0
    torch.testing.assert_close(weights.double(), ref_w, atol=tiny, rtol=EPS[dtype])


HAS_AVX512_BF16 = "avx512_bf16" in cpu_flags()


def _route(env):
    return subprocess.run(
        [sys.executable, "-c", "import attnlab; print(attnlab.build_info()['cpu_bf16_products'])"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()


def _blocked_bfloat16_tests(env):
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "test_blocked_ and bfloat16"],
        env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout, run.stdout[-2000:]


def test_bfloat16_products_are_taken_where_they_pay():
    """The probe of the CPU's product rates: none without AVX512-BF16; with it, bfloat16 attention
    runs on vdpbf16ps only where that outruns float32 FMAs (or on AMX), else in float32."""
    info = attnlab.build_info()
    speedup, route = info["cpu_bf16_product_speedup"], info["cpu_bf16_products"]
    if os.environ.get("ATTNLAB_CPU_BF16_PRODUCTS") or os.environ.get("ATTNLAB_CPU_BRGEMM"):
        pytest.skip("the route is forced by the environment")
    if not HAS_AVX512_BF16:
        assert speedup == 0.0 and route == "float32"
        return
    # 32 multiply-adds per vdpbf16ps against 16 per FMA: the ratio lies between the extremes of
    # one instruction of either kind per cycle against two of the other.
    assert 0.2 < speedup < 4.5, speedup
    if route != "amx":
        assert route == ("avx512_bf16" if speedup >= 1.3 else "float32"), (route, speedup)


@pytest.mark.skipif(not HAS_AVX512_BF16, reason="this CPU lacks AVX512-BF16")
@pytest.mark.parametrize("forced,expected", [("1", ("avx512_bf16", "amx")), ("0", ("float32",))])
def test_forced_bfloat16_products_pass_the_blocked_bfloat16_tests(forced, expected):
    """ATTNLAB_CPU_BF16_PRODUCTS=1 takes the bfloat16 products (vdpbf16ps, or AMX) whatever the
    probe says, =0 the float32 ones: either way the blocked bfloat16 tests pass, so both routes
    stay tested on every CPU with AVX512-BF16."""
    env = dict(os.environ, ATTNLAB_CPU_BF16_PRODUCTS=forced)
    env.pop("ATTNLAB_CPU_BRGEMM", None)
    assert _route(env) in expected
    _blocked_bfloat16_tests(env)


@pytest.mark.skipif(not HAS_AVX512_BF16,
                    reason="this CPU lacks AVX512-BF16: no oneDNN brgemm route to take")
def test_onednn_brgemm_route_passes_the_blocked_bfloat16_tests():
    """The route CPUs with AMX take by default (bfloat16 products through torch's oneDNN brgemm
    on attnlab's packed operands), forced with ATTNLAB_CPU_BRGEMM=1 where oneDNN runs it without
    AMX: a process that takes it passes the blocked bfloat16 tests above."""
    env = dict(os.environ, ATTNLAB_CPU_BRGEMM="1")
    env.pop("ATTNLAB_CPU_BF16_PRODUCTS", None)
    route = _route(env)
    # Anything else means the start-up check found oneDNN's layout different from attnlab's.
    assert route in ("onednn_brgemm", "amx"), route
    _blocked_bfloat16_tests(env)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_give_zeros(dtype):
    q, k, v, _ = _inputs(CASES["plain"], dtype)
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    mask[3] = False
    q.requires_grad_()
    out, weights = attnlab.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert (out[..., 3, :] == 0).all() and (weights[..., 3, :] == 0).all()
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert (q.grad[..., 3, :] == 0).all() and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_and_backward_operators_keep_float32_logsumexp(dtype):
    q, k, v, _ = _inputs(CASES["causal"], dtype)
    out, lse, weights = torch.ops.attnlab._sdpa_forward(q, k, v, None, True, None, True)
    assert out.dtype == dtype and weights.dtype == dtype and lse.dtype == torch.float32
    ref_lse = torch.logsumexp(
        (q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            ~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf")), -1)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    grads = torch.ops.attnlab._sdpa_backward(torch.ones_like(out), q, k, v, None, True, None, out,
                                              lse, weights, False, True)
    assert [g.dtype for g in grads[:3]] == [dtype] * 3
    assert grads[4].dtype == dtype and grads[4].shape == weights.shape
    # dP = grad_output·valueᵀ everywhere
    torch.testing.assert_close(grads[4].double(), (torch.ones_like(out).double()
                                                   @ v.double().transpose(-2, -1)),
                               atol=0, rtol=EPS[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    q, k, v, mask = _inputs(CASES["float mask"], dtype)
    torch.library.opcheck(torch.ops.attnlab.scaled_dot_product_attention.default,
                          (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), mask,
                           False, None, True))
    plain = tuple(t.detach() for t in (q, k, v))
    torch.library.opcheck(torch.ops.attnlab._sdpa_forward.default,
                          (*plain, mask, True, None, True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_compile_fullgraph(dtype):
    q, k, v, _ = _inputs(CASES["causal"], dtype)

    def fn(q, k, v):
        return attnlab.scaled_dot_product_attention(q, k, v, is_causal=True)[0] * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multihead_attention_module(dtype):
    torch.manual_seed(0)
    module = MultiheadAttention(16, 16, 4)
    x = torch.randn(3, 10, 16)
    half = MultiheadAttention(16, 16, 4).to(dtype)
    half.load_state_dict({k: t.to(dtype) for k, t in module.state_dict().items()})
    xh = x.to(dtype).requires_grad_()
    out, attention = half(xh, mask=torch.ones(10, 10, dtype=torch.bool).tril(),
                          return_attention=True)
    assert out.dtype == dtype and attention.dtype == dtype and torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert xh.grad.dtype == dtype and half.qkv_proj.weight.grad.dtype == dtype
    ref = MultiheadAttention(16, 16, 4).double()
    ref.load_state_dict({k: t.double() for k, t in half.state_dict().items()})
    expected, expected_attention = ref(x.to(dtype).double(),
                                       mask=torch.ones(10, 10, dtype=torch.bool).tril(),
                                       return_attention=True)
    # The projections run in dtype (torch's Linear), attention in float32.
    torch.testing.assert_close(out.double(), expected, atol=8 * EPS[dtype], rtol=8 * EPS[dtype])
    torch.testing.assert_close(attention.double(), expected_attention, atol=8 * EPS[dtype],
                               rtol=8 * EPS[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_fused_in_float32(dtype, norm_first):
    torch.manual_seed(0)
    block = EncoderBlock(16, 2, 32, dropout=0.0, norm_first=norm_first).eval()
    half = EncoderBlock(16, 2, 32, dropout=0.0, norm_first=norm_first).to(dtype).eval()
    half.load_state_dict({k: t.to(dtype) for k, t in block.state_dict().items()})
    x = torch.randn(4, 10, 16).to(dtype)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    assert half._fusable(x, mask)
    xh = x.clone().requires_grad_()
    out = half(xh, mask=mask)
    assert out.dtype == dtype
    # The same block in float64 on the same rounded weights and input: the fused block computes
    # in float32 and rounds once, so it is within a few ulps of dtype.
    ref = EncoderBlock(16, 2, 32, dropout=0.0, norm_first=norm_first).double().eval()
    ref.load_state_dict({k: t.double() for k, t in half.state_dict().items()})
    xr = x.double().requires_grad_()
    expected = ref(xr, mask=mask)
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.double(), expected, atol=2 * EPS[dtype] * scale, rtol=0)
    grad = torch.randn_like(expected)
    out.backward(grad.to(dtype))
    expected.backward(grad)
    assert xh.grad.dtype == dtype
    for (name, p), (_, pr) in zip(half.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == dtype, name
        tol = 4 * EPS[dtype] * (pr.grad.abs().max().item() + 1e-3)
        torch.testing.assert_close(p.grad.double(), pr.grad, atol=tol, rtol=0, msg=name)
    tol = 4 * EPS[dtype] * xr.grad.abs().max().item()
    torch.testing.assert_close(xh.grad.double(), xr.grad, atol=tol, rtol=0)
