"""The CPU operators hand large attention weights out of a small pool of freed buffers (fresh
pages cost the kernel's zeroing on every call). Whatever the pool does, every weights tensor
must hold its own call's values, stay valid as long as it is referenced, and behave as any
other tensor."""

import io
import sys
from pathlib import Path

import pytest
import torch

import attnlab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/python: reference.py
from reference import attention  # noqa: E402

# 4 × 2 × 512 × 512 float32 = 8 MiB of weights: above the 2 MiB from which buffers are pooled.
SHAPE = (4, 2, 512, 32)


def inputs(seed, shape=SHAPE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(3)]


def check(weights, q, k, v, **kwargs):
    _, expected = attention(q, k, v, **kwargs)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_weights_alive_together_are_distinct_and_each_correct(normalizer):
    held = []
    for seed in range(6):  # more than the pool keeps: some new, some reused
        q, k, v = inputs(seed)
        _, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True,
                                                    normalizer=normalizer)
        held.append((w, q, k, v))
    pointers = {w.data_ptr() for w, *_ in held}
    assert len(pointers) == len(held)  # no two live tensors share memory
    for w, q, k, v in held:
        if normalizer == "softmax":
            check(w, q, k, v)
        else:  # rows of a probability simplex with exact zeros; values in test_sparse_attention
            assert (w >= 0).all() and torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)


def test_a_freed_buffer_serves_the_next_call_with_that_calls_values():
    q, k, v = inputs(0)
    _, first = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
    address = first.data_ptr()
    del first
    # The next call of the same size (or up to half of it) may take the freed buffer; its
    # values must be its own, including where a causal mask leaves zeros.
    for seed, shape, causal in [(1, SHAPE, True), (2, (3, 2, 512, 32), False),
                                (3, SHAPE, False)]:
        q, k, v = inputs(seed, shape)
        _, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True, is_causal=causal)
        check(w, q, k, v, is_causal=causal)
        if causal:
            assert (w.triu(1) == 0).all()
        reused = w.data_ptr() == address
        del w
    assert isinstance(reused, bool)


def test_pooled_weights_behave_as_ordinary_tensors():
    q, k, v = inputs(4)
    _, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
    expected = w.clone()
    assert w.is_contiguous() and w.device.type == "cpu" and w.dtype == torch.float32
    view = w[1:, :, 100:]
    del w  # a view keeps the buffer alive
    q2, k2, v2 = inputs(5)
    _, other = attnlab.scaled_dot_product_attention(q2, k2, v2, need_weights=True)
    assert torch.equal(view, expected[1:, :, 100:])
    array = view.numpy()  # shares the memory
    assert array.shape == tuple(view.shape) and float(array[0, 0, 0, 0]) == float(view[0, 0, 0, 0])
    buffer = io.BytesIO()
    torch.save(view, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer), view)
    view.mul_(2)  # writable
    assert torch.equal(view, expected[1:, :, 100:] * 2)
    check(other, q2, k2, v2)


@pytest.mark.parametrize("shape", [SHAPE, (4, 2, 512, 256)])
def test_gradients_with_pooled_weights(shape):
    # With E_v = 256 >= L_k / 2 the forward keeps its probabilities (a pooled buffer) for the
    # backward; with E_v = 32 the backward recomputes them. The output's gradients must match
    # the reference either way.
    q, k, v = (t.requires_grad_() for t in inputs(6, shape))
    grad = torch.randn(shape[:-1] + (shape[-1],), generator=torch.Generator().manual_seed(7))
    for _ in range(3):  # the later calls run on buffers freed by the earlier ones
        out, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
        assert w.requires_grad
        mine = torch.autograd.grad(out, (q, k, v), grad)
        del out, w
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    out_d, _ = attention(qd, kd, vd)
    theirs = torch.autograd.grad(out_d, (qd, kd, vd), grad.double())
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("len_q, len_k", [(512, 512), (384, 512), (512, 528), (300, 512), (300, 520)])
def test_weights_over_a_poisoned_buffer(threads, is_causal, len_q, len_k):
    # With L_k a multiple of 16 a query block's weights are written while its P·V product runs
    # (the rest when the block ends), and under the causal mask its zeros past its last visible
    # key while the thread's later products run (the rest when its share of the work ends):
    # over a reused buffer full of NaN every one of them must be there when the call returns.
    # (L_k = 520 writes them with the rows; L_q = 300 ends on a query block whose last visible
    # key is not on a 64-byte line.)
    shape_q, shape_k = (3, 2, len_q, 32), (3, 2, len_k, 32)
    poison_shape = (3, 2, len_q, len_k)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, _, _ = inputs(8, shape_q)
        _, k, v = inputs(9, shape_k)
        # As many buffers of this size as the pool keeps (it keeps 4), all NaN, all freed.
        poisoned = [attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)[1]
                    for _ in range(4)]
        for w in poisoned:
            assert w.shape == poison_shape
            w.fill_(float("nan"))
        addresses = {w.data_ptr() for w in poisoned}
        del poisoned, w
        _, w = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True,
                                                    is_causal=is_causal)
        assert w.data_ptr() in addresses  # the pool handed a NaN buffer back: the case tested
        check(w, q, k, v, is_causal=is_causal)
        if is_causal:
            hidden = torch.ones(len_q, len_k, dtype=torch.bool).triu(len_k - len_q + 1)
            assert (w.masked_select(hidden) == 0).all()
    finally:
        torch.set_num_threads(previous)
