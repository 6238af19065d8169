"""Checks, before attnlab's compiled core is loaded, that it fits the torch in this process.

The core is C++ compiled against one torch release; torch's C++ ABI changes between releases,
so under another torch it would fail with an ``undefined symbol`` error or worse. The build
records what it was compiled against in ``attnlab/_build.py``; a mismatch becomes one clear
ImportError saying which torch is needed and how to rebuild."""

from __future__ import annotations

import re

import torch

REBUILD = ("rebuild attnlab against the installed torch: from its source folder, "
           "pip install --no-build-isolation --force-reinstall --no-deps .")


def release(version: str) -> str:
    """``"2.15.0"`` of ``"2.15.0+cu132"`` (local and pre-release suffixes dropped)."""
    match = re.match(r"\s*(\d+\.\d+\.\d+)", version)
    return match.group(1) if match else version


def problem(built: str, built_abi: int, built_cuda: bool, running: str, running_abi: int,
            running_cuda: bool) -> str | None:
    """Why a core built against torch ``built`` cannot load under torch ``running``, or None."""
    if release(built) != release(running):
        return (f"attnlab was built against torch {built} but torch {running} is installed; "
                f"install torch {release(built)}, or {REBUILD}")
    if built_abi != running_abi:
        return (f"attnlab was built with _GLIBCXX_USE_CXX11_ABI={built_abi} but torch {running} "
                f"uses {running_abi}; {REBUILD}")
    if built_cuda and not running_cuda:
        return (f"attnlab was built with CUDA kernels against torch {built}, but the installed "
                f"torch {running} has no CUDA; install a CUDA build of torch, or {REBUILD}")
    return None


def check_torch() -> None:
    """Raises ImportError (one line) when the installed torch does not fit the compiled core.
    A source checkout without ``_build.py`` (not built by CMake) is not checked."""
    try:
        from . import _build
    except ImportError:
        return
    reason = problem(_build.TORCH_VERSION, int(_build.CXX11_ABI), bool(_build.CUDA_KERNELS),
                     torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI),
                     torch.version.cuda is not None)
    if reason:
        raise ImportError(reason)


def load_core():
    """Imports ``attnlab._C`` (which loads libattnlab and registers the operators); a loader
    error becomes one line naming the torch the core needs."""
    check_torch()
    try:
        from . import _C
    except ImportError as error:  # e.g. "undefined symbol": a torch the check could not see
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        try:
            from . import _build
            needs = f"it was built against torch {_build.TORCH_VERSION}"
        except ImportError:
            needs = "it was built against another torch"
        raise ImportError(f"attnlab's compiled core does not load under torch "
                          f"{torch.__version__} ({first_line}); {needs}; {REBUILD}") from None
    return _C
