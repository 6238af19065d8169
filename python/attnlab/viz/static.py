"""The viewers' two views as static matplotlib figures, for papers: each function returns a
:class:`matplotlib.figure.Figure` (no pyplot state), which ``fig.savefig("x.pdf")`` writes as
PNG, SVG or PDF. Input and numbering as in :func:`attnlab.viz.head_view`."""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._colours import head_colours
from ._data import HEATMAP_THRESHOLD, MODES, prepare, resolve_mode

LABELLED_TOKENS = 64  # heat maps label their axes with the tokens up to this many


def _one(value, name: str, allow_all: bool = False):
    if allow_all and value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        also = ' or "all"' if allow_all else ""
        raise TypeError(f"{name} must be an index into the maps{also}, got {value!r}")
    return int(value)


_SYMBOLS = {"\n": "↵", "\t": "⇥", "\r": "␍", "\u2028": "␤", "\u2029": "␤", "\x85": "␤",
            "\x7f": "␡", **{chr(c): chr(0x2400 + c) for c in range(32) if chr(c) not in "\n\t\r"}}


def _clip(token: str, length: int = 18) -> str:
    """A token as a label, as the viewer shows it: on one line (line breaks and control
    characters as symbols), ∅ when empty, ␣ for the spaces of an all-space token, cut to
    ``length`` characters."""
    if token == "":
        return "∅"
    line = "".join(_SYMBOLS.get(c, c) for c in token)
    if token.strip() == "":
        line = "".join("␣" if c.isspace() else c for c in line)
    return line if len(line) <= length else line[:length - 1] + "…"


def head_view_figure(maps, tokens, key_tokens=None, *, batch: int = 0, layer: int = 0,
                     head=0, mode: str = "auto", threshold: int = HEATMAP_THRESHOLD,
                     max_tokens: int | None = None, title: str | None = None,
                     figsize: tuple[float, float] | None = None) -> Figure:
    """One layer's attention for one batch entry: ``head`` (an index, or ``"all"`` for every
    head overlaid in its colour) drawn as lines from the query tokens (left) to the key
    tokens (right), each line's opacity its weight (maps with weights above 1 are scaled by
    their largest), or, with ``mode="heatmap"`` (``"auto"``: above ``threshold`` tokens), as a
    queries × keys image (query 0 at the top; ``"all"`` shows the mean of the heads) with a
    colour bar. Returns a Figure with one axes (lines) or two (heat map and colour bar)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    batch, layer = _one(batch, "batch"), _one(layer, "layer")
    head = _one(head, "head", allow_all=True)
    data = prepare(maps, tokens, key_tokens, batch=batch, layers=layer,
                   heads=None if head is None else head, max_tokens=max_tokens)
    weights = data.weights[0, 0]  # [heads, Q, K]
    queries, keys = weights.shape[1:]
    query_tokens, key_tokens = data.query_tokens[0], data.key_tokens[0]
    drawn = resolve_mode(mode, queries, keys, threshold)
    what = "all heads" if head is None else f"head {data.heads[0]}"
    label = title if title is not None else f"layer {data.layers[0]}, {what}"

    if drawn == "heatmap":
        shown = weights.mean(0)
        if figsize is None:
            side = min(9.0, max(3.5, 0.22 * max(queries, keys) + 2.0))
            figsize = (side + 1.2, side * min(2.0, max(0.5, queries / keys)))
        fig = Figure(figsize=figsize, layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(shown, cmap="viridis", vmin=0, interpolation="nearest",
                          aspect="auto" if queries != keys else "equal")
        if queries <= LABELLED_TOKENS:
            ax.set_yticks(range(queries), [_clip(t) for t in query_tokens], fontsize=7)
        if keys <= LABELLED_TOKENS:
            ax.set_xticks(range(keys), [_clip(t) for t in key_tokens], fontsize=7, rotation=90)
        ax.set(xlabel="key", ylabel="query")
        fig.colorbar(image, ax=ax, shrink=0.8,
                     label="mean weight" if head is None and len(data.heads) > 1 else "weight")
        ax.set_title(label + (" (mean)" if head is None and len(data.heads) > 1 else ""),
                     fontsize=10)
        return fig

    rows = max(queries, keys)
    if figsize is None:
        figsize = (5.5, 0.24 * rows + 1.0)
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.subplots()
    scale = max(1.0, float(weights.max()))  # opacity = weight; larger maps scaled to fit
    palette = head_colours(maps[0].shape[1])  # a head keeps its colour whatever is shown
    colours = [palette[h] for h in data.heads]
    overlay = weights.shape[0] > 1
    for colour, head_map in zip(colours, weights):
        q_idx, k_idx = np.nonzero(head_map / scale >= 1 / 512)
        alpha = (head_map[q_idx, k_idx] / scale) * (0.8 if overlay else 1.0)
        segments = np.stack([np.stack([np.zeros_like(q_idx, dtype=float), -q_idx], 1),
                             np.stack([np.ones_like(k_idx, dtype=float), -k_idx], 1)], 1)
        rgba = np.zeros((len(alpha), 4))
        rgba[:, :3] = to_rgb(colour)
        rgba[:, 3] = alpha
        ax.add_collection(LineCollection(segments, colors=rgba,
                                         linewidths=1.2 if overlay else 1.8))
    for i, token in enumerate(query_tokens):
        ax.text(-0.03, -i, _clip(token), ha="right", va="center", fontsize=8, family="monospace")
    for i, token in enumerate(key_tokens):
        ax.text(1.03, -i, _clip(token), ha="left", va="center", fontsize=8, family="monospace")
    ax.text(-0.03, 1, "query", ha="right", va="bottom", fontsize=8, color="0.4")
    ax.text(1.03, 1, "key", ha="left", va="bottom", fontsize=8, color="0.4")
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylim(-rows + 0.4, 1.8)
    ax.set_axis_off()
    if overlay:
        ax.legend(handles=[Line2D([], [], color=c, linewidth=2, label=f"head {h}")
                           for c, h in zip(colours, data.heads)],
                  loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=min(6, len(colours)),
                  fontsize=7, frameon=False)
    ax.set_title(label, fontsize=10)
    return fig


def model_view_figure(maps, tokens=None, key_tokens=None, *, batch: int = 0, layers=None,
                      heads=None, max_tokens: int | None = None, title: str | None = None,
                      figsize: tuple[float, float] | None = None) -> Figure:
    """Every layer (rows) and head (columns) of one batch entry as small heat maps (query 0
    at the top, keys across), each scaled to its own largest weight, as in the viewer's model
    view. ``tokens`` may be left out here (they are not drawn). Returns a Figure with one
    axes per layer × head."""
    if tokens is None and isinstance(maps, (tuple, list)) and maps and hasattr(maps[0], "shape") \
            and len(maps[0].shape) == 4:
        tokens = [str(i) for i in range(maps[0].shape[2])]
        if key_tokens is None and maps[0].shape[3] != maps[0].shape[2]:
            key_tokens = [str(i) for i in range(maps[0].shape[3])]
    batch = _one(batch, "batch")
    data = prepare(maps, tokens, key_tokens, batch=batch, layers=layers, heads=heads,
                   max_tokens=max_tokens)
    weights = data.weights[0]  # [L, H, Q, K]
    n_layers, n_heads, queries, keys = weights.shape
    if figsize is None:
        side = 1.6 if n_heads <= 8 else 1.1
        figsize = (side * n_heads + 0.6, side * n_layers * min(2.0, max(0.5, queries / keys))
                   + (0.5 if title else 0.2))
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    for l, layer_name in enumerate(data.layers):
        for h, head_name in enumerate(data.heads):
            ax = axes[l][h]
            ax.imshow(weights[l, h], cmap="viridis", vmin=0, interpolation="nearest",
                      aspect="equal" if queries == keys else "auto")
            ax.set_xticks([])
            ax.set_yticks([])
            if l == 0:
                ax.set_title(f"head {head_name}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer_name}", fontsize=8)
    if title:
        fig.suptitle(title)
    return fig
