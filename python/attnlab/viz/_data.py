"""Checks and shapes the viewers' input: attention maps in Hugging Face's ``output_attentions``
layout (a tuple with one ``[batch, heads, queries, keys]`` tensor per layer) and their tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

HEATMAP_THRESHOLD = 256  # above this many query or key tokens, "auto" draws heat maps
MODES = ("auto", "lines", "heatmap")


@dataclass
class AttentionData:
    """Maps ready to draw: ``weights`` [batch, layers, heads, queries, keys] float32 (only the
    selected entries), the tokens of each kept batch entry, and the original indices of what
    was kept (``batch``, ``layers``, ``heads``) so labels name them as in ``maps``."""

    weights: np.ndarray
    query_tokens: list[list[str]]
    key_tokens: list[list[str]]
    batch: list[int]
    layers: list[int]
    heads: list[int]
    cross: bool  # separate key tokens were given (cross-attention)


def _as_tensor(value, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"{where} must be a torch.Tensor or numpy array of shape "
                    f"[batch, heads, queries, keys], got {type(value).__name__}")


def _check_maps(maps) -> list[torch.Tensor]:
    if isinstance(maps, (torch.Tensor, np.ndarray)):
        raise TypeError("maps must be a tuple or list with one [batch, heads, queries, keys] "
                        "tensor per layer (as output_attentions returns them), got a single "
                        f"{type(maps).__name__} of shape {list(maps.shape)}; for one layer "
                        "pass (maps,)")
    if not isinstance(maps, (tuple, list)):
        raise TypeError("maps must be a tuple or list with one [batch, heads, queries, keys] "
                        f"tensor per layer, got {type(maps).__name__}")
    if len(maps) == 0:
        raise ValueError("maps is empty: expected one [batch, heads, queries, keys] tensor per "
                         "layer")
    tensors = [_as_tensor(m, f"maps[{i}]") for i, m in enumerate(maps)]
    for i, t in enumerate(tensors):
        if t.dim() != 4:
            raise ValueError(f"maps[{i}] must have 4 dimensions [batch, heads, queries, keys], "
                             f"got shape {list(t.shape)}")
        if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.uint8, torch.int8,
                                                                        torch.int16, torch.int32,
                                                                        torch.int64)):
            raise TypeError(f"maps[{i}] must hold real numbers, got dtype {t.dtype}")
        if t.shape != tensors[0].shape:
            raise ValueError(f"every layer's map must have the same shape [batch, heads, "
                             f"queries, keys]: maps[0] is {list(tensors[0].shape)}, maps[{i}] "
                             f"is {list(t.shape)}")
    if 0 in tensors[0].shape:
        raise ValueError(f"maps have an empty dimension: shape {list(tensors[0].shape)} "
                         "[batch, heads, queries, keys]")
    return tensors


def _check_tokens(tokens, name: str, length: int, batch: int, what: str) -> list[list[str]]:
    """One list of strings for every batch entry (a flat list applies to all of them)."""
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        one = "query" if what == "queries" else "key"
        raise TypeError(f"{name} must be a list of strings (one per {one}), or one such "
                        f"list per batch entry; got {type(tokens).__name__}")
    nested = len(tokens) > 0 and all(isinstance(t, (list, tuple)) for t in tokens)
    per_entry = [list(t) for t in tokens] if nested else [list(tokens)] * batch
    if nested and len(per_entry) != batch:
        raise ValueError(f"{name} has {len(per_entry)} lists but the maps have batch size "
                         f"{batch}: give one list per batch entry, or one list for all")
    for b, entry in enumerate(per_entry):
        where = f"{name}[{b}]" if nested else name
        if len(entry) != length:
            raise ValueError(f"{where} has {len(entry)} tokens but the maps have {length} "
                             f"{what}")
        for i, token in enumerate(entry):
            if not isinstance(token, str):
                raise TypeError(f"{where}[{i}] must be a str, got {type(token).__name__} "
                                f"({token!r})")
    return per_entry


def _indices(chosen, count: int, name: str) -> list[int]:
    if chosen is None:
        return list(range(count))
    if isinstance(chosen, (int, np.integer)) and not isinstance(chosen, bool):
        chosen = [chosen]
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Sequence) or len(chosen) == 0:
        raise TypeError(f"{name} must be an index or a non-empty list of indices, got {chosen!r}")
    result = []
    for c in chosen:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"{name} must hold integers, got {c!r}")
        if not -count <= c < count:
            raise ValueError(f"{name} index {c} is out of range: the maps have {count}")
        result.append(int(c) % count)
    if len(set(result)) != len(result):
        raise ValueError(f"{name} lists an index twice: {list(chosen)}")
    return result


def pool_blocks(weights: np.ndarray, tokens: list[list[str]], axis: int, max_tokens: int,
                reduce: str) -> tuple[np.ndarray, list[list[str]]]:
    """Merges runs of neighbouring positions along ``axis`` so at most ``max_tokens`` remain:
    ``reduce="mean"`` (queries: a block's rows averaged, still summing to 1) or ``"sum"``
    (keys: the weight a query gives to the whole block). Labels become ``first…last``."""
    length = weights.shape[axis]
    if length <= max_tokens:
        return weights, tokens
    size = math.ceil(length / max_tokens)
    starts = list(range(0, length, size))
    pooled = np.add.reduceat(weights, starts, axis=axis)
    if reduce == "mean":
        counts = np.array([min(size, length - s) for s in starts], dtype=np.float32)
        shape = [1] * weights.ndim
        shape[axis] = len(starts)
        pooled = pooled / counts.reshape(shape)
    labels = [[entry[s] if min(s + size, length) - s == 1
               else f"{entry[s]}…{entry[min(s + size, length) - 1]}" for s in starts]
              for entry in tokens]
    return pooled.astype(np.float32), labels


def prepare(maps, tokens, key_tokens=None, *, batch=None, layers=None, heads=None,
            max_tokens: int | None = None, max_values: int | None = None) -> AttentionData:
    """Validates ``maps`` and the tokens, keeps the chosen batch entries, layers and heads
    (all by default) and, with ``max_tokens``, pools long inputs down to that many positions.
    ``max_values`` bounds the number of weights kept (checked before anything is converted).
    Raises TypeError/ValueError naming the argument at fault."""
    tensors = _check_maps(maps)
    batch_size, head_count, queries, keys = tensors[0].shape
    if tokens is None:
        raise TypeError("tokens is required: a list of strings, one per query position")
    query_tokens = _check_tokens(tokens, "tokens", queries, batch_size, "queries")
    if key_tokens is None:
        if keys != queries:
            raise ValueError(f"the maps have {queries} queries but {keys} keys "
                             "(cross-attention): pass key_tokens as well")
        key_list, cross = query_tokens, False
    else:
        key_list, cross = _check_tokens(key_tokens, "key_tokens", keys, batch_size, "keys"), True
    kept_batch = _indices(batch, batch_size, "batch")
    kept_layers = _indices(layers, len(tensors), "layers")
    kept_heads = _indices(heads, head_count, "heads")
    if max_tokens is not None and (isinstance(max_tokens, bool) or
                                   not isinstance(max_tokens, int) or max_tokens < 2):
        raise ValueError(f"max_tokens must be an integer of at least 2, got {max_tokens!r}")

    def pooled(length):
        return length if max_tokens is None else math.ceil(length / math.ceil(length / max_tokens))

    count = len(kept_batch) * len(kept_layers) * len(kept_heads) * pooled(queries) * pooled(keys)
    if max_values is not None and count > max_values:
        raise ValueError(
            f"the view would hold {len(kept_batch)} × {len(kept_layers)} × {len(kept_heads)} × "
            f"{pooled(queries)} × {pooled(keys)} = {count:,} weights (batch × layers × heads × "
            f"queries × keys), more than max_values={max_values:,}: choose fewer with batch=, "
            f"layers= or heads=, pool long inputs with max_tokens= (e.g. 256), or raise "
            f"max_values")

    head_index = torch.tensor(kept_heads)
    batch_index = torch.tensor(kept_batch)
    query_tokens = [query_tokens[b] for b in kept_batch]
    key_list = [key_list[b] for b in kept_batch]
    selected, query_labels, key_labels = [], query_tokens, key_list
    for layer in kept_layers:
        t = tensors[layer].detach()
        t = t.index_select(0, batch_index.to(t.device)).index_select(1, head_index.to(t.device))
        t = t.to(device="cpu", dtype=torch.float32)
        bad = ~torch.isfinite(t)
        if bad.any():
            b, h, q, k = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"maps[{layer}] holds a non-finite value ({float(t[b, h, q, k])}) "
                             f"at batch {kept_batch[b]}, head {kept_heads[h]}, query {q}, key {k}")
        if (t < 0).any():
            raise ValueError(f"maps[{layer}] holds negative values (minimum {float(t.min()):.4g}):"
                             " the viewers draw attention weights, which are at least 0")
        array = t.numpy()
        if max_tokens is not None:
            array, query_labels = pool_blocks(array, query_tokens, 2, max_tokens, "mean")
            array, key_labels = pool_blocks(array, key_list, 3, max_tokens, "sum")
        selected.append(array)
    weights = np.ascontiguousarray(np.stack(selected, axis=1))  # [B, L, H, Q, K]
    if not cross:
        key_labels = query_labels
    return AttentionData(weights=weights, query_tokens=query_labels, key_tokens=key_labels,
                         batch=kept_batch, layers=kept_layers, heads=kept_heads, cross=cross)


def resolve_mode(mode: str, queries: int, keys: int, threshold: int = HEATMAP_THRESHOLD) -> str:
    """``"auto"`` → ``"heatmap"`` when either side has more than ``threshold`` tokens, else
    ``"lines"``; the two others pass through."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        return "heatmap" if max(queries, keys) > threshold else "lines"
    return mode
