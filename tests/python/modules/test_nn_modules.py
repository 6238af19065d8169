"""attnlab.nn against the tutorial's equations, written out in float64 with shared weights."""

import math

import pytest
import torch
from torch import nn

from attnlab.nn import (CosineWarmupScheduler, EncoderBlock, MultiheadAttention,
                        PositionalEncoding, TransformerEncoder, load_torch_multihead_attention,
                        sinusoidal_table)
from reference import tutorial_block, tutorial_mha


@pytest.mark.parametrize("mask_kind", [None, "2d", "3d"])
def test_multihead_attention_matches_tutorial_equations(mask_kind):
    torch.manual_seed(0)
    module = MultiheadAttention(input_dim=6, embed_dim=12, num_heads=3).double()
    x = torch.randn(4, 7, 6, dtype=torch.float64)
    mask = {None: None, "2d": torch.ones(7, 7, dtype=torch.bool).tril(),
            "3d": torch.rand(4, 7, 7) > 0.3}[mask_kind]
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    out, attention = module(x, mask=mask, return_attention=True)
    ref_out, ref_attention = tutorial_mha(module, x, mask)
    assert attention.shape == (4, 3, 7, 7)
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(attention, ref_attention, rtol=1e-9, atol=1e-9)
    # Without weights the softmax runs online, in another order: equal to rounding.
    torch.testing.assert_close(module(x, mask=mask), out, rtol=1e-12, atol=1e-12)


def test_encoder_matches_tutorial_equations_and_returns_one_map_per_layer():
    torch.manual_seed(1)
    encoder = TransformerEncoder(num_layers=2, input_dim=8, num_heads=2,
                                 dim_feedforward=16).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    maps_ref, h = [], x
    for block in encoder.layers:
        maps_ref.append(tutorial_mha(block.self_attn, h)[1])
        h = tutorial_block(block, h)
    torch.testing.assert_close(encoder(x), h, rtol=1e-9, atol=1e-9)
    maps = encoder.get_attention_maps(x)
    assert len(maps) == 2 and all(m.shape == (3, 2, 5, 5) for m in maps)
    for got, ref in zip(maps, maps_ref):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


def test_gradcheck_multihead_attention():
    torch.manual_seed(2)
    module = MultiheadAttention(4, 4, 2).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.autograd.gradcheck(lambda t: module(t, mask=causal), (x,))


def test_encoder_without_positional_encoding_is_permutation_equivariant():
    torch.manual_seed(3)
    encoder = TransformerEncoder(num_layers=2, input_dim=16, num_heads=4, dim_feedforward=32).eval()
    x = torch.randn(5, 10, 16)
    perm = torch.randperm(10)
    diff = (encoder(x)[:, perm] - encoder(x[:, perm])).abs().max().item()
    assert diff < 1e-5


def test_pre_norm_block():
    torch.manual_seed(4)
    block = EncoderBlock(8, 2, 16, norm_first=True).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(block(x), tutorial_block(block, x), rtol=1e-9, atol=1e-9)


def test_tutorial_state_dict_loads_unchanged():
    torch.manual_seed(5)
    # A tutorial-shaped checkpoint: the parameter names and shapes the tutorial's encoder has.
    source = TransformerEncoder(num_layers=1, input_dim=8, num_heads=2, dim_feedforward=16)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    assert set(state) == {
        "layers.0.self_attn.qkv_proj.weight", "layers.0.self_attn.qkv_proj.bias",
        "layers.0.self_attn.o_proj.weight", "layers.0.self_attn.o_proj.bias",
        "layers.0.linear_net.0.weight", "layers.0.linear_net.0.bias",
        "layers.0.linear_net.3.weight", "layers.0.linear_net.3.bias",
        "layers.0.norm1.weight", "layers.0.norm1.bias", "layers.0.norm2.weight",
        "layers.0.norm2.bias"}
    target = TransformerEncoder(num_layers=1, input_dim=8, num_heads=2, dim_feedforward=16)
    target.load_state_dict(state)
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


def test_loads_torch_multihead_attention():
    torch.manual_seed(6)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True).double()
    ours = load_torch_multihead_attention(MultiheadAttention(12, 12, 3).double(), theirs)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    expected, expected_maps = theirs(x, x, x, attn_mask=~allowed, average_attn_weights=False)
    out, maps = ours(x, mask=allowed, return_attention=True)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(maps, expected_maps, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("norm_first", [False, True])
def test_loads_torch_transformer_encoder_layer(norm_first):
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=24, dropout=0.0, batch_first=True,
                                       norm_first=norm_first).double().eval()
    block = EncoderBlock.from_torch(layer).double().eval()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(block(x), layer(x), rtol=1e-9, atol=1e-9)


def test_positional_encoding_formula_and_limits():
    table = sinusoidal_table(96, 48)
    pos, i = 7, 5
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 48)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 48)), abs=1e-6)
    odd = sinusoidal_table(10, 5)
    torch.testing.assert_close(odd, sinusoidal_table(10, 6)[:, :5])
    encoding = PositionalEncoding(d_model=48, max_len=96)
    x = torch.zeros(2, 10, 48)
    torch.testing.assert_close(encoding(x)[0], table[:10])
    with pytest.raises(ValueError, match="sequence length 97 exceeds max_len 96"):
        encoding(torch.zeros(1, 97, 48))


def test_cosine_warmup_factor():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = CosineWarmupScheduler(optimizer, warmup=100, max_iters=2000)
    factors = []
    for _ in range(2000):
        factors.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    for it in (0, 50, 100, 101, 1000, 1999):
        expected = 0.5 * (1 + math.cos(math.pi * it / 2000)) * (it / 100 if it <= 100 else 1)
        assert factors[it] == pytest.approx(expected)


BAD_MODULE_ARGS = [
    (lambda: MultiheadAttention(8, 10, 3), r"embed_dim \(10\) must be divisible by num_heads \(3\)"),
    (lambda: MultiheadAttention(8, 8, 0), r"num_heads must be positive"),
    (lambda: EncoderBlock(8, 2, 0), r"dim_feedforward must be positive"),
    (lambda: PositionalEncoding(8, max_len=0), r"max_len must be positive"),
    (lambda: TransformerEncoder(0, input_dim=8, num_heads=2, dim_feedforward=8), r"num_layers"),
]


@pytest.mark.parametrize("make,message", BAD_MODULE_ARGS)
def test_bad_module_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_module_inputs():
    module = MultiheadAttention(8, 8, 2)
    with pytest.raises(ValueError, match=r"expects x of shape \[batch, length, 8\], got \[3, 8\]"):
        module(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"got \[2, 5, 7\]"):
        module(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"mask must have shape .* with L = 5, got \[4, 4\]"):
        module(torch.randn(2, 5, 8), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"PositionalEncoding expects x of shape"):
        PositionalEncoding(8)(torch.randn(2, 5, 6))


def test_cross_multi_head_attention_matches_equations():
    from attnlab.nn import MultiHeadAttention
    torch.manual_seed(8)
    module = MultiHeadAttention(d_model=12, num_heads=3, p=0.1, d_input=(5, 7, 4)).double()
    xq = torch.randn(2, 6, 5, dtype=torch.float64)
    xk = torch.randn(2, 9, 7, dtype=torch.float64)
    xv = torch.randn(2, 9, 4, dtype=torch.float64)
    H, A = module(xq, xk, xv)

    def heads(t):
        return t.reshape(2, -1, 3, 4).transpose(1, 2)
    Q, K, V = heads(xq @ module.W_q.weight.T), heads(xk @ module.W_k.weight.T), heads(xv @ module.W_v.weight.T)
    A_ref = torch.softmax((Q / 2.0) @ K.transpose(-2, -1), dim=-1)
    H_ref = (A_ref @ V).transpose(1, 2).reshape(2, 6, 12) @ module.W_h.weight.T + module.W_h.bias
    assert module.W_q.bias is None and module.W_h.bias is not None
    torch.testing.assert_close(A, A_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(H, H_ref, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match=r"X_k must have shape \[batch, length, 7\]"):
        module(xq, xv, xv)


def test_positional_encoder_adds_or_concatenates():
    from attnlab.nn import PositionalEncoder
    table = sinusoidal_table(50, 6, scale=100.0)
    x = torch.randn(3, 10, 6)
    added = PositionalEncoder(6, scale=100.0, add=True)
    torch.testing.assert_close(added(x), x + table[:10])
    assert added.extra_output_shape == 0
    concat = PositionalEncoder(6, scale=100.0, add=False)
    out = concat(torch.randn(3, 10, 4))
    assert concat.extra_output_shape == 6 and out.shape == (3, 10, 10)
    torch.testing.assert_close(out[1, :, 4:], table[:10])
    with pytest.raises(ValueError, match=r"add=True needs inputs 6 wide"):
        added(torch.randn(3, 10, 4))
    with pytest.raises(ValueError, match=r"exceeds max_len 50"):
        added(torch.randn(1, 51, 6))


def test_sinusoidal_embedding_starts_at_the_table_and_learns():
    from attnlab.nn import sinusoidal_embedding
    embedding = sinusoidal_embedding(100, 8)
    torch.testing.assert_close(embedding.weight.detach(), sinusoidal_table(100, 8))
    assert embedding.weight.requires_grad
