"""attnlab._gemm.float32_mm: the float32 GEMM the benchmarks hold the attention kernels to."""

import pytest
import torch

from attnlab._gemm import float32_mm
from cpuinfo import cpu_flags


def operand(rows, cols, transposed, gen):
    """A rows×cols float32 matrix, stored transposed (a .t() view) when asked."""
    if transposed:
        return torch.randn(cols, rows, generator=gen).t()
    return torch.randn(rows, cols, generator=gen)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 3, 7), (100, 17, 33), (37, 200, 64),
                                   (300, 40, 130), (6, 16, 0), (0, 5, 3)])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_float64_product(m, n, k, trans_a, trans_b, threads):
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a, b = operand(m, k, trans_a, gen), operand(k, n, trans_b, gen)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full((m, n), float("nan"))  # previous contents must be ignored
        result = float32_mm(a, b, out)
    finally:
        torch.set_num_threads(previous)
    assert result is out
    reference = a.double() @ b.double()
    scale = reference.abs().max().item() if reference.numel() else 0.0
    error = (out.double() - reference).abs().max().item() if out.numel() else 0.0
    assert error <= 1e-5 * max(scale, 1.0), (error, scale)


def test_strided_rows_are_read_with_their_leading_dimension():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(20, 50, generator=gen)[:, 3:35]  # rows 50 apart
    b = torch.randn(32, 40, generator=gen)[:, :24]
    torch.testing.assert_close(float32_mm(a, b), (a.double() @ b.double()).float(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a,b,out,match", [
    (torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 2), None, "a: expected a 2-D float32"),
    (torch.randn(4, 3), torch.randn(3), None, "b: expected a 2-D float32"),
    (torch.randn(4, 3), torch.randn(5, 2), None, "b: expected 3 rows"),
    (torch.randn(4, 6)[:, ::2], torch.randn(3, 2), None, "a: expected unit stride"),
    (torch.randn(4, 3), torch.randn(3, 2), torch.empty(2, 4), r"out: expected .* \(4, 2\)"),
    (torch.randn(4, 3), torch.randn(3, 2), torch.empty(2, 4).t(), "out: expected a contiguous"),
])
def test_bad_operands_are_named(a, b, out, match):
    with pytest.raises(ValueError, match=match):
        float32_mm(a, b, out)


def test_an_out_that_shares_memory_with_an_operand_is_refused():
    a = torch.randn(8, 8)
    with pytest.raises(ValueError, match="out: must not share memory with a"):
        float32_mm(a, torch.randn(8, 8), a)
    storage = torch.randn(128)
    b, out = storage[:64].view(8, 8), storage[32:96].view(8, 8)  # half of b under out
    with pytest.raises(ValueError, match="out: must not share memory with b"):
        float32_mm(torch.randn(8, 8), b, out)
    # Neighbours in one storage that do not overlap are fine.
    torch.testing.assert_close(float32_mm(torch.eye(8), storage[:64].view(8, 8),
                                          storage[64:].view(8, 8)),
                               storage[:64].view(8, 8))


def test_fma_peak_is_measured_where_the_cpu_has_fma_vectors():
    from attnlab._gemm import float32_fma_peak
    flags = cpu_flags()
    peak = float32_fma_peak(0.01)
    if "avx512f" in flags or ("avx2" in flags and "fma" in flags):
        # At least one 8-lane FMA every 10 ns on some thread: far below any such CPU's rate.
        assert peak > 1.6
    else:
        assert peak == 0.0


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_fma_peak_refuses_a_duration_that_is_not_positive(seconds):
    from attnlab._gemm import float32_fma_peak
    with pytest.raises(ValueError, match="seconds: expected a positive duration"):
        float32_fma_peak(seconds)
