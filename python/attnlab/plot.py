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


def attention_side_by_side(maps: dict[str, torch.Tensor],
                           query_tokens: Sequence[str] | None = None,
                           key_tokens: Sequence[str] | None = None,
                           marked: Sequence[tuple[int, int]] = (), title: str | None = None
                           ) -> Figure:
    """One panel per name: maps [queries, keys] of the same shape side by side (query on the y
    axis, ``origin="lower"``, one colour scale from 0 to 1), weights that are *exactly* zero
    drawn white, the cells (query, key) in ``marked`` framed in red. Each panel's title gives
    the fraction of exact zeros in its map."""
    if not maps:
        raise ValueError("attention_side_by_side needs at least one map")
    shapes = {tuple(weights.shape) for weights in maps.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"attention_side_by_side expects maps [queries, keys] of one shape, got "
                         f"{sorted(shapes)}")
    queries, keys = next(iter(shapes))
    for query, key in marked:
        if not (0 <= query < queries and 0 <= key < keys):
            raise ValueError(f"marked cell ({query}, {key}) is outside the {queries}×{keys} map")
    import matplotlib
    import numpy as np
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # exact zeros
    fig = Figure(figsize=(0.26 * keys * len(maps) + 1.2 * len(maps) + 0.6,
                          0.26 * queries + 1.4), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, (name, weights) in zip(axes, maps.items()):
        values = weights.detach().cpu().double().numpy()
        image = ax.imshow(np.ma.masked_where(values == 0, values), origin="lower", vmin=0,
                          vmax=1, cmap=cmap)
        for query, key in marked:
            ax.add_patch(Rectangle((key - 0.5, query - 0.5), 1, 1, fill=False,
                                   edgecolor="red", linewidth=1.2))
        if query_tokens is not None:
            ax.set_yticks(range(queries), query_tokens, fontsize=6)
        if key_tokens is not None:
            ax.set_xticks(range(keys), key_tokens, fontsize=6, rotation=90)
        ax.set(xlabel="key", ylabel="query")
        ax.set_title(f"{name}\n{100 * (values == 0).mean():.0f} % exact zeros", fontsize=9)
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def _box_columns(ax, columns, top: float, bottom: float, color: str = "tab:red") -> None:
    """A rectangle around each of ``columns`` (data coordinates, one unit wide)."""
    for column in columns:
        ax.add_patch(Rectangle((column - 0.5, bottom), 1, top - bottom, fill=False,
                               edgecolor=color, linewidth=2))


def boolean_samples(bits: torch.Tensor, labels: torch.Tensor, targets: Sequence[int],
                    count: int = 16, title: str | None = None) -> Figure:
    """The first ``count`` samples as rows of black (1) and white (0) cells, the target columns
    boxed, the label beside each row. bits [N, T], labels [N]."""
    if bits.dim() != 2 or len(bits) == 0:
        raise ValueError(f"boolean_samples needs bits of shape [samples, T] with samples >= 1, "
                         f"got {list(bits.shape)}")
    shown = bits[:count].cpu()
    rows, length = shown.shape
    fig = Figure(figsize=(0.35 * length + 1.6, 0.3 * rows + 1.2), layout="constrained")
    ax, label_ax = fig.subplots(1, 2, width_ratios=[length, 1.5], sharey=True)
    ax.imshow(shown.numpy(), cmap="gray_r", vmin=0, vmax=1, aspect="auto")
    _box_columns(ax, [int(t) for t in targets], rows - 0.5, -0.5)
    ax.set_xticks(range(length))
    ax.set(xlabel="position (targets boxed)", ylabel="sample")
    label_ax.imshow(labels[:count].cpu().float().unsqueeze(1).numpy(), cmap="RdYlGn", vmin=0,
                    vmax=1, aspect="auto")
    for row, label in enumerate(labels[:count].tolist()):
        label_ax.text(0, row, str(int(label)), ha="center", va="center", fontsize=8)
    label_ax.set_xticks([])
    label_ax.set_title("label", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig


def last_token_attention(weights: torch.Tensor, labels: torch.Tensor, targets: Sequence[int],
                         title: str | None = None) -> Figure:
    """Left: the last token's weights over the inputs, one line per sample, coloured by label;
    right: their mean ± std per input for each label. Targets boxed. weights [B, T − 1]."""
    if weights.dim() != 2 or len(weights) != len(labels):
        raise ValueError(f"last_token_attention needs weights [samples, inputs] and one label "
                         f"per sample, got {list(weights.shape)} and {len(labels)} labels")
    weights, labels = weights.detach().cpu(), labels.cpu()
    positions = range(weights.shape[1])
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    lines_ax, mean_ax = fig.subplots(1, 2, sharey=True)
    for label, color in ((0, "tab:blue"), (1, "tab:orange")):
        chosen = weights[labels == label]
        if len(chosen) == 0:
            continue
        lines_ax.plot(positions, chosen.T.numpy(), color=color, alpha=0.08, linewidth=0.8)
        lines_ax.plot([], [], color=color, label=f"label {label}")
        mean_ax.errorbar(positions, chosen.mean(0).numpy(),
                         yerr=chosen.std(0).numpy() if len(chosen) > 1 else None, color=color,
                         marker="o", capsize=3, label=f"label {label} (n = {len(chosen)})")
    top = float(weights.max()) * 1.05
    for ax, name in ((lines_ax, "every sample"), (mean_ax, "mean ± std")):
        _box_columns(ax, [int(t) for t in targets], top, 0)
        ax.set_xticks(list(positions))
        ax.set(xlabel="input position (targets boxed)", title=name)
        ax.legend(fontsize=8)
    lines_ax.set_ylabel("attention weight of the last token")
    if title:
        fig.suptitle(title)
    return fig


def sparse_and_results(rows: Sequence[dict]) -> Figure:
    """The four results side by side: validation accuracy and loss per (model, s), mean ± std
    over seeds as bars, the tutorial's reference as black diamonds."""
    if len(rows) == 0:
        raise ValueError("sparse_and_results needs at least one row")
    names = [f"{row['model']}, s = {row['s']}\n{row['parameters']:,}\nparameters" for row in rows]
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    for ax, metric, scale in zip(fig.subplots(1, 2), ("accuracy", "loss"), ("linear", "log")):
        ax.bar(names, [row[f"val_{metric}_mean"] for row in rows],
               yerr=[row[f"val_{metric}_std"] for row in rows], capsize=4,
               color=["tab:green" if row["model"] == "SAT" else "tab:gray" for row in rows])
        references = [(i, row["reference"][1 if metric == "accuracy" else 2])
                      for i, row in enumerate(rows) if row.get("reference")]
        if references:
            ax.plot(*zip(*references), "kD", label="the tutorial's run")
            ax.legend(fontsize=8)
        ax.set(ylabel=f"validation {metric}", yscale=scale,
               title=f"validation {metric}, mean ± std over seeds")
    return fig


def sample_complexity(sweep: dict) -> Figure:
    """Validation accuracy against the number of training samples (log axis), mean ± std over
    the seeds for each model, with each seed's first size at 100 % marked below the curve.
    ``sweep`` as ``tasks.sparse_and.sample_complexity`` returns it."""
    sizes = sweep["sizes"]
    if not sweep["models"]:
        raise ValueError("sample_complexity needs at least one model in the sweep")
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    colors = {"SAT": "tab:green", "MLP": "tab:gray"}
    for offset, (name, model) in enumerate(sweep["models"].items()):
        color = colors.get(name, f"C{offset}")
        ax.errorbar(sizes, model["val_accuracy_mean"], yerr=model["val_accuracy_std"],
                    marker="o", capsize=3, color=color,
                    label=f"{name} ({model['parameters']:,} parameters)")
        firsts = [run["first_size_at_100"] for run in model["seeds"]
                  if run["first_size_at_100"] is not None]
        ax.scatter(firsts, [0.985 - 0.012 * offset] * len(firsts), marker="|", s=200,
                   color=color)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="dotted")
    ax.set(xscale="log", xlabel="training samples", ylabel="validation accuracy",
           title=f"s = {sweep['sparsity']} ({sweep['generator']} generator): mean ± std over "
                 f"{len(sweep['seed_list'])} seeds; ticks: each seed's first size at 100 %")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def attention_graph(edges: torch.Tensor, targets: Sequence[Sequence[int]],
                    title: str | None = None, centre: bool = False) -> Figure:
    """One panel per rule: every input (the last is the rule token z) joined to the output by
    an edge whose width is its |weight| (orange positive, blue negative); the rule's own
    targets are marked in red. edges [rules, T]. With ``centre`` the widths and colours show
    each edge's departure from the median of its row's inputs (the labels keep the values),
    which brings out the inputs that stand out when all edges share a large common level."""
    edges = edges.detach().cpu()
    rules, length = edges.shape
    drawn = edges - edges[:, :-1].median(dim=1, keepdim=True).values if centre else edges
    fig = Figure(figsize=(4 * rules, 0.38 * length + 1.2), layout="constrained")
    largest = float(drawn.abs().max()) or 1.0
    for rule, ax in enumerate(fig.subplots(1, rules, squeeze=False)[0]):
        rule_targets = {int(t) for t in targets[rule]}
        output_y = (length - 1) / 2
        for i, (weight, width) in enumerate(zip(edges[rule].tolist(), drawn[rule].tolist())):
            ax.plot([0, 1], [i, output_y], color="tab:orange" if width > 0 else "tab:blue",
                    linewidth=0.3 + 6 * abs(width) / largest, alpha=0.8)
            name = "z" if i == length - 1 else f"x{i}"
            ax.text(-0.05, i, f"{name}  {weight:+.2f}", ha="right", va="center", fontsize=8,
                    color="tab:red" if i in rule_targets else "black",
                    fontweight="bold" if i in rule_targets else "normal")
        ax.scatter([0] * length, range(length), color="black", s=12, zorder=3)
        ax.scatter([1], [output_y], color="black", s=40, zorder=3)
        ax.text(1.05, output_y, "output", va="center", fontsize=9)
        ax.set_xlim(-0.7, 1.4)
        ax.invert_yaxis()
        ax.axis("off")
        ax.set_title(f"rule {rule}: targets {sorted(rule_targets)}", fontsize=10)
    if title:
        fig.suptitle(title)
    return fig


def gain_view(x: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, w: torch.Tensor, y: float,
              z1: float, z2: float) -> Figure:
    """The gain demo: the query profiles q₁, q₂, the weights w = softmax(z₁q₁ + z₂q₂), and the
    signal x with its weighted mean y = w·x."""
    positions = range(len(x))
    fig = Figure(figsize=(10, 3), layout="constrained")
    query_ax, weight_ax, signal_ax = fig.subplots(1, 3)
    query_ax.plot(positions, q1.numpy(), marker=".", label="q₁")
    query_ax.plot(positions, q2.numpy(), marker=".", label="q₂")
    query_ax.set(title="query profiles (each sums to 1)", xlabel="position")
    query_ax.legend(fontsize=8)
    weight_ax.bar(positions, w.numpy(), color="tab:purple")
    weight_ax.set(title=f"w = softmax({z1:g}·q₁ + {z2:g}·q₂)", xlabel="position",
                  ylim=(0, max(0.2, float(w.max()) * 1.1)))
    signal_ax.plot(positions, x.numpy(), marker=".", color="tab:gray", label="x")
    signal_ax.axhline(float(y), color="tab:purple", label=f"y = w·x = {float(y):.3f}")
    signal_ax.set(title="signal and its weighted mean", xlabel="position")
    signal_ax.legend(fontsize=8)
    return fig


def positional_encoding(table: torch.Tensor, dims: Sequence[int] = (1, 2, 3, 4)) -> Figure:
    """Left: the table [positions, d] as a heat map; right: the curves of ``dims`` (1-based)."""
    if table.dim() != 2:
        raise ValueError(f"positional_encoding needs a table [positions, d], got "
                         f"{list(table.shape)}")
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    map_ax, curve_ax = fig.subplots(1, 2)
    image = map_ax.imshow(table.T.numpy(), aspect="auto", origin="lower", cmap="RdGy",
                          vmin=-1, vmax=1)
    map_ax.set(xlabel="position", ylabel="dimension",
               title=f"sinusoidal encoding, d = {table.shape[1]}")
    fig.colorbar(image, ax=map_ax)
    for dim in dims:
        curve_ax.plot(table[:, dim - 1].numpy(), label=f"dimension {dim}")
    curve_ax.set(xlabel="position", ylabel="value", title="single dimensions")
    curve_ax.legend(fontsize=8)
    return fig


def lr_factors(factors: Sequence[float], warmup: int) -> Figure:
    """The learning-rate factor per iteration, the end of the warm-up marked."""
    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot(list(factors))
    ax.axvline(warmup, color="tab:gray", linestyle="--", label=f"end of warm-up ({warmup})")
    ax.set(xlabel="iteration", ylabel="learning-rate factor", title="cosine warm-up schedule")
    ax.legend(fontsize=8)
    return fig


def weight_bars(weights: dict[str, torch.Tensor], keys: Sequence[str] | None = None,
                title: str | None = None) -> Figure:
    """One panel per name: a query's attention weights over the keys as bars."""
    fig = Figure(figsize=(3.2 * len(weights), 2.8), layout="constrained")
    for ax, (name, row) in zip(fig.subplots(1, len(weights), squeeze=False, sharey=True)[0],
                               weights.items()):
        row = row.detach().cpu()
        ax.bar(keys if keys is not None else range(len(row)), row.numpy())
        ax.set(title=name, xlabel="key", ylim=(0, 1))
    if title:
        fig.suptitle(title)
    return fig
