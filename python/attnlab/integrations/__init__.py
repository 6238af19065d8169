"""Bridges from other libraries to attnlab's operators.

Each integration lives in its own submodule and imports its library only when imported itself,
so ``import attnlab`` never needs them:

- :mod:`attnlab.integrations.transformers`: an ``attn_implementation="attnlab"`` backend for
  Hugging Face ``transformers`` models (``pip install attnlab[hf]``).
"""
