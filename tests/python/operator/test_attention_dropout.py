"""Dropout on the attention weights inside the kernel (dropout_p): against a float64 reference
that applies the same mask (attnlab.functional.dropout_mask), for every normalizer, masks,
causal, the small and the blocked paths; reproducibility under torch.manual_seed; the mask's
keep rate; gradcheck; and the errors."""

import math

import pytest
import torch

import attnlab
import reference
from attnlab import functional

sdpa = attnlab.scaled_dot_product_attention
NORMALIZERS = reference.NORMALIZERS
by_normalizer = pytest.mark.parametrize("normalizer,alpha", NORMALIZERS,
                                        ids=reference.ids(NORMALIZERS))

# (batch, len_q, len_k, dim): float64 shapes of the small kernels (every key in one vector: at
# most 8 doubles) and of the blocked path (a tutorial's L = 10, and several query and key
# blocks, L_q != L_k).
SHAPES = [((2, 3), 8, 8, 16), ((3,), 40, 7, 8), ((2, 3), 10, 10, 16), ((1, 2), 150, 300, 32),
          ((2,), 300, 70, 24)]
SHAPE_IDS = ["small", "small_rows", "tutorial", "blocks", "long_q"]
MASKS = ["none", "causal", "bool", "float+causal"]


def _inputs(shape, dtype=torch.float64, seed=0):
    batch, len_q, len_k, dim = shape
    gen = torch.Generator().manual_seed(seed + len_q * 1000 + len_k)
    make = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    q, k, v = make(*batch, len_q, dim), make(*batch, len_k, dim), make(*batch, len_k, dim)
    return q, k, v, gen


def _mask(kind, batch, len_q, len_k, gen, dtype):
    """(attn_mask, is_causal); the boolean mask leaves query row 1 without any key."""
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    if kind == "bool":
        mask = torch.rand(*batch, len_q, len_k, generator=gen) > 0.3
        mask[..., 1, :] = False
        return mask, False
    return torch.randn(len_q, len_k, generator=gen, dtype=torch.float64).to(dtype), True


def _run(q, k, v, mask, causal, normalizer, alpha, p, seed, need_weights=True):
    """The operator with dropout, and the seed its call drew (the same draw, replayed)."""
    torch.manual_seed(seed)
    drawn = functional.dropout_seed()
    torch.manual_seed(seed)
    out, w = sdpa(q, k, v, attn_mask=mask, is_causal=causal, normalizer=normalizer, alpha=alpha,
                  need_weights=need_weights, dropout_p=p)
    return out, w, drawn


def _reference(q, k, v, mask, causal, normalizer, alpha, d):
    _, probs = reference.attention(q, k, v, mask, causal, None, normalizer, alpha)
    weights = probs * d
    return weights @ v.double(), weights


def _assert_float32_matches(q, k, v, mask, causal, normalizer, alpha, d, out, w, gen):
    """out (and w, unless None) of float32 q, k, v, and their gradients, against the float64
    reference with the same mask d."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected, expected_w = _reference(q64, k64, v64, mask, causal, normalizer, alpha, d)
    reference.assert_close(out, expected, "output", torch.float32)
    if w is not None:
        reference.assert_close(w, expected_w, "weights", torch.float32)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q64, k64, v64), grad.double())
    for name, a, b in zip("qkv", got, want):
        reference.assert_close(a, b, f"d{name}", torch.float32, gradient=True)


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@by_normalizer
def test_forward_and_backward_equal_the_reference_with_the_same_mask(normalizer, alpha, shape,
                                                                     mask_kind):
    q, k, v, gen = _inputs(shape)
    batch, len_q, len_k, _ = shape
    mask, causal = _mask(mask_kind, batch, len_q, len_k, gen, torch.float64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, w, seed = _run(q, k, v, mask, causal, normalizer, alpha, 0.25, 7)
    d = functional.dropout_mask((*batch, len_q, len_k), 0.25, seed)
    expected_out, expected_w = _reference(q, k, v, mask, causal, normalizer, alpha, d)
    reference.assert_close(out, expected_out, "output", torch.float64)
    reference.assert_close(w, expected_w, "weights", torch.float64)
    # Some weights were dropped, and the kept ones scaled: the mask did something.
    assert (d == 0).any() and (w.detach() > 0).any()
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected_out, (q, k, v), grad)
    for name, a, b in zip("qkv", got, want):
        reference.assert_close(a, b, f"d{name}", torch.float64, gradient=True)


# α = 3 leaves float32 out: s = p^(2−α) = 1/p is unbounded at the support's edge, where its
# float32 gradient differs from float64's with or without dropout (float64 runs it above).
FLOAT32_NORMALIZERS = [pair for pair in NORMALIZERS if pair != ("entmax", 3.0)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("normalizer,alpha", FLOAT32_NORMALIZERS,
                         ids=reference.ids(FLOAT32_NORMALIZERS))
def test_float32_without_weights_equals_the_reference(normalizer, alpha, causal):
    q, k, v, gen = _inputs(((2, 2), 200, 260, 32), torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, _, seed = _run(q, k, v, None, causal, normalizer, alpha, 0.1, 3, need_weights=False)
    d = functional.dropout_mask((2, 2, 200, 260), 0.1, seed)
    _assert_float32_matches(q, k, v, None, causal, normalizer, alpha, d, out, None, gen)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", [((16, 2), 16, 16, 32), ((4, 4), 10, 10, 64), ((2,), 300, 12, 8)],
                         ids=["tutorial16", "tutorial10", "many_rows"])
def test_float32_tutorial_shapes_equal_the_reference(shape, mask_kind, need_weights):
    """Every key in one float32 vector: the small kernels, with dropout in registers."""
    q, k, v, gen = _inputs(shape, torch.float32)
    batch, len_q, len_k, _ = shape
    mask, causal = _mask(mask_kind, batch, len_q, len_k, gen, torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, w, seed = _run(q, k, v, mask, causal, "softmax", None, 0.2, 5, need_weights)
    d = functional.dropout_mask((*batch, len_q, len_k), 0.2, seed)
    _assert_float32_matches(q, k, v, mask, causal, "softmax", None, d, out,
                            w if need_weights else None, gen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_is_no_worse_than_twice_torchs_error(dtype):
    """torch's own error here: its SDPA at the same precision, with the same mask applied by
    hand (its own dropout draws another mask)."""
    q, k, v, _ = _inputs(((2, 4), 256, 256, 64), dtype)
    out, _, seed = _run(q, k, v, None, True, "softmax", None, 0.2, 11, need_weights=False)
    d = functional.dropout_mask((2, 4, 256, 256), 0.2, seed)
    expected, _ = _reference(q, k, v, None, True, "softmax", None, d)
    scores = (q @ k.transpose(-1, -2)).float() / 8
    scores = scores.masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), -math.inf)
    torch_out = (scores.softmax(-1).to(dtype) * d.to(dtype)) @ v
    ours = (out.double() - expected).abs().max().item()
    theirs = (torch_out.double() - expected).abs().max().item()
    assert ours <= 2 * theirs, f"{dtype}: attnlab's error {ours:.3g}, torch's {theirs:.3g}"


def test_the_same_seed_gives_bitwise_the_same_results_on_any_number_of_threads():
    q, k, v, _ = _inputs(((2, 4), 300, 300, 32), torch.float32)
    q.requires_grad_()
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (threads, 1, threads):
            torch.set_num_threads(n)
            torch.manual_seed(123)
            out, w = sdpa(q, k, v, is_causal=True, need_weights=True, dropout_p=0.3)
            (grad,) = torch.autograd.grad(out.sum(), q)
            results.append((out, w, grad))
    finally:
        torch.set_num_threads(threads)
    for later in results[1:]:
        for a, b in zip(results[0], later):
            assert torch.equal(a, b)
    torch.manual_seed(124)
    other, _ = sdpa(q, k, v, is_causal=True, dropout_p=0.3)
    assert not torch.equal(other, results[0][0]), "another seed, another mask"


def test_keep_rate_is_within_three_sigma_of_one_minus_p():
    p, n = 0.1, 1000
    d = functional.dropout_mask((n, n), p, 2024)
    kept = (d > 0).double()
    sigma = math.sqrt(p * (1 - p) / kept.numel())
    assert abs(kept.mean().item() - (1 - p)) < 3 * sigma
    torch.testing.assert_close(d[d > 0], torch.full_like(d[d > 0], 1 / (1 - p)))
    # Rows and columns are not alike: their keep rates scatter as independent draws would.
    for rates in (kept.mean(0), kept.mean(1)):
        assert abs(rates.std().item() - math.sqrt(p * (1 - p) / n)) < 0.15 * math.sqrt(
            p * (1 - p) / n)
    # Neighbouring rows (b·len_q + i and the next) and seeds give unrelated masks.
    assert abs((kept[1:] == kept[:-1]).double().mean().item() - (p * p + (1 - p) ** 2)) < 0.005
    other = (functional.dropout_mask((n, n), p, 2025) > 0).double()
    assert abs((other == kept).double().mean().item() - (p * p + (1 - p) ** 2)) < 0.005


def test_the_mask_follows_the_batch_shape_as_the_kernel_numbers_its_rows():
    """dropout_mask of [B, H, L, L] is that of [B·H·L, L] reshaped: the kernel's row b·L + i."""
    flat = functional.dropout_mask((2 * 3 * 20, 30), 0.5, 5)
    torch.testing.assert_close(functional.dropout_mask((2, 3, 20, 30), 0.5, 5),
                               flat.reshape(2, 3, 20, 30), rtol=0, atol=0)


@pytest.mark.parametrize("causal", [False, True])
@by_normalizer
def test_gradcheck_with_dropout(normalizer, alpha, causal):
    q, k, v, _ = _inputs(((1, 2), 6, 7, 4))
    if normalizer != "softmax":
        q = q * 0.5  # scores away from the support's edges, where finite differences fail

    def attend(q, k, v):
        torch.manual_seed(9)  # every evaluation draws the same mask
        return sdpa(q, k, v, is_causal=causal, normalizer=normalizer, alpha=alpha,
                    dropout_p=0.3)[0]

    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(attend, inputs)


def test_a_loss_on_the_weights_after_dropout_is_differentiated_for_softmax():
    q, k, v, _ = _inputs(((1, 2), 5, 6, 4))

    def loss_terms(q, k, v):
        torch.manual_seed(4)
        out, w = sdpa(q, k, v, attn_mask=torch.tensor([[True] * 5 + [False]] * 5),
                      need_weights=True, dropout_p=0.4)
        return out, (w * w).sum(-1)

    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(loss_terms, inputs)


def test_a_loss_on_sparse_weights_with_dropout_is_refused_by_name():
    q, k, v, _ = _inputs(((1, 2), 40, 40, 8))
    q.requires_grad_()
    _, w = sdpa(q, k, v, normalizer="sparsemax", need_weights=True, dropout_p=0.2)
    with pytest.raises(NotImplementedError, match="sparse normalizer with dropout_p > 0"):
        w.sum().backward()
    out, _ = sdpa(q, k, v, normalizer="sparsemax", need_weights=True, dropout_p=0.2)
    out.sum().backward()  # the output alone is differentiated
    assert q.grad.isfinite().all()


def test_grouped_heads_take_the_mask_of_the_query_heads():
    q, _, _, gen = _inputs(((2, 4), 30, 30, 8))
    k = torch.randn(2, 2, 30, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 30, 8, generator=gen, dtype=torch.float64)
    torch.manual_seed(1)
    seed = functional.dropout_seed()
    torch.manual_seed(1)
    out, w = sdpa(q, k, v, need_weights=True, dropout_p=0.5, enable_gqa=True)
    d = functional.dropout_mask((2, 4, 30, 30), 0.5, seed)
    expected, expected_w = _reference(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                      None, False, "softmax", None, d)
    reference.assert_close(out, expected, "output", torch.float64)
    reference.assert_close(w, expected_w, "weights", torch.float64)


def test_summaries_describe_the_weights_before_dropout():
    q, k, v, _ = _inputs(((1, 2), 64, 64, 8), torch.float32)
    summary = attnlab.WeightSummary(received=True, entropy=True)
    torch.manual_seed(0)
    out, s = sdpa(q, k, v, dropout_p=0.5, summary=summary)
    torch.manual_seed(0)
    dropped, _ = sdpa(q, k, v, dropout_p=0.5)
    _, plain = sdpa(q, k, v, summary=summary)
    assert torch.equal(out, dropped)
    torch.testing.assert_close(s.received, plain.received)
    torch.testing.assert_close(s.entropy, plain.entropy)


def test_dropout_on_cuda_tensors_is_refused_by_name():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    q = torch.randn(1, 1, 8, 8, device="cuda")
    with pytest.raises(NotImplementedError, match="dropout_p > 0 runs in the CPU kernels only"):
        sdpa(q, q, q, dropout_p=0.1)


def test_dropout_mask_errors_name_the_argument():
    with pytest.raises(ValueError, match="dropout_p must be a probability"):
        functional.dropout_mask((3, 3), 1.0, 0)
    with pytest.raises(TypeError, match="seed must be an int"):
        functional.dropout_mask((3, 3), 0.1, 0.5)
    with pytest.raises(ValueError, match=r"shape must be \[\.\.\., L_q, L_k\]"):
        functional.dropout_mask((3,), 0.1, 0)


def test_multihead_attention_drops_in_training_only():
    torch.manual_seed(0)
    layer = attnlab.nn.MultiheadAttention(16, 16, 2, dropout=0.5)
    x = torch.randn(2, 12, 16)
    layer.eval()
    first, w = layer(x, return_attention=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 12))
    layer.train()
    torch.manual_seed(1)
    trained, w = layer(x, return_attention=True)
    assert not torch.allclose(first, trained)
    assert (w == 0).any() and (w.max() > 1 / 12)
    torch.manual_seed(1)
    again, _ = layer(x, return_attention=True)
    assert torch.equal(trained, again)
    with pytest.raises(ValueError, match="dropout must be a probability"):
        attnlab.nn.MultiheadAttention(16, 16, 2, dropout=1.0)
