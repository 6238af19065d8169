"""A page for long inputs drawn from their attention summaries (``attnlab.interpret.summarize``)
instead of their maps: the pooled map with the exact weights of chosen blocks, the attention
each position receives, each head's entropy and each query's top-k keys."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ._colours import head_colours
from ._data import _check_tokens, _indices
from .html import AttentionViewer, _colour_map_hex, _page, pack

DEFAULT_ZOOM_PER_HEAD = 2
DEFAULT_MAX_ZOOM_VALUES = 1 << 22  # block weights embedded in one page, at most
FIELDS = ("received", "entropy", "topk_weights", "topk_indices", "pooled")


@dataclass
class _Calls:
    """The chosen calls' summaries as float64 numpy arrays [batch, layers, heads, ...] (None
    where not recorded), with the sequence lengths."""

    arrays: dict
    queries: int
    keys: int
    pool: int | None
    source: object  # the Summaries (for zoom), or None for plain AttentionSummary objects


def _summary_list(summaries):
    from ..functional import AttentionSummary
    from ..interpret.summaries import Summaries
    if isinstance(summaries, Summaries):
        return list(summaries.calls), summaries
    if isinstance(summaries, (list, tuple)) and summaries and \
            all(isinstance(s, AttentionSummary) for s in summaries):
        return list(summaries), None
    raise TypeError("summaries must be what attnlab.interpret.summarize() gives (a Summaries) "
                    "or a non-empty list of attnlab.AttentionSummary (one per layer), got "
                    f"{type(summaries).__name__}")


def _collect(summaries, layers, pool) -> tuple[_Calls, list[int]]:
    calls, source = _summary_list(summaries)
    if not calls:
        raise ValueError("summaries holds no attention call: run the model inside "
                         "summarize(...) first")
    kept_layers = _indices(layers, len(calls), "layers")
    recorded_pool = source.summary.pool if source is not None else None
    if pool is not None:
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1:
            raise ValueError(f"pool must be a positive int, got {pool!r}")
        if recorded_pool is not None and pool != recorded_pool:
            raise ValueError(f"pool={pool} differs from the block size the summaries were "
                             f"recorded with ({recorded_pool}); leave pool out")
    pool = pool or recorded_pool

    arrays, shapes = {}, {}
    for name in FIELDS:
        present = [getattr(calls[l], name) is not None for l in kept_layers]
        if any(present) and not all(present):
            raise ValueError(f"layers: some of the chosen calls have {name} and some do not")
        if not present[0]:
            arrays[name] = None
            continue
        tensors = [getattr(calls[l], name) for l in kept_layers]
        for l, t in zip(kept_layers, tensors):
            if t.shape != tensors[0].shape:
                raise ValueError(f"layers: call {l}'s {name} has shape {list(t.shape)}, call "
                                 f"{kept_layers[0]}'s {list(tensors[0].shape)}; choose calls "
                                 "of one shape (the layers of one forward pass) with layers=")
        trailing = 2 if name in ("topk_weights", "topk_indices", "pooled") else 1
        if tensors[0].dim() != 2 + trailing:
            raise ValueError(f"summaries: {name} has shape {list(tensors[0].shape)}; the page "
                             f"needs [batch, heads, ...] summaries (of a [batch, heads, L, E] "
                             "query)")
        stacked = torch.stack([t.detach().to("cpu") for t in tensors], 1)  # [B, L, H, ...]
        arrays[name] = stacked.numpy() if name == "topk_indices" else \
            stacked.to(torch.float64).numpy()
        shapes[name] = tuple(tensors[0].shape)
    if not shapes:
        raise ValueError("summaries hold none of received, entropy, top-k or pooled maps: "
                         "record them with summarize(received=True, entropy=True, topk=8, "
                         "pool=64)")

    leading = {s[:2] for s in shapes.values()}
    if len(leading) != 1:
        raise ValueError(f"summaries: the summaries disagree on [batch, heads]: {sorted(leading)}")
    inputs = source.inputs[kept_layers[0]] if source is not None and \
        kept_layers[0] < len(source.inputs) else None
    queries = shapes["entropy"][-1] if "entropy" in shapes else \
        shapes["topk_weights"][-2] if "topk_weights" in shapes else \
        inputs.query.shape[-2] if inputs is not None else None
    keys = shapes["received"][-1] if "received" in shapes else \
        inputs.key.shape[-2] if inputs is not None else None
    if queries is None and keys is None:
        raise ValueError("summaries: only pooled maps were recorded, which do not give the "
                         "sequence length; record received=True or entropy=True as well")
    queries = keys if queries is None else queries
    keys = queries if keys is None else keys
    if "pooled" in shapes:
        if pool is None:
            raise ValueError("pool: these summaries carry pooled maps but not their block size; "
                             "pass pool= (the WeightSummary's pool)")
        expected = (math.ceil(queries / pool), math.ceil(keys / pool))
        if shapes["pooled"][-2:] != expected:
            raise ValueError(f"pool={pool}: a {queries} × {keys} input makes {expected[0]} × "
                             f"{expected[1]} blocks, but the pooled maps are "
                             f"{shapes['pooled'][-2]} × {shapes['pooled'][-1]}")
    return _Calls(arrays, queries, keys, pool if "pooled" in shapes else None, source), \
        kept_layers


def _zoom_blocks(zoom, calls: _Calls, kept_batch, kept_layers, kept_heads, per_head):
    """(batch, layer, head, q_block, k_block) positions in the kept lists, in a stable order, and
    a note for the page on how to embed blocks."""
    source, pool = calls.source, calls.pool
    inputs_kept = source is not None and all(
        l < len(source.inputs) and source.inputs[l] is not None for l in kept_layers)
    if pool is None:
        how = ("the summaries have no pooled map: record with summarize(pool=P, "
               "keep_inputs=True, ...)")
    elif not inputs_kept:
        how = ("the summaries were recorded without their inputs: record with summarize(..., "
               "keep_inputs=True) and pass zoom=[(layer, head, q_block, k_block), ...]")
    else:
        how = "pass zoom=[(layer, head, q_block, k_block), ...] to summary_view to embed it"
    if zoom is None:
        return [], how
    items = [zoom] if isinstance(zoom, str) else zoom
    if isinstance(items, (bytes, dict)) or not isinstance(items, Sequence):
        raise TypeError(f"zoom must be \"auto\", None or a list of (layer, head, q_block, "
                        f"k_block) tuples, got {zoom!r}")
    if isinstance(per_head, bool) or not isinstance(per_head, int) or per_head < 0:
        raise ValueError(f"zoom_per_head must be an int >= 0, got {per_head!r}")
    explicit = [item for item in items if not (isinstance(item, str) and item == "auto")]
    automatic = len(explicit) < len(items)
    if explicit and pool is None:
        raise ValueError("zoom: blocks of the pooled map were asked for, but the summaries have "
                         "no pooled map: record with summarize(pool=P, keep_inputs=True, ...)")
    if explicit and not inputs_kept:
        raise ValueError("zoom: block weights are recomputed from each call's inputs, which "
                         "these summaries did not keep: record with summarize(..., "
                         "keep_inputs=True)")
    if pool is None or not inputs_kept:
        return [], how
    n_q, n_k = math.ceil(calls.queries / pool), math.ceil(calls.keys / pool)
    chosen = []
    for item in explicit:
        if isinstance(item, str) or not isinstance(item, Sequence) or len(item) != 4 or \
                any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in item):
            raise TypeError(f"zoom: each block is a tuple of 4 ints (layer, head, q_block, "
                            f"k_block), or \"auto\"; got {item!r}")
        layer, head, q_block, k_block = (int(v) for v in item)
        if layer not in kept_layers:
            raise ValueError(f"zoom: layer {layer} of {item!r} is not among the layers shown "
                             f"({kept_layers})")
        if head not in kept_heads:
            raise ValueError(f"zoom: head {head} of {item!r} is not among the heads shown "
                             f"({kept_heads})")
        if not (0 <= q_block < n_q and 0 <= k_block < n_k):
            raise ValueError(f"zoom: block ({q_block}, {k_block}) of {item!r} is out of range: "
                             f"the pooled map has {n_q} × {n_k} blocks (q_block < {n_q}, "
                             f"k_block < {n_k})")
        for b in range(len(kept_batch)):
            chosen.append((b, kept_layers.index(layer), kept_heads.index(head), q_block, k_block))
    if automatic and per_head:
        pooled = calls.arrays["pooled"]  # [B, L, H(all), n_q, n_k]
        off_diagonal = ~np.eye(n_q, n_k, dtype=bool)
        for b in range(len(kept_batch)):
            for l in range(len(kept_layers)):
                for h, head in enumerate(kept_heads):
                    cells = np.where(off_diagonal, pooled[kept_batch[b], l, head],
                                     -1.0).ravel()
                    # The most attended first (ties: the earlier block), never a block with no
                    # weight at all (above a causal diagonal), which has nothing to show.
                    order = np.argsort(-cells, kind="stable")[:per_head]
                    chosen += [(b, l, h, int(i) // n_k, int(i) % n_k) for i in order
                               if cells[i] > 0]
    return sorted(set(chosen)), how


def _embed_blocks(blocks, calls: _Calls, kept_batch, kept_layers, kept_heads, max_values,
                  bits):
    pool, source = calls.pool, calls.source
    sizes = [(min(pool, calls.queries - qb * pool), min(pool, calls.keys - kb * pool))
             for _, _, _, qb, kb in blocks]
    total = sum(r * c for r, c in sizes)
    if max_values is not None and total > max_values:
        raise ValueError(f"zoom: {len(blocks)} blocks hold {total:,} weights, more than "
                         f"max_zoom_values={max_values:,}; ask for fewer blocks (zoom=, "
                         f"zoom_per_head=) or raise max_zoom_values")
    embedded, rows_cache = [], {}
    for (b, l, h, qb, kb), (rows, cols) in zip(blocks, sizes):
        key = (b, l, h, qb)
        if key not in rows_cache:
            # One recomputation per row of blocks: the rows' weights against every key, of
            # which each block takes its columns.
            rows_cache.clear()
            rows_cache[key] = source.weights(kept_layers[l], kept_batch[b], kept_heads[h],
                                             slice(qb * pool, qb * pool + rows))
        weights = rows_cache[key][:, kb * pool:kb * pool + cols].to(torch.float64).numpy()
        # The mean from the exact weights: what the pooled map holds for the block, whatever
        # the precision the weights are stored in.
        embedded.append({"batch": b, "layer": l, "head": h, "q_block": qb, "k_block": kb,
                         "rows": rows, "cols": cols, "mean": float(weights.mean()),
                         **pack(weights, 1, bits=bits, quantization="log", planes=True)})
    return embedded


def summary_view(summaries, tokens=None, key_tokens=None, *, batch=None, layers=None,
                 heads=None, layer: int | None = None, head: int | None = None,
                 query: int | None = None, topk: int | None = None, zoom="auto",
                 zoom_per_head: int = DEFAULT_ZOOM_PER_HEAD, zoom_precision: int = 8,
                 pool: int | None = None, max_zoom_values: int | None = DEFAULT_MAX_ZOOM_VALUES,
                 title: str | None = None) -> AttentionViewer:
    """A long input (thousands to tens of thousands of tokens) drawn from the summaries of its
    attention, as one self-contained HTML page like :func:`head_view`'s (no network, inline
    in Jupyter, ``.save(path)``).

    ``summaries`` is what ``attnlab.interpret.summarize()`` gives (one call per layer; the
    ``[batch, heads, ...]`` summaries of a ``[batch, heads, L, E]`` query), or a list of
    :class:`attnlab.AttentionSummary`, one per layer (then ``pool=`` gives the pooled maps'
    block size). ``tokens`` names the positions (a list of strings, or one list per batch
    entry; ``key_tokens`` too for cross-attention); without them positions show as numbers.
    ``batch``, ``layers`` (indices of the recorded calls) and ``heads`` choose what the page
    holds (default all); ``layer``, ``head`` and ``query`` where it starts.

    The page, with selectors for the batch entry, layer and head:

    - the **pooled map** (the mean weight of each ``pool × pool`` block, log or linear colour
      scale); clicking a block **zooms** into it: its exact ``pool × pool`` weights, when the
      page carries them, or how to get them;
    - the attention each key **receives** along the sequence (attention sinks are spikes);
    - **entropy**: a layers × heads grid of each head's mean entropy, and the selected head's
      entropy along the sequence;
    - **top-k arcs**: for the query chosen with the slider (or a click on the sequence),
      arcs to its top-k keys, their width and opacity the weight, with the keys listed.

    Drag across a plot to zoom into positions (double-click: all); hovering reads a position's
    values exactly (zoomed out, a pixel's largest value and where it is).

    Zoom: block weights are recomputed, for those blocks only, from the inputs the summaries
    kept (``summarize(..., keep_inputs=True)``, see
    :meth:`attnlab.interpret.Summaries.block_weights`). ``zoom`` is ``"auto"`` (for every head
    shown, its ``zoom_per_head`` most attended blocks off the diagonal), ``None`` (none), or a
    list of ``(layer, head, q_block, k_block)`` tuples (numbered as in the summaries; for every
    batch entry shown), which may include ``"auto"``. At most ``max_zoom_values`` weights are
    embedded.

    Storage: received attention, entropy, pooled maps and each query's largest weight in 16
    bits of a log scale per layer and head (a relative error of at most 1.1·10⁻⁴ when the
    values span six decades), the other top-k weights as fractions of the largest in 8 bits
    of a log scale (2.8% when they span six decades), the top-k keys as distances from their
    query, block weights in ``zoom_precision`` bits (8 or 16) of a log scale; compressed.
    ``topk=n`` keeps each query's first ``n`` keys only. A
    16,384-token input with 4 layers × 4 heads, top-8 keys and 256 × 256 blocks (a 64 × 64
    pooled map) makes a page of 10.4 MB for the long-inputs notebook's random-weight model and
    10.9 MB for random queries and keys (whose top keys lie anywhere: the hardest case to
    compress), of which the 32 automatic zoom blocks take 2.3–2.4 MB; ``topk=4`` saves 3.2 MB.

    Raises TypeError or ValueError naming the argument when the input is not as described
    (no summaries, calls of different shapes, tokens of the wrong length, zoom blocks out of
    range or asked for without a pooled map or without kept inputs, ...).

    Returns:
        An :class:`AttentionViewer`: ``.html``, ``.save(path)``, and inline display in Jupyter.
    """
    calls, kept_layers = _collect(summaries, layers, pool)
    arrays = calls.arrays
    first = next(a for a in arrays.values() if a is not None)
    batch_size, head_count = first.shape[0], first.shape[2]
    kept_batch = _indices(batch, batch_size, "batch")
    kept_heads = _indices(heads, head_count, "heads")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    if zoom_precision not in (8, 16) or isinstance(zoom_precision, bool):
        raise ValueError(f"zoom_precision must be 8 or 16 (bits per weight), got "
                         f"{zoom_precision!r}")
    if max_zoom_values is not None and (isinstance(max_zoom_values, bool) or
                                        not isinstance(max_zoom_values, int) or
                                        max_zoom_values < 1):
        raise ValueError(f"max_zoom_values must be a positive int or None, got "
                         f"{max_zoom_values!r}")

    query_tokens = key_list = None
    cross = key_tokens is not None
    if tokens is not None:
        query_tokens = _check_tokens(tokens, "tokens", calls.queries, batch_size, "queries")
        if key_tokens is None and calls.keys != calls.queries:
            raise ValueError(f"the summaries have {calls.queries} queries but {calls.keys} keys "
                             "(cross-attention): pass key_tokens as well")
        key_list = query_tokens
    if key_tokens is not None:
        if tokens is None:
            raise ValueError("key_tokens needs tokens (the queries' names) as well")
        key_list = _check_tokens(key_tokens, "key_tokens", calls.keys, batch_size, "keys")

    def start_index(value, kept, name, count):
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if not -count <= value < count:
            raise ValueError(f"{name} {value} is out of range: there are {count}")
        value = int(value) % count
        if value not in kept:
            raise ValueError(f"{name} {value} is not among the {name}s shown ({kept})")
        return kept.index(value)

    n_calls = len(_summary_list(summaries)[0])
    start = {"batch": 0, "layer": start_index(layer, kept_layers, "layer", n_calls),
             "head": start_index(head, kept_heads, "head", head_count)}
    if query is None:
        start["query"] = calls.queries - 1
    elif isinstance(query, bool) or not isinstance(query, (int, np.integer)) or \
            not -calls.queries <= query < calls.queries:
        raise ValueError(f"query must be a position in [0, {calls.queries}), got {query!r}")
    else:
        start["query"] = int(query) % calls.queries

    blocks, how = _zoom_blocks(zoom, calls, kept_batch, kept_layers, kept_heads, zoom_per_head)
    chosen = np.ix_(kept_batch, range(len(kept_layers)), kept_heads)

    def packed(name):
        array = arrays[name]
        if array is None:
            return None
        array = array[chosen]
        groups = array.shape[0] * array.shape[1] * array.shape[2]
        return pack(array, groups, bits=16, quantization="log", planes=True)

    top = ratios = offsets = None
    k = None
    if arrays["topk_weights"] is not None:
        recorded = arrays["topk_weights"].shape[-1]
        if topk is None:
            k = recorded
        elif isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= recorded:
            raise ValueError(f"topk must be an int from 1 to {recorded} (the top-k recorded), "
                             f"got {topk!r}")
        else:
            k = topk
        weights = arrays["topk_weights"][chosen][..., :k]
        # Each query's largest weight in 16 bits, the others as fractions of it in 8 bits of
        # a log scale (so that a key far weaker than a sink still shows, and an exact 0, a
        # masked query's, stays 0): what the arcs draw, at half the size of 16 bits for all
        # (top-k is most of the page).
        top = weights[..., 0]
        ratios = np.divide(weights, top[..., None], out=np.zeros_like(weights),
                           where=top[..., None] > 0)
        groups = top.shape[0] * top.shape[1] * top.shape[2]
        top = pack(top, groups, bits=16, quantization="log", planes=True)
        ratios = pack(ratios, groups, bits=8, quantization="log")
        # Distances back from each query rather than key numbers: near keys give small
        # numbers, which compress far better than positions up to L.
        indices = arrays["topk_indices"][chosen][..., :k].astype(np.int64)
        distance = np.arange(calls.queries)[:, None] - indices
        offsets = pack(distance, 1, bits=16 if max(calls.queries, calls.keys) < 1 << 15 else 32,
                       quantization="int", planes=True)
    elif topk is not None:
        raise ValueError("topk: the summaries have no top-k keys (summarize(topk=8, ...))")
    spec = {
        "version": 1, "kind": "summaries", "title": title or "",
        "batch": kept_batch, "layers": kept_layers, "heads": kept_heads,
        "queries": calls.queries, "keys": calls.keys, "pool": calls.pool,
        "k": k,
        "query_tokens": None if query_tokens is None else [query_tokens[b] for b in kept_batch],
        # Self-attention: the keys are the queries' tokens, which the page holds once.
        "key_tokens": [key_list[b] for b in kept_batch] if cross else None,
        "cross": cross or calls.keys != calls.queries,
        "head_colours": [head_colours(head_count)[h] for h in kept_heads],
        "colour_map": _colour_map_hex("viridis"),
        "received": packed("received"), "entropy": packed("entropy"),
        "pooled": packed("pooled"), "topk_top": top, "topk_ratios": ratios,
        "topk_distances": offsets,
        "zoom": _embed_blocks(blocks, calls, kept_batch, kept_layers, kept_heads,
                              max_zoom_values, zoom_precision) if blocks else [],
        "zoom_note": how,
        "start": start,
    }
    return AttentionViewer(_page(spec, title or "attnlab attention summaries",
                                 scripts=("common.js", "summary.js"),
                                 styles=("viewer.css", "summary.css")), height=1250)
