import torch

import attnlab
import cpuinfo


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


def test_float32_products_and_vector_kernels_named_by_what_the_cpu_has():
    # attnlab's own float32 GEMM and the AVX-512 kernels need AVX-512 F, BW, VL and DQ; the AVX2
    # kernels AVX2 and FMA (read here from /proc/cpuinfo, without the AVX-512 flags under
    # ATTNLAB_CPU_ISA=avx2, which the library does not use: it asks the CPU itself).
    flags = cpuinfo.cpu_flags()
    info = attnlab.build_info()
    route, kernels = info["cpu_float32_products"], info["cpu_vector_kernels"]
    assert route in ("avx512", "blas")
    assert kernels in ("avx512", "avx2", "generic")
    if flags:
        has = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
        assert route == ("avx512" if has else "blas")
        expected = "avx512" if has else "avx2" if {"avx2", "fma"} <= set(flags) else "generic"
        assert kernels == expected


def test_clone_targets_name_the_build():
    # The package's kernels are cloned for AVX-512, AVX2 and baseline x86-64; the AVX2-only build
    # (tests/avx2_only_build.sh) has no AVX-512 clone and never chooses AVX-512 kernels.
    info = attnlab.build_info()
    targets = info["cpu_clone_targets"]
    if not targets:  # not x86-64 with GCC: nothing is cloned
        assert info["cpu_vector_kernels"] == "generic"
    elif targets == "x86-64-v3,default":
        assert info["cpu_vector_kernels"] in ("avx2", "generic")
        assert info["cpu_float32_products"] == "blas"
    else:
        assert targets == "x86-64-v4,x86-64-v3,default"
