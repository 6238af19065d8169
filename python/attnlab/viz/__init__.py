"""Attention maps you can look at: an interactive viewer that needs nothing but a browser, and
the same views as static matplotlib figures.

Input everywhere: ``maps``, a tuple (or list) with one ``[batch, heads, queries, keys]``
tensor per layer, as a Hugging Face model returns with ``output_attentions=True`` (or
``attnlab.nn.TransformerEncoder.get_attention_maps``), and ``tokens``, the query tokens
(plus ``key_tokens`` for cross-attention).

- :func:`head_view` / :func:`model_view` return an :class:`AttentionViewer`: one
  self-contained HTML page (script, style and data inline; it loads nothing from the
  network) that displays inline in Jupyter, ``.save("attention.html")`` writes to a file and
  ``.html`` gives as a string.
- :func:`summary_view` draws a long input (thousands to tens of thousands of tokens) from the
  summaries ``attnlab.interpret.summarize`` collects instead of its maps: the pooled map with
  the exact weights of chosen blocks, attention received, entropy and top-k keys, in one page
  of the same kind.
- :mod:`attnlab.viz.static`: :func:`~attnlab.viz.static.head_view_figure` and
  :func:`~attnlab.viz.static.model_view_figure`, matplotlib Figures for PNG, SVG or PDF.
- :func:`save_maps` / :func:`load_maps`: the ``attention_maps.pt`` that experiments write
  into their run folder, which ``python -m attnlab view RUN_DIR`` turns into a page.
"""

from . import static
from .files import FILE_NAME, load_maps, save_maps
from .html import AttentionViewer, head_view, model_view
from .summary import summary_view

__all__ = ["head_view", "model_view", "summary_view", "AttentionViewer", "static", "save_maps",
           "load_maps", "FILE_NAME"]
