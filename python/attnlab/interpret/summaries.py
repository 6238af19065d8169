"""Summaries of every attention call of a model, at any length: the fused forward reduces the
weights as it makes them, so no call holds its ``L × L`` weights."""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import functional
from ..functional import AttentionSummary, WeightSummary


@dataclasses.dataclass(frozen=True)
class CallInputs:
    """What recomputing some of one call's weights takes: the call's own query and key
    (detached views of its tensors, not copies), mask and options. ``summarize(...,
    keep_inputs=True)`` keeps one per call."""

    query: torch.Tensor
    key: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    normalizer: str
    alpha: float | None


def _index(value, count: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not -count <= value < count:
        raise IndexError(f"{name} {value} is out of range: there are {count}")
    return value % count


def _span(value, length: int, name: str) -> tuple[int, int]:
    """``None`` (everything), an int (one position) or a ``slice`` with step 1, as
    ``(start, stop)`` within ``[0, length)``."""
    if value is None:
        return 0, length
    if isinstance(value, int) and not isinstance(value, bool):
        position = _index(value, length, name)
        return position, position + 1
    if not isinstance(value, slice):
        raise TypeError(f"{name} must be None, an int or a slice, got {value!r}")
    start, stop, step = value.indices(length)
    if step != 1:
        raise ValueError(f"{name} must be a slice with step 1, got {value!r}")
    if stop <= start:
        raise ValueError(f"{name} {value!r} selects no position of {length}")
    return start, stop


def _four_dims(tensor: torch.Tensor) -> torch.Tensor:
    while tensor.dim() < 4:
        tensor = tensor.unsqueeze(0)
    return tensor


class Summaries:
    """The summaries of each attention call recorded by :func:`summarize`, in call order (for a
    model: one per layer and forward pass). ``summaries[i]`` is call ``i``'s
    :class:`attnlab.AttentionSummary`, each at that call's ``[batch, heads, ...]`` shape.

    With ``summarize(..., keep_inputs=True)``, ``inputs[i]`` holds what call ``i`` was given
    (a :class:`CallInputs`, else ``None``), so that :meth:`weights` and :meth:`block_weights`
    can recompute the exact weights of a few rows or of one pooled block on demand."""

    def __init__(self, summary: WeightSummary, keep_inputs: bool = False):
        self.summary = summary
        self.keep_inputs = keep_inputs
        self.calls: list[AttentionSummary] = []
        self.inputs: list[CallInputs | None] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __getitem__(self, index: int) -> AttentionSummary:
        return self.calls[index]

    def __iter__(self):
        return iter(self.calls)

    def _record(self, call: functional.AttentionCall) -> None:
        kept = None
        if self.keep_inputs:
            # Detached views: the same memory as the call's tensors (no copy), but no autograd
            # graph is kept alive through them.
            mask = call.attn_mask.detach() if call.attn_mask is not None else None
            kept = CallInputs(call.query.detach(), call.key.detach(), mask, call.is_causal,
                              call.scale, call.normalizer, call.alpha)
        self.calls.append(call.summary)
        self.inputs.append(kept)

    def stack(self, name: str) -> torch.Tensor:
        """One summary of every call, stacked along a new first dimension (calls of one shape:
        the layers of one forward pass), e.g. ``stack("entropy")`` ``[layers, batch, heads,
        L]``."""
        if name not in {field.name for field in AttentionSummary.__dataclass_fields__.values()}:
            raise ValueError(f"unknown summary {name!r}; expected one of "
                             f"{', '.join(AttentionSummary.__dataclass_fields__)}")
        if not self.calls:
            raise ValueError("no attention call was recorded")
        tensors = [getattr(call, name) for call in self.calls]
        if tensors[0] is None:
            raise ValueError(f"{name} was not asked for: WeightSummary({name.split('_')[0]}=...)")
        return torch.stack(tensors)

    def _inputs(self, call) -> tuple[int, CallInputs]:
        call = _index(call, len(self.calls), "call")
        inputs = self.inputs[call] if call < len(self.inputs) else None
        if inputs is None:
            raise ValueError(f"call {call}'s inputs were not kept: record with "
                             "summarize(..., keep_inputs=True) to recompute its weights")
        return call, inputs

    def weights(self, call: int, batch: int, head: int, queries=None, keys=None) -> torch.Tensor:
        """The exact weights of call ``call``, batch entry ``batch``, head ``head`` (numbered as
        in the summaries' ``[batch, heads, ...]``) for the query rows ``queries`` and key columns
        ``keys`` (each ``None`` for all, an int, or a slice), recomputed by the operator with
        the call's own mask, causality, scale and normalizer. Only the chosen rows are computed
        (against every key, as a row's normalization needs), so any block of a long input costs
        ``rows × L_k`` memory.

        Returns:
            A ``[rows, columns]`` tensor in the query's dtype.

        Raises:
            ValueError: the call's inputs were not kept (``summarize(keep_inputs=True)``).
            IndexError: ``call``, ``batch`` or ``head`` out of range.
        """
        call, inputs = self._inputs(call)
        query, key = _four_dims(inputs.query), _four_dims(inputs.key)
        mask = None if inputs.attn_mask is None else _four_dims(inputs.attn_mask)
        batches = max([query.shape[0], key.shape[0]] + ([mask.shape[0]] if mask is not None
                                                         else []))
        heads, kv_heads = query.shape[1], key.shape[1]
        batch = _index(batch, batches, "batch")
        head = _index(head, heads, "head")
        q_length, k_length = query.shape[2], key.shape[2]
        q0, q1 = _span(queries, q_length, "queries")
        k0, k1 = _span(keys, k_length, "keys")

        def pick(tensor, position):  # size-1 dimensions broadcast
            return 0 if tensor.shape[0] == 1 else position

        rows = query[pick(query, batch), head, q0:q1]
        # Grouped heads (enable_gqa): query head h attends with key head h // (H_q / H_kv).
        key_head = head // (heads // kv_heads) if kv_heads > 1 else 0
        keys_used = key[pick(key, batch), key_head]
        allowed = None
        if mask is not None:
            mask = mask[pick(mask, batch)]
            mask = mask[pick(mask, head)]
            allowed = mask[q0:q1] if mask.shape[0] > 1 else mask
        if inputs.is_causal:
            # is_causal is aligned top-left (query i sees keys j <= i); for rows q0.. of a slice
            # the flag would align them from row 0, so it becomes an explicit mask instead.
            causal = (torch.arange(k_length, device=rows.device)[None, :]
                      <= torch.arange(q0, q1, device=rows.device)[:, None])
            if allowed is None:
                allowed = causal
            elif allowed.dtype == torch.bool:
                allowed = allowed & causal
            else:
                allowed = allowed.expand(q1 - q0, k_length).masked_fill(~causal, float("-inf"))
        # The operator itself rather than the functional wrapper: a recomputation is no call of
        # the model, and summarize() or record() hooks that are active must not see it.
        _, weights = torch.ops.attnlab.scaled_dot_product_attention(
            rows[None, None].contiguous(), keys_used[None, None].contiguous(),
            keys_used[None, None, :, :1].contiguous(),
            None if allowed is None else allowed[None, None], False, inputs.scale, True,
            inputs.normalizer, inputs.alpha)
        return weights[0, 0, :, k0:k1]

    def block_weights(self, call: int, batch: int, head: int, q_block: int,
                      k_block: int) -> torch.Tensor:
        """The exact weights of one block of the pooled map (``summarize(pool=P)``): queries
        ``q_block·P ..`` and keys ``k_block·P ..``, at most ``P × P`` (edge blocks are smaller).
        Their mean is the block's pooled value. See :meth:`weights`.

        Returns:
            A ``[rows, columns]`` tensor in the query's dtype.

        Raises:
            ValueError: no pooled map was asked for, or the call's inputs were not kept.
            IndexError: an index out of range.
        """
        pool = self.summary.pool
        if not pool:
            raise ValueError("block_weights needs the block size of a pooled map: summarize("
                             "pool=P, ...); use weights(call, batch, head, queries, keys) for "
                             "any other rectangle")
        call, inputs = self._inputs(call)
        q_length, k_length = inputs.query.shape[-2], inputs.key.shape[-2]
        q_block = _index(q_block, math.ceil(q_length / pool), "q_block")
        k_block = _index(k_block, math.ceil(k_length / pool), "k_block")
        return self.weights(call, batch, head, slice(q_block * pool, (q_block + 1) * pool),
                            slice(k_block * pool, (k_block + 1) * pool))


class summarize:
    """A context manager that collects the summaries of every
    ``attnlab.functional.scaled_dot_product_attention`` call made inside it: attnlab's modules,
    the tutorial adapters, and any Hugging Face model loaded with ``attn_implementation=
    "attnlab"``, without ``output_attentions`` and without ``L × L`` memory::

        with attnlab.interpret.summarize(received=True, entropy=True, topk=8, pool=64) as s:
            model(input_ids)
        s.stack("entropy")        # [layers, batch, heads, L]

    Takes a :class:`attnlab.WeightSummary` or its keywords. Calls that ask for their weights
    (``output_attentions=True``) still get them, and their summaries from a second pass. CPU
    tensors only (CUDA calls raise ``NotImplementedError``).

    ``keep_inputs=True`` also keeps each call's query, key and mask (references to the call's
    own tensors, not copies: about ``2 × L × head size`` values per head and layer, plus the
    mask when one is given), so that :meth:`Summaries.block_weights` can recompute the exact
    weights of any pooled block afterwards, and :func:`attnlab.viz.summary_view` can embed
    them. The tensors must not be changed in place afterwards."""

    def __init__(self, summary: WeightSummary | None = None, *, keep_inputs: bool = False,
                 **keywords):
        if summary is not None and keywords:
            raise TypeError("give a WeightSummary or its keywords, not both")
        if not isinstance(keep_inputs, bool):
            raise TypeError(f"keep_inputs must be a bool, got {keep_inputs!r}")
        self.summaries = Summaries(summary if summary is not None else WeightSummary(**keywords),
                                   keep_inputs=keep_inputs)
        self._handle = None

    def __enter__(self) -> Summaries:
        if self._handle is not None:
            raise RuntimeError("this summarize() is already active; use a new one")
        self._handle = functional.register_summary_hook(self.summaries.summary,
                                                        self.summaries._record)
        return self.summaries

    def __exit__(self, *exc_info) -> bool:
        self._handle.remove()
        self._handle = None
        return False
