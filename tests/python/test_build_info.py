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
