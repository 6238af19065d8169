"""Plumbing shared by the tutorial modules: showing figures, reading notebook globals, checks."""

from __future__ import annotations

import sys

import torch


def show_or_return(fig, show: bool):
    """The tutorials' plotting helpers end with ``plt.show()`` and return nothing. Ours build a
    matplotlib Figure; with ``show=True`` it is displayed when running under IPython/Jupyter and
    ``None`` is returned (so a notebook cell does not display it twice); with ``show=False``
    the Figure is returned, undisplayed (for scripts, tests, saving)."""
    if not show:
        return fig
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    if get_ipython() is not None:
        display(fig)
    return None


_MISSING = object()


def from_notebook(name: str, value, function: str, default=_MISSING):
    """``value`` if given, else the notebook's global ``name`` (the ``__main__`` namespace),
    as the tutorial's own function reads it; a clear error when neither exists."""
    if value is not None:
        return value
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, name):
        return getattr(main, name)
    if default is not _MISSING:
        return default
    raise ValueError(f"{function}: pass {name}=..., or define {name} in the notebook as the "
                     f"tutorial does (it is read from the notebook's globals when not passed)")


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` when it is an integer >= ``minimum``; a ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_tensor(name: str, value) -> torch.Tensor:
    """``value`` when it is a tensor; a TypeError naming it otherwise."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value
