"""attnlab's own float32 CPU GEMM as a torch.mm look-alike, for the benchmarks: the rate they hold
the attention kernels to beside torch.mm's (a BLAS need not use all of a CPU's vector width)."""

import torch

from . import _C


def _operand(x: torch.Tensor, name: str):
    """(transposed, leading dimension) of a 2-D float32 CPU matrix with unit stride along one of
    its dimensions."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name}: expected a 2-D float32 CPU tensor, got {x.dim()}-D "
                         f"{x.dtype} on {x.device}")
    rows, cols = x.shape
    if x.stride(1) == 1 or cols <= 1:
        return False, max(x.stride(0), cols, 1)
    if x.stride(0) == 1 or rows <= 1:
        return True, max(x.stride(1), rows, 1)
    raise ValueError(f"{name}: expected unit stride along one dimension, got strides {x.stride()}")


def _overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether the byte ranges that x and y span (first to last element) intersect."""
    if x.numel() == 0 or y.numel() == 0:
        return False

    def span(t):
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()
    (x0, x1), (y0, y1) = span(x), span(y)
    return x0 < y1 and y0 < x1


def float32_fma_peak(seconds: float = 0.05) -> float:
    """This CPU's float32 multiply-add peak on torch's intra-op threads, GFLOP/s: independent
    FMAs on registers alone (AVX-512, else AVX2; 0.0 without either), all threads at once for
    about ``seconds``, their rates summed. No float32 product can run faster."""
    if not seconds > 0:
        raise ValueError(f"seconds: expected a positive duration, got {seconds}")
    return _C._float32_fma_peak(float(seconds))


def float32_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b for 2-D float32 CPU tensors (either may be a transposed view) through attnlab's
    float32 products (``build_info()["cpu_float32_products"]``) on torch's intra-op threads,
    written into out (contiguous, a.shape[0] × b.shape[1]) when given."""
    trans_a, lda = _operand(a, "a")
    trans_b, ldb = _operand(b, "b")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"b: expected {k} rows to match a's {k} columns, got {k2}")
    if out is None:
        out = torch.empty(m, n)
    elif out.shape != (m, n) or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.device.type != "cpu":
        raise ValueError(f"out: expected a contiguous float32 CPU tensor of shape ({m}, {n}), "
                         f"got {tuple(out.shape)} {out.dtype}")
    for name, x in (("a", a), ("b", b)):
        if _overlap(out, x):
            raise ValueError(f"out: must not share memory with {name} (the product would read "
                             "what it has already overwritten)")
    _C._float32_gemm(trans_a, trans_b, m, n, k, a.data_ptr(), lda, b.data_ptr(), ldb,
                     out.data_ptr(), max(n, 1))
    return out
