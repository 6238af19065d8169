"""The operators called from 4 Python threads at once give results bitwise identical to serial
calls, forward and backward, whatever torch.set_num_threads says."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import attnlab

THREADS = 4
ROUNDS = 3  # each thread runs every problem this many times, in its own order


def problems():
    """Attention and additive-score problems of varied shapes, masks and dtypes."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    cases = []
    for batch, len_q, len_k, dim, dtype, mask, causal, weights in [
        ((2, 4), 33, 70, 16, torch.float32, None, False, False),
        ((1,), 300, 520, 32, torch.float32, "bool", True, False),  # fewer entries than threads
        ((8, 2), 16, 16, 8, torch.float64, "float", False, True),
        ((), 129, 65, 64, torch.float32, "float", True, True),
    ]:
        q, k, v = randn(*batch, len_q, dim, dtype=dtype), randn(*batch, len_k, dim, dtype=dtype), \
            randn(*batch, len_k, dim // 2, dtype=dtype)
        attn_mask = {None: None, "bool": torch.rand(len_q, len_k, generator=gen) > 0.2,
                     "float": randn(len_q, len_k, dtype=dtype)}[mask]
        cases.append(("attention", (q, k, v, attn_mask, causal, weights), randn(*batch, len_q, dim // 2, dtype=dtype)))
    for batch, len_q, len_k, hidden in [(4, 20, 30, 16), (1, 90, 70, 33)]:
        cases.append(("additive", (randn(batch, len_q, hidden), randn(batch, len_k, hidden), randn(hidden)),
                      randn(batch, len_q, len_k)))
    return cases


def run(problem):
    """Forward outputs and the gradients of every differentiable input."""
    kind, args, grad_output = problem
    if kind == "attention":
        q, k, v, mask, causal, need_weights = args
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        if mask is not None and mask.is_floating_point():
            mask = mask.detach().requires_grad_()
            leaves.append(mask)
        output, weights = attnlab.scaled_dot_product_attention(*leaves[:3], mask, causal,
                                                               need_weights=need_weights)
        outputs = [output.detach()] + ([weights] if need_weights else [])
    else:
        leaves = [t.detach().requires_grad_() for t in args]
        output = torch.ops.attnlab.additive_scores(*leaves)
        outputs = [output.detach()]
    return outputs + list(torch.autograd.grad(output, leaves, grad_output))


def assert_bitwise_equal(results, expected):
    for got, want in zip(results, expected):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@pytest.fixture
def restore_num_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("num_threads", [1, 2, 4])
def test_four_threads_at_once_match_serial_calls_bitwise(num_threads, restore_num_threads):
    torch.set_num_threads(num_threads)
    cases = problems()
    serial = [run(problem) for problem in cases]

    def worker(shift):  # every thread walks the problems from another starting point
        order = [(shift + i) % len(cases) for i in range(len(cases))] * ROUNDS
        return [(index, run(cases[index])) for index in order]

    with ThreadPoolExecutor(THREADS) as pool:
        for results in pool.map(worker, range(THREADS)):
            for index, result in results:
                assert_bitwise_equal([result], [serial[index]])


def test_other_thread_counts_same_forward_and_gradients_to_rounding(restore_num_threads):
    # Each forward output row is computed by one thread from the same blocks: the thread
    # count changes who computes it, not how. Some gradients (attention's dQ when the batch
    # has fewer entries than threads, the additive weight's) add per-thread partial sums,
    # whose order follows the thread count: equal to rounding, bitwise for a fixed count.
    cases = problems()
    results = {}
    for num_threads in (1, 2, 4):
        torch.set_num_threads(num_threads)
        results[num_threads] = [run(case) for case in cases]
    for num_threads in (2, 4):
        for (kind, *_), got, want in zip(cases, results[num_threads], results[1]):
            if kind == "attention":
                assert torch.equal(got[0], want[0])
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
