"""attnlab: fast, correct attention cores in C++ for PyTorch, with the attention maps in view."""

import os

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from ._compat import load_core

_C = load_core()  # registers torch.ops.attnlab; a torch it does not fit is named in one line
from . import _ops  # noqa: E402  (fake kernels of the operators _C registered)
from . import interpret, nn  # noqa: E402
from .functional import (AttentionSummary, WeightSummary,  # noqa: E402
                         scaled_dot_product_attention)

__version__ = _C.build_info()["version"]


def build_info() -> dict:
    """How this attnlab was built: ``version``, ``torch`` (the version compiled against),
    ``torch_loaded`` (the torch this process runs), ``cuda`` (whether CUDA kernels are compiled
    in), ``cuda_archs``, ``openmp``, and ``cpu_bf16_products``: where this CPU runs the products
    of bfloat16 attention, chosen at run time (``"amx"``: AMX-BF16 tiles through torch's oneDNN
    brgemm, off with ``ATTNLAB_CPU_BRGEMM=0``; ``"onednn_brgemm"``: the same route without AMX,
    only with ``ATTNLAB_CPU_BRGEMM=1``; ``"avx512_bf16"``: vdpbf16ps, where it outruns float32
    FMAs; ``"float32"``: widened, where the CPU lacks AVX512-BF16 or its products are no faster;
    ``ATTNLAB_CPU_BF16_PRODUCTS=1`` or ``0`` forces them on or off), and
    ``cpu_bf16_product_speedup``: the multiply-add rate of vdpbf16ps over float32 FMAs on this
    CPU, measured once at run time (0 without AVX512-BF16), and ``cpu_float32_products``:
    ``"avx512"`` where float32 products run in attnlab's own AVX-512 GEMM (the fused encoder
    block's results are then bitwise the same for every thread count), else ``"blas"``, and
    ``cpu_vector_kernels``: the code the small-shape kernels and the softmax's row passes run
    (``"avx512"``, ``"avx2"`` on CPUs with AVX2 and FMA but no AVX-512, or ``"generic"``), and
    ``cpu_clone_targets``: the instruction sets its multi-versioned kernels were compiled for
    (``"x86-64-v4,x86-64-v3,default"``; ``"x86-64-v3,default"`` in the AVX2-only build of
    ``tests/avx2_only_build.sh``, which runs as an AVX2-only CPU would).
    ``ATTNLAB_CPU_ISA=avx2`` in the environment before the import makes attnlab choose its
    kernels as on an AVX2 CPU (``"avx2"``, ``"blas"``, bfloat16 products widened), to test or
    time those paths on an AVX-512 machine."""
    return _C.build_info()


def cmake_prefix_path() -> str:
    """The folder to add to CMake's ``CMAKE_PREFIX_PATH`` so that ``find_package(attnlab)``
    finds the installed C++ API (headers, ``libattnlab.so`` and the ``attnlab::attnlab``
    target), as ``torch.utils.cmake_prefix_path`` does for torch."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake")


__all__ = ["nn", "interpret", "scaled_dot_product_attention", "WeightSummary", "AttentionSummary", "build_info", "cmake_prefix_path",
           "__version__"]
