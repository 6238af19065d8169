"""Looking past the raw attention maps: record every attention call with its gradient, and
turn the maps into relevance.

- :func:`record`: a context manager that keeps the weights of every
  ``attnlab.functional.scaled_dot_product_attention`` call and, after the backward, the
  gradient of the loss with respect to them (taken from the fused backward, no autograd graph
  over the ``L × L`` weights).
- :func:`rollout` and :func:`attention_flow` (Abnar & Zuidema 2020),
  :func:`gradient_relevance` (Chefer, Gur & Wolf 2021): tuples of maps
  ``[batch, heads, L, L]``, one per layer, to ``[batch, L, L]`` relevance.
- :func:`explain`: one call from a model to its relevance.
- :func:`summarize`: a context manager that collects summaries of every attention call's
  weights (received attention, entropy, top-k, pooled maps) from the fused kernel, at any
  length, without ``output_attentions``; with ``keep_inputs=True`` it can recompute the exact
  weights of any block afterwards (:meth:`Summaries.block_weights`), which
  :func:`attnlab.viz.summary_view` shows beside the summaries.

:func:`attention_flow` needs ``networkx``.
"""

from .explain import Explanation, explain
from .methods import attention_flow, gradient_relevance, rollout
from .recorder import Recorder, record
from .summaries import CallInputs, Summaries, summarize

__all__ = ["record", "Recorder", "rollout", "attention_flow", "gradient_relevance", "explain",
           "Explanation", "summarize", "Summaries", "CallInputs"]
