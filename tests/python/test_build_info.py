import torch

import attnlab


def test_build_info_names_the_torch_it_was_built_against():
    info = attnlab.build_info()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["cuda_archs"], list)
    assert info["cuda"] == bool(info["cuda_archs"])
    assert attnlab.__version__ == info["version"]
