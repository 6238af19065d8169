"""attnlab: fast, correct attention cores in C++ for PyTorch, with the attention maps in view."""

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from . import _C, _ops  # noqa: F401  (_C registers torch.ops.attnlab; _ops their fake kernels)
from . import interpret, nn
from .functional import scaled_dot_product_attention

__version__ = _C.build_info()["version"]


def build_info() -> dict:
    """How this attnlab was built: ``version``, ``torch`` (the version compiled against),
    ``cuda`` (whether CUDA kernels are compiled in) and ``cuda_archs``."""
    return _C.build_info()


__all__ = ["nn", "interpret", "scaled_dot_product_attention", "build_info", "__version__"]
