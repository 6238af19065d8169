"""Figures from tensors. Every function returns a matplotlib Figure (no pyplot state), which
notebooks display and the command line saves as PNG."""

from __future__ import annotations

from typing import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def attention_grid(maps: Sequence[torch.Tensor], tokens: Sequence[str] | None = None,
                   index: int = 0, title: str | None = None) -> Figure:
    """Rows = layers, columns = heads: the attention of example ``index``, query on the y axis
    (``origin="lower"``), key on the x axis, tick labels = the input tokens."""
    if len(maps) == 0:
        raise ValueError("attention_grid needs at least one layer's map")
    layers, heads = len(maps), maps[0].shape[1]
    fig = Figure(figsize=(3.2 * heads + 0.8, 3.0 * layers + 0.6), layout="constrained")
    axes = fig.subplots(layers, heads, squeeze=False)
    for layer, layer_maps in enumerate(maps):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(layer_maps[index, head].detach().cpu().float().numpy(),
                              origin="lower", vmin=0, cmap="viridis")
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            if tokens is not None:
                positions = range(len(tokens))
                ax.set_xticks(positions, tokens, fontsize=7, rotation=90)
                ax.set_yticks(positions, tokens, fontsize=7)
            ax.set_xlabel("key")
            ax.set_ylabel("query")
            fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def training_curves(history: Sequence[dict], metric: str = "accuracy") -> Figure:
    """Train loss, and the validation metric per epoch (with the training one, measured
    during training, when the history has it)."""
    epochs = [h["epoch"] for h in history]
    fig = Figure(figsize=(8, 3), layout="constrained")
    loss_ax, metric_ax = fig.subplots(1, 2)
    loss_ax.plot(epochs, [h["train_loss"] for h in history], marker="o")
    loss_ax.set(xlabel="epoch", ylabel="train loss", yscale="log", title="training loss")
    metric_ax.plot(epochs, [h[metric] for h in history], marker="o", color="tab:green",
                   label="validation")
    if all(f"train_{metric}" in h for h in history):
        metric_ax.plot(epochs, [h[f"train_{metric}"] for h in history], marker=".",
                       color="tab:gray", label="train (dropout on)")
        metric_ax.legend()
    metric_ax.set(xlabel="epoch", ylabel=metric, title=metric)
    return fig


def image_sets(images: torch.Tensor, probabilities: torch.Tensor, names: Sequence[Sequence[str]],
               title: str | None = None) -> Figure:
    """One row per set: its images with the class name and the model's probability of being
    the odd one out; the true anomaly (last) is framed in green, the model's pick, when it
    differs, in red. images [S, N, H, W] (grey) or [S, N, 3, H, W] (colour), probabilities
    [S, N]."""
    sets, size = images.shape[:2]
    if sets == 0:
        raise ValueError("image_sets needs at least one set")
    fig = Figure(figsize=(1.3 * size, 1.55 * sets + 0.5), layout="constrained")
    axes = fig.subplots(sets, size, squeeze=False)
    for s in range(sets):
        pick = int(probabilities[s].argmax())
        for i in range(size):
            ax = axes[s][i]
            if images.dim() == 5:
                ax.imshow(images[s, i].permute(1, 2, 0).cpu().numpy())
            else:
                ax.imshow(images[s, i].cpu().numpy(), cmap="gray_r")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{names[s][i]}\np={float(probabilities[s, i]):.2f}", fontsize=7)
            color = "tab:green" if i == size - 1 else ("tab:red" if i == pick else None)
            for spine in ax.spines.values():
                spine.set_visible(color is not None)
                if color:
                    spine.set_color(color)
                    spine.set_linewidth(3)
    if title:
        fig.suptitle(title)
    return fig


def attention_map(weights: torch.Tensor, query_tokens: Sequence[str] | None = None,
                  key_tokens: Sequence[str] | None = None,
                  marked: Sequence[tuple[int, int]] = (), title: str | None = None) -> Figure:
    """One map [queries, keys] (query on the y axis, ``origin="lower"``) with the cells
    (query, key) in ``marked`` framed in red."""
    if weights.dim() != 2:
        raise ValueError(f"attention_map expects weights [queries, keys], got "
                         f"{list(weights.shape)}")
    queries, keys = weights.shape
    for query, key in marked:
        if not (0 <= query < queries and 0 <= key < keys):
            raise ValueError(f"marked cell ({query}, {key}) is outside the {queries}×{keys} map")
    fig = Figure(figsize=(0.28 * keys + 2.2, 0.28 * queries + 1.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(weights.detach().cpu().float().numpy(), origin="lower", vmin=0,
                      cmap="viridis")
    for query, key in marked:
        ax.add_patch(Rectangle((key - 0.5, query - 0.5), 1, 1, fill=False, edgecolor="red",
                               linewidth=1.5))
    if query_tokens is not None:
        ax.set_yticks(range(queries), query_tokens, fontsize=7)
    if key_tokens is not None:
        ax.set_xticks(range(keys), key_tokens, fontsize=7, rotation=90)
    ax.set(xlabel="key (input position)", ylabel="query (output position)")
    fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        ax.set_title(title, fontsize=9)
    return fig
