"""What only the sparse normalizers (sparsemax, entmax-1.5, α-entmax) have: the threshold τ and
the support value their operators return, exact zeros, α itself, the register-resident path of
their kernel, their bad-input messages, float16 and bfloat16 on the CPU, and their use in the
modules, the recorder and the Hugging Face backend; all against the float64 references of
reference.py. What every normalizer shares (values, weights and gradients against the
reference, gradcheck, opcheck, torch.compile) is tested once for all of them in
test_attention.py and test_attention_autograd.py."""

import math

import pytest
import torch

import attnlab
import reference as ref
from attnlab import nn as attn_nn
from reference import assert_close

sdpa = attnlab.scaled_dot_product_attention

NORMALIZERS = ref.SPARSE_NORMALIZERS
IDS = ref.ids(NORMALIZERS)


def make(*shape, seed=0, dtype=torch.float64, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=dtype)


def margin(query, key, attn_mask, is_causal, scale, normalizer, alpha):
    """The smallest |(α−1)·z − τ| over visible entries: how far the inputs are from a change of
    support."""
    return ref.support_gaps(query, key, attn_mask, is_causal, scale, normalizer, alpha).min().item()


def problem(seed, dtype, batch=(2, 3), len_q=11, len_k=13, dim=8, dim_v=5, scale_inputs=1.0):
    q = make(*batch, len_q, dim, seed=seed, dtype=dtype, scale=scale_inputs)
    k = make(*batch[-1:], len_k, dim, seed=seed + 1, dtype=dtype, scale=scale_inputs)  # broadcast
    v = make(*batch, len_k, dim_v, seed=seed + 2, dtype=dtype)
    return q, k, v


def support_value(weights, value, alpha):
    """U = Σ s·v / Σ s with s = p^(2−α) on the support (0 for a row without keys)."""
    s = torch.where(weights > 0, weights.clamp(min=1e-300) ** (2 - alpha),
                    torch.zeros_like(weights))
    return (s @ value.double()) / s.sum(-1, keepdim=True).clamp(min=1e-300)


# ---- τ and the support value ---------------------------------------------------------------

SHAPES = {  # the kernel's three row paths: short rows (dense, no lists), long sparse rows
    # (support lists, gathered products) and long dense rows (lists turned dense); their values
    # and weights are checked for every normalizer in test_attention.py
    "short": dict(len_q=11, len_k=13, scale=None),
    "long sparse": dict(len_q=9, len_k=300, scale=2.0),
    "long dense": dict(len_q=9, len_k=300, scale=1e-3),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=IDS)
def test_tau_and_support_value_match_reference(normalizer, alpha, shape, dtype):
    s = SHAPES[shape]
    a = ref.alpha_of(normalizer, alpha)
    q, k, v = problem(3, dtype, len_q=s["len_q"], len_k=s["len_k"])
    mask = make(s["len_q"], s["len_k"], seed=9) > -1.0  # boolean, broadcast over the batch
    for causal in (False, True):
        output, tau, u, weights = torch.ops.attnlab._sparse_sdpa_forward(
            q, k, v, mask, causal, s["scale"], True, a)
        assert output.dtype == tau.dtype == u.dtype == weights.dtype == dtype
        # The operator's output and weights are the public function's.
        public = sdpa(q, k, v, mask, causal, s["scale"], True, normalizer, alpha)
        assert torch.equal(output, public[0]) and torch.equal(weights, public[1])
        ref_tau = ref.threshold(q, k, mask, causal, s["scale"], normalizer, alpha)
        seen = torch.isfinite(ref_tau)
        assert torch.equal(torch.isinf(tau), ~seen), "tau is +inf exactly for rows without keys"
        assert_close(tau[seen], ref_tau[seen], "tau", dtype)
        _, ref_w = ref.attention(q, k, v, mask, causal, s["scale"], normalizer, alpha)
        assert_close(u, support_value(ref_w, v, a), "support_value", dtype, gradient=True)


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=IDS)
def test_rows_without_keys_have_infinite_tau_and_zeros(normalizer, alpha):
    q, k, v = problem(60, torch.float64, batch=(2,))
    mask = make(11, 13, seed=61) > 0
    mask[3] = False
    mask[7] = False
    output, tau, u, weights = torch.ops.attnlab._sparse_sdpa_forward(
        q, k, v, mask, False, None, True, ref.alpha_of(normalizer, alpha))
    for t in (output, u, weights):
        assert torch.equal(t[:, [3, 7]], torch.zeros_like(t[:, [3, 7]]))
    assert torch.isinf(tau[:, [3, 7]]).all() and (tau[:, [3, 7]] > 0).all()
    assert torch.isfinite(tau[:, [0, 1, 2, 4]]).all()


# ---- exact zeros and α ----------------------------------------------------------------------

@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=IDS)
def test_exact_zeros_where_the_reference_has_zeros(normalizer, alpha):
    # Entries clearly off the threshold (by more than the inputs' rounding: 1e-6 in float32)
    # are zero exactly when the reference's are; nearly all entries are that clear.
    for dtype, clear in ((torch.float64, 1e-9), (torch.float32, 1e-6)):
        for len_k, scale in ((16, 2.0), (200, 2.0), (200, 0.05)):
            q, k, v = problem(11, dtype, batch=(3,), len_q=20, len_k=len_k)
            sure = ref.support_gaps(q, k, None, False, scale, normalizer, alpha) > clear
            assert sure.double().mean() > 0.99
            _, weights = sdpa(q, k, v, scale=scale, need_weights=True, normalizer=normalizer,
                              alpha=alpha)
            _, ref_w = ref.attention(q, k, v, None, False, scale, normalizer, alpha)
            assert torch.equal((weights == 0)[sure], (ref_w == 0)[sure])
            assert (weights > 0).any() and torch.all(weights >= 0)
            assert (weights == 0).any() or scale < 1
            torch.testing.assert_close(weights.double().sum(-1), torch.ones(3, 20, dtype=torch.float64),
                                       rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)


def test_alpha_2_and_1_5_are_sparsemax_and_entmax15():
    q, k, v = problem(5, torch.float64)
    for name, alpha in (("sparsemax", 2.0), ("entmax15", 1.5)):
        named = sdpa(q, k, v, need_weights=True, normalizer=name)
        general = sdpa(q, k, v, need_weights=True, normalizer="entmax", alpha=alpha)
        assert torch.equal(named[0], general[0]) and torch.equal(named[1], general[1])


def test_normalizers_differ_and_softmax_is_unchanged():
    q, k, v = problem(6, torch.float64)
    soft = sdpa(q, k, v, need_weights=True)
    soft_named = sdpa(q, k, v, need_weights=True, normalizer="softmax")
    assert torch.equal(soft[0], soft_named[0]) and torch.equal(soft[1], soft_named[1])
    assert (soft[1] > 0).all()
    for normalizer, alpha in NORMALIZERS:
        _, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
        assert (w == 0).any(), normalizer
    # α-entmax approaches softmax as α → 1.
    _, near_soft = sdpa(q, k, v, need_weights=True, normalizer="entmax", alpha=1.0001)
    torch.testing.assert_close(near_soft, soft[1], rtol=0, atol=1e-3)


# ---- modules and the recorder ---------------------------------------------------------------

def reference_mha(module, x, mask, normalizer, alpha):
    """attnlab.nn.MultiheadAttention from its weights in plain torch ops, float64, with the
    reference normalizer."""
    B, L, _ = x.shape
    H, hd = module.num_heads, module.head_dim
    qkv = x.double() @ module.qkv_proj.weight.double().T + module.qkv_proj.bias.double()
    qkv = qkv.reshape(B, L, H, 3 * hd).permute(0, 2, 1, 3)
    q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
    out, weights = ref.attention(q, k, v, mask, False, None, normalizer, alpha)
    values = out.permute(0, 2, 1, 3).reshape(B, L, H * hd)
    return values @ module.o_proj.weight.double().T + module.o_proj.bias.double(), weights


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS[:3], ids=IDS[:3])
def test_multihead_attention_module(normalizer, alpha):
    torch.manual_seed(1)
    module = attn_nn.MultiheadAttention(12, 16, 4, normalizer=normalizer, alpha=alpha)
    x = torch.randn(3, 10, 12)
    mask = torch.rand(10, 10) > 0.2
    out, attention = module(x, mask=mask, return_attention=True)
    ref_out, ref_attention = reference_mha(module, x, mask, normalizer, alpha)
    assert_close(out, ref_out, "output", torch.float32)
    assert_close(attention, ref_attention, "attention", torch.float32)
    assert (attention == 0).any()


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS[:3], ids=IDS[:3])
def test_encoder_block_falls_back_to_modules(normalizer, alpha):
    torch.manual_seed(2)
    for norm_first in (False, True):
        block = attn_nn.EncoderBlock(16, 4, 32, norm_first=norm_first, normalizer=normalizer,
                                     alpha=alpha).eval()
        x = torch.randn(2, 7, 16, requires_grad=True)
        assert not block._fusable(x, None)
        y = block(x)
        attn = lambda t: reference_mha(block.self_attn, t, None, normalizer, alpha)[0].float()  # noqa: E731
        if norm_first:
            h = x + attn(block.norm1(x))
            expected = h + block.linear_net(block.norm2(h))
        else:
            h = block.norm1(x + attn(x))
            expected = block.norm2(h + block.linear_net(h))
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
    encoder = attn_nn.TransformerEncoder(2, input_dim=16, num_heads=4, dim_feedforward=32,
                                         normalizer=normalizer, alpha=alpha)
    x = torch.randn(2, 7, 16)
    maps = encoder.get_attention_maps(x)
    assert len(maps) == 2
    assert_close(maps[0], reference_mha(encoder.layers[0].self_attn, x, None, normalizer, alpha)[1],
                 "first layer's map", torch.float32)
    for m in maps:
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 4, 7))


def test_modules_refuse_bad_normalizers_when_built():
    with pytest.raises(ValueError, match=r"unknown normalizer 'sparsemaks'; expected one of"):
        attn_nn.MultiheadAttention(8, 8, 2, normalizer="sparsemaks")
    with pytest.raises(ValueError, match=r"normalizer='entmax' needs alpha"):
        attn_nn.EncoderBlock(8, 2, 16, normalizer="entmax")
    with pytest.raises(ValueError, match=r"alpha is only taken by normalizer='entmax'"):
        attn_nn.TransformerEncoder(1, input_dim=8, num_heads=2, dim_feedforward=16,
                                   normalizer="sparsemax", alpha=2.0)
    with pytest.raises(ValueError, match=r"alpha must be a finite number > 1 .*got 0.5"):
        attn_nn.MultiheadAttention(8, 8, 2, normalizer="entmax", alpha=0.5)
    with pytest.raises(TypeError, match=r"normalizer must be a string"):
        attn_nn.MultiheadAttention(8, 8, 2, normalizer=None)


def test_recorder_keeps_sparse_weights_and_their_gradient():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 4, requires_grad=True) for _ in range(3))
    with attnlab.interpret.record() as rec:
        out, w = sdpa(q, k, v, need_weights=True, normalizer="sparsemax")
        out2, none = sdpa(q, k, v, normalizer="entmax", alpha=1.4)
    assert none is None
    loss = (out * out).sum() + out2.sum()
    loss.backward()
    assert len(rec) == 2
    _, ref_w = ref.attention(q.detach(), k.detach(), v.detach(), normalizer="sparsemax")
    assert_close(rec.weights[0], ref_w, "recorded weights", torch.float32)
    assert torch.equal(rec.weights[0], w)
    # ∂loss/∂weights = dO·Vᵀ: 2·out·vᵀ and 1·vᵀ.
    torch.testing.assert_close(rec.grads[0], (2 * out.detach()) @ v.detach().transpose(-2, -1))
    torch.testing.assert_close(rec.grads[1], torch.ones_like(out2) @ v.detach().transpose(-2, -1))
    # The gradients of the inputs are those of the unrecorded call.
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    plain, _ = sdpa(q2, k2, v2, normalizer="sparsemax")
    plain2, _ = sdpa(q2, k2, v2, normalizer="entmax", alpha=1.4)
    ((plain * plain).sum() + plain2.sum()).backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad)


# ---- bad input ------------------------------------------------------------------------------

BAD = {
    "unknown normalizer": (dict(normalizer="sparsemaks"),
                           r'unknown normalizer "sparsemaks"; expected one of "softmax", "sparsemax", "entmax15" or "entmax"'),
    "alpha with softmax": (dict(alpha=1.5), r'alpha is only taken by normalizer="entmax".*got alpha=1.5 with normalizer="softmax"'),
    "alpha with sparsemax": (dict(normalizer="sparsemax", alpha=2.0), r'alpha is only taken by normalizer="entmax"'),
    "entmax without alpha": (dict(normalizer="entmax"), r'normalizer="entmax" needs alpha'),
    "alpha of 1": (dict(normalizer="entmax", alpha=1.0), r"alpha must be a finite number > 1 .*got 1"),
    "alpha below 1": (dict(normalizer="entmax", alpha=0.5), r"alpha must be a finite number > 1 .*got 0.5"),
    "alpha NaN": (dict(normalizer="entmax", alpha=math.nan), r"alpha must be a finite number > 1 .*got nan"),
    "alpha inf": (dict(normalizer="entmax", alpha=math.inf), r"alpha must be a finite number > 1 .*got inf"),
    "int8 inputs": (dict(normalizer="sparsemax", dtype=torch.int8), r"must be float32, float64, float16 or bfloat16 on the CPU, got Char"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_names_the_argument(name):
    overrides, message = BAD[name]
    dtype = overrides.pop("dtype", torch.float32) if "dtype" in overrides else torch.float32
    overrides = {key: val for key, val in overrides.items() if key != "dtype"}
    q, k, v = (torch.randn(2, 4, 3).to(dtype) for _ in range(3))
    with pytest.raises(RuntimeError, match=message) as info:
        sdpa(q, k, v, **overrides)
    assert "attnlab.scaled_dot_product_attention" in str(info.value)


def test_bad_operator_arguments():
    q, k, v = (torch.randn(2, 4, 3) for _ in range(3))
    with pytest.raises(RuntimeError, match=r"alpha must be a finite number > 1 .*got 1"):
        torch.ops.attnlab._sparse_sdpa_forward(q, k, v, None, False, None, False, 1.0)
    output, tau, u, _ = torch.ops.attnlab._sparse_sdpa_forward(q, k, v, None, False, None, False, 2.0)
    args = [torch.ones_like(output), q, k, v, None, False, None, output, tau, u, 2.0]
    with pytest.raises(RuntimeError, match=r"backward: tau has shape \[2, 3\], expected \[2, 4\]"):
        torch.ops.attnlab._sparse_sdpa_backward(*args[:8], tau[:, :3], *args[9:])
    with pytest.raises(RuntimeError, match=r"backward: tau has dtype Double, expected Float"):
        torch.ops.attnlab._sparse_sdpa_backward(*args[:8], tau.double(), *args[9:])
    with pytest.raises(RuntimeError, match=r"backward: support_value has shape \[2, 4, 2\], expected \[2, 4, 3\]"):
        torch.ops.attnlab._sparse_sdpa_backward(*args[:9], u[..., :2], *args[10:])
    with pytest.raises(RuntimeError, match=r"backward: a boolean attn_mask has no gradient"):
        torch.ops.attnlab._sparse_sdpa_backward(*args[:4], torch.ones(4, 4, dtype=torch.bool),
                                                *args[5:], None, True)
    with pytest.raises(RuntimeError, match=r"backward: weights has shape \[2, 4, 3\], expected \[2, 4, 4\]"):
        torch.ops.attnlab._sparse_sdpa_backward(*args, torch.ones(2, 4, 3))


# ---- the Hugging Face backend ---------------------------------------------------------------

def test_transformers_backends_with_sparse_normalizers():
    transformers = pytest.importorskip(
        "transformers", reason="transformers is optional (pip install attnlab[hf])")
    import attnlab.integrations.transformers as hf
    from transformers import AttentionInterface, AutoModel, LlamaConfig
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def reference_backend(normalizer, alpha):
        def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                    is_causal=None, **kwargs):
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            causal = attention_mask is None and query.shape[2] > 1
            if attention_mask is not None and attention_mask.dtype == torch.bool:
                # eager's additive mask: a row without keys gets uniform weights
                attention_mask = torch.zeros(attention_mask.shape).masked_fill(
                    ~attention_mask, torch.finfo(query.dtype).min)
            out, weights = ref.attention(query, key, value, attention_mask, causal, scaling,
                                         normalizer, alpha)
            return out.to(query.dtype).transpose(1, 2).contiguous(), weights.to(query.dtype)
        return forward

    config = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0, initializer_range=0.3)
    ids = torch.randint(1, 61, (2, 9), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 9, dtype=torch.long)
    padding[1, :3] = 0  # left padding
    for name, normalizer, alpha in (("attnlab_sparsemax", "sparsemax", None),
                                    ("attnlab_entmax15", "entmax15", None),
                                    ("attnlab_test_entmax13", "entmax", 1.3)):
        if name not in hf.SPARSE_NAMES:
            hf.register(name, normalizer, alpha)
        AttentionInterface.register(f"{name}_reference", reference_backend(normalizer, alpha))
        AttentionMaskInterface.register(f"{name}_reference", sdpa_mask)
        torch.manual_seed(0)
        ours = AutoModel.from_config(LlamaConfig(**config), attn_implementation=name).eval()
        theirs = AutoModel.from_config(LlamaConfig(**config),
                                       attn_implementation=f"{name}_reference").eval()
        theirs.load_state_dict(ours.state_dict())
        out = ours(input_ids=ids, attention_mask=padding, output_attentions=True)
        expected = theirs(input_ids=ids, attention_mask=padding, output_attentions=True)
        real = padding.bool()
        torch.testing.assert_close(out.last_hidden_state[real],
                                   expected.last_hidden_state[real], rtol=1e-5, atol=1e-5)
        for got, want in zip(out.attentions, expected.attentions):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if normalizer != "entmax":
            assert any((a[real[:, None, :, None].expand_as(a)] == 0).any() for a in out.attentions)
    with pytest.raises(ValueError, match=r"unknown normalizer 'softermax'"):
        hf.register("attnlab_bad", "softermax")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_half_precision_on_the_cpu_computes_in_float32(normalizer, dtype):
    # float16/bfloat16 inputs run through the float32 kernel: the result is the float32 one of the
    # same rounded inputs, rounded once; the gradients arrive in the inputs' dtype.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    out, weights = sdpa(q, k, v, is_causal=True, need_weights=True, normalizer=normalizer)
    wide = [t.detach().float() for t in (q, k, v)]
    ref_out, ref_w = sdpa(*wide, is_causal=True, need_weights=True, normalizer=normalizer)
    assert out.dtype == dtype and weights.dtype == dtype
    assert torch.equal(out, ref_out.to(dtype)) and torch.equal(weights, ref_w.to(dtype))
    assert ((weights == 0) == (ref_w == 0)).all()  # the same exact zeros
    out.float().sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()


# ---- the register-resident path: every key in one vector -------------------------------------
# Sparsemax, entmax-1.5 and α-entmax (here α = 1.25 and 1.75; α = 3 in the float64 gradcheck:
# for α > 2, s = p^{2−α} grows without bound as p → 0, so float32 gradients recomputed from
# the stored τ are ill-conditioned on either path) take it when L_k <= 16 (float32) or 8
# (float64) and E, E_v <= 256;
# the cases sit just below and above those limits, so that both paths are checked against the
# reference at the same settings.

SMALL_LIMIT = {torch.float32: 16, torch.float64: 8}
SMALL_NORMALIZERS = [("sparsemax", None), ("entmax15", None), ("entmax", 1.25), ("entmax", 1.75)]
SMALL_IDS = ["sparsemax", "entmax15", "entmax-1.25", "entmax-1.75"]
SMALL_CASES = [
    # (dtype, len_k, dim, dim_v)
    (dtype, SMALL_LIMIT[dtype] + dk, dim, dim_v)
    for dtype in (torch.float32, torch.float64)
    for dk in (-1, 0, 1)
    for dim, dim_v in ((1, 1), (17, 33))
] + [(torch.float32, 10, 256, 256), (torch.float32, 10, 257, 8), (torch.float64, 8, 8, 256),
     (torch.float64, 8, 8, 257)]


def small_problem(dtype, len_q, len_k, dim, dim_v, seed):
    q = make(2, 3, len_q, dim, seed=seed, dtype=dtype, scale=2.0 / math.sqrt(dim) ** 0.5)
    k = make(2, 3, len_k, dim, seed=seed + 1, dtype=dtype, scale=2.0 / math.sqrt(dim) ** 0.5)
    v = make(2, 3, len_k, dim_v, seed=seed + 2, dtype=dtype)
    mask = make(3, len_q, len_k, seed=seed + 3, dtype=dtype)  # float, broadcast over the batch
    mask = mask.masked_fill(make(len_q, len_k, seed=seed + 4) > 1.0, -math.inf)
    mask[:, 1] = -math.inf  # query row 1: every key masked
    return q, k, v, mask


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: f"{str(c[0])[-7:]}-Lk{c[1]}-E{c[2]}-Ev{c[3]}")
@pytest.mark.parametrize("normalizer,alpha", SMALL_NORMALIZERS, ids=SMALL_IDS)
def test_small_path_limits_forward_and_gradients(normalizer, alpha, case):
    dtype, len_k, dim, dim_v = case
    a = ref.alpha_of(normalizer, alpha)
    for len_q, causal in ((len_k - 2, False), (len_k + 3, True), (6, True)):
        q, k, v, mask = small_problem(dtype, len_q, len_k, dim, dim_v, seed=130 + len_k + dim)
        output, tau, u, weights = torch.ops.attnlab._sparse_sdpa_forward(
            q, k, v, mask, causal, None, True, a)
        ref_out, ref_w = ref.attention(q, k, v, mask, causal, None, normalizer, alpha)
        ref_tau = ref.threshold(q, k, mask, causal, None, normalizer, alpha)
        assert_close(output, ref_out, "output", dtype)
        assert_close(weights, ref_w, "weights", dtype)
        assert torch.all(weights[..., 1, :] == 0) and torch.all(output[..., 1, :] == 0)
        seen = torch.isfinite(ref_tau)
        assert torch.equal(torch.isinf(tau), ~seen)
        assert_close(tau[seen], ref_tau[seen], "tau", dtype)
        assert_close(u, support_value(ref_w, v, a), "support_value", dtype, gradient=True)
        # Exact zeros where the reference is clearly off the support.
        sure = ref.support_gaps(q, k, mask, causal, None, normalizer, alpha) > (
            1e-9 if dtype == torch.float64 else 1e-5)
        assert torch.equal((weights == 0)[sure], (ref_w == 0)[sure])
        # Gradients, P recomputed from tau and read from the weights.
        grad = make(*output.shape, seed=31, dtype=dtype)
        ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, mask)]
        ref_o, _ = ref.attention(*ref_leaves[:3], ref_leaves[3], causal, None, normalizer, alpha)
        ref_grads = torch.autograd.grad(ref_o, ref_leaves, grad.double())
        for need_weights in (False, True):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, mask)]
            out, _ = sdpa(*leaves[:3], leaves[3], causal, None, need_weights, normalizer, alpha)
            grads = torch.autograd.grad(out, leaves, grad)
            for name, got, want in zip(["query", "key", "value", "attn_mask"], grads, ref_grads):
                assert_close(got, want, f"gradient of {name} (need_weights={need_weights})",
                             dtype, gradient=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("normalizer,alpha", SMALL_NORMALIZERS, ids=SMALL_IDS)
def test_small_path_agrees_with_the_blocked_path(normalizer, alpha, dtype):
    # One more key, masked out everywhere, sends the same problem down the blocked path.
    limit = SMALL_LIMIT[dtype]
    q, k, v, mask = small_problem(dtype, 12, limit, 16, 24, seed=150)
    k_extra = torch.cat([k, make(2, 3, 1, 16, seed=151, dtype=dtype)], dim=-2)
    v_extra = torch.cat([v, make(2, 3, 1, 24, seed=152, dtype=dtype)], dim=-2)
    mask_extra = torch.cat([mask, torch.full((3, 12, 1), -math.inf, dtype=dtype)], dim=-1)
    for causal in (False, True):
        out, w = sdpa(q, k, v, mask, causal, need_weights=True, normalizer=normalizer, alpha=alpha)
        out_b, w_b = sdpa(q, k_extra, v_extra, mask_extra, causal, need_weights=True,
                          normalizer=normalizer, alpha=alpha)
        atol = 1e-12 if dtype == torch.float64 else 2e-6
        torch.testing.assert_close(out, out_b, rtol=0, atol=atol)
        torch.testing.assert_close(w, w_b[..., :limit], rtol=0, atol=atol)
        assert torch.equal(w_b[..., limit], torch.zeros_like(w_b[..., limit]))


@pytest.mark.parametrize("normalizer,alpha", SMALL_NORMALIZERS, ids=SMALL_IDS)
def test_small_path_ties_nan_rows_and_one_key(normalizer, alpha):
    for dtype in (torch.float32, torch.float64):
        limit = SMALL_LIMIT[dtype]
        # All scores equal: uniform; two tied leaders far above the rest: half each.
        q = torch.zeros(3, 5, 4, dtype=dtype)
        k, v = make(3, limit, 4, seed=160, dtype=dtype), make(3, limit, 2, seed=161, dtype=dtype)
        out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
        torch.testing.assert_close(w, torch.full_like(w, 1 / limit), rtol=0, atol=1e-7)
        keys = torch.zeros(1, limit, 1, dtype=dtype)
        keys[0, 1] = keys[0, limit - 1] = 50.0
        _, w = sdpa(torch.ones(1, 2, 1, dtype=dtype), keys, make(1, limit, 3, seed=162, dtype=dtype),
                    scale=1.0, need_weights=True, normalizer=normalizer, alpha=alpha)
        expected = torch.zeros(1, 2, limit, dtype=dtype)
        expected[..., [1, limit - 1]] = 0.5
        assert torch.equal(w == 0, expected == 0)
        torch.testing.assert_close(w, expected, rtol=0, atol=1e-6)
        # A NaN stays in its row, forward and backward; +inf scores make their row NaN.
        q, k, v = (t.requires_grad_() for t in problem(163, dtype, batch=(2,), len_q=6, len_k=limit))
        bad = q.detach().clone()
        bad[1, 2, 0] = math.nan
        bad[0, 4, 0] = math.inf
        bad = bad.requires_grad_()
        out, w = sdpa(bad, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
        rest = torch.ones(2, 6, dtype=torch.bool)
        rest[1, 2] = rest[0, 4] = False
        assert torch.isnan(out[~rest]).all() and torch.isnan(w[~rest]).all()
        assert torch.isfinite(out[rest]).all() and torch.isfinite(w[rest]).all()
        dq, = torch.autograd.grad(out[rest].sum(), bad)
        assert torch.isfinite(dq[rest]).all()
        # One key: it takes everything.
        q, k, v = problem(164, dtype, batch=(2,), len_q=3, len_k=1)
        out, w = sdpa(q, k, v, need_weights=True, normalizer=normalizer, alpha=alpha)
        assert torch.equal(w, torch.ones_like(w))
        torch.testing.assert_close(out, v.expand(2, 3, v.shape[-1]))


@pytest.mark.parametrize("len_k,dim", [(16, 32), (10, 64), (7, 20)])
@pytest.mark.parametrize("normalizer,alpha", SMALL_NORMALIZERS, ids=SMALL_IDS)
def test_small_path_many_rows_with_dead_and_nan_rows_in_later_groups(normalizer, alpha, len_k,
                                                                     dim):
    # 35 query rows (the forward takes them four at a time, the last group partial), with fully
    # masked rows and a NaN row well past the first groups.
    a = ref.alpha_of(normalizer, alpha)
    q, k, v, mask = small_problem(torch.float32, 35, len_k, dim, dim, seed=180 + len_k)
    mask[:, 17] = -math.inf
    mask[:, 33] = -math.inf
    for causal in (False, True):
        out, tau, _, w = torch.ops.attnlab._sparse_sdpa_forward(q, k, v, mask, causal, None, True,
                                                                a)
        ref_out, ref_w = ref.attention(q, k, v, mask, causal, None, normalizer, alpha)
        ref_tau = ref.threshold(q, k, mask, causal, None, normalizer, alpha)
        assert_close(out, ref_out, "output", torch.float32)
        assert_close(w, ref_w, "weights", torch.float32)
        for row in (1, 17, 33):
            assert torch.all(w[..., row, :] == 0) and torch.all(out[..., row, :] == 0)
            assert torch.all(tau[..., row] == math.inf)
        seen = torch.isfinite(ref_tau)
        assert_close(tau[seen], ref_tau[seen], "tau", torch.float32)
    bad = q.clone()
    bad[0, 1, 20, 0] = math.nan
    out, tau, _, w = torch.ops.attnlab._sparse_sdpa_forward(bad, k, v, mask, False, None, True, a)
    assert torch.isnan(out[0, 1, 20]).all() and torch.isnan(tau[0, 1, 20])
    visible = torch.isfinite(mask[1, 20])
    assert torch.isnan(w[0, 1, 20][visible]).all()
    rest = torch.ones(out.shape[:-1], dtype=torch.bool)
    rest[0, 1, 20] = False
    assert torch.isfinite(out[rest]).all()


@pytest.mark.parametrize("normalizer,alpha", SMALL_NORMALIZERS + [("entmax", 3.0)],
                         ids=SMALL_IDS + ["entmax-3"])
def test_small_path_gradcheck_float64(normalizer, alpha):
    # L_k = 8, the float64 limit, with a float mask, the causal mask and a fully masked row.
    q = make(2, 9, 3, seed=170).requires_grad_()
    k = make(2, 8, 3, seed=171).requires_grad_()
    v = make(2, 8, 4, seed=172).requires_grad_()
    mask = make(9, 8, seed=173).masked_fill(make(9, 8, seed=174) > 1.2, -math.inf)
    mask[5] = -math.inf
    mask = mask.requires_grad_()
    assert margin(q, k, mask, True, 1.5, normalizer, alpha) > 1e-3

    def fn(q, k, v, mask):
        return sdpa(q, k, v, mask, True, 1.5, normalizer=normalizer, alpha=alpha)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v, mask))
