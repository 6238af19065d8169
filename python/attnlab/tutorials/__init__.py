"""The four tutorials attnlab's users come from, under their own names, signatures, return orders
and mask conventions: replace a tutorial's definitions with one import and the rest of its
notebook runs unchanged, on attnlab's operators.

- ``attnlab.tutorials.uvadl``: UvA DL "Transformers and Multi-Head Attention". Masks of any
  dtype, ``mask == 0`` blocked (a float ``torch.tril(torch.ones(L, L))`` is causal).
- ``attnlab.tutorials.neuromatch``: Neuromatch W1D5 Tutorial 3 "Attention". No masks.
- ``attnlab.tutorials.permutation_lab``: the permutation-composition attention lab. Boolean
  masks, ``True`` = blocked (``get_autoregressive_mask`` is True above the diagonal).
- ``attnlab.tutorials.nyu``: the NYU self-attention notebook. No masks.

Each module converts its tutorial's masks at its boundary. The core
(``attnlab.scaled_dot_product_attention``, ``attnlab.nn``) keeps one convention, that of
``torch.nn.functional.scaled_dot_product_attention``: boolean ``True`` = may attend, a float
mask is added to the scores. A query whose keys are all masked gets zeros everywhere in attnlab
(the tutorials give uniform weights or NaN there). Each module's docstring lists the differences
that remain. The modules are imported on first use (``uvadl`` imports Lightning).
"""

import importlib

__all__ = ["uvadl", "neuromatch", "permutation_lab", "nyu"]


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
