import torch

import attnlab


def test_build_info_names_the_torch_it_was_built_against():
    info = attnlab.build_info()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["cuda_archs"], list)
    assert info["cuda"] == bool(info["cuda_archs"])
    assert attnlab.__version__ == info["version"]
    # Read by the C++ library from the folder libtorch_cpu was loaded from.
    assert info["torch_loaded"] == torch.__version__


def test_kernels_share_torchs_openmp_threads():
    # at::parallel_for runs serially in code compiled without OpenMP: the library must be built
    # with it whenever torch's intra-op backend is OpenMP.
    uses_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    assert attnlab.build_info()["openmp"] == uses_openmp


def test_float32_products_named_by_what_the_cpu_has():
    # attnlab's own float32 GEMM needs AVX-512 F, BW, VL and DQ (read here from /proc/cpuinfo,
    # which the library does not use: it asks the CPU itself).
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), None)
    except OSError:
        flags = None
    route = attnlab.build_info()["cpu_float32_products"]
    assert route in ("avx512", "blas")
    if flags is not None:
        has = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
        assert route == ("avx512" if has else "blas")
