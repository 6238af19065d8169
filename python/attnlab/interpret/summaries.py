"""Summaries of every attention call of a model, at any length: the fused forward reduces the
weights as it makes them, so no call holds its ``L × L`` weights."""

from __future__ import annotations

import torch

from .. import functional
from ..functional import AttentionSummary, WeightSummary


class Summaries:
    """The summaries of each attention call recorded by :func:`summarize`, in call order (for a
    model: one per layer and forward pass). ``summaries[i]`` is call ``i``'s
    :class:`attnlab.AttentionSummary`, each at that call's ``[batch, heads, ...]`` shape."""

    def __init__(self, summary: WeightSummary):
        self.summary = summary
        self.calls: list[AttentionSummary] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __getitem__(self, index: int) -> AttentionSummary:
        return self.calls[index]

    def __iter__(self):
        return iter(self.calls)

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
    tensors only (CUDA calls raise ``NotImplementedError``)."""

    def __init__(self, summary: WeightSummary | None = None, **keywords):
        if summary is not None and keywords:
            raise TypeError("give a WeightSummary or its keywords, not both")
        self.summaries = Summaries(summary if summary is not None else WeightSummary(**keywords))
        self._handle = None

    def __enter__(self) -> Summaries:
        if self._handle is not None:
            raise RuntimeError("this summarize() is already active; use a new one")
        self._handle = functional.register_summary_hook(
            self.summaries.summary, lambda call: self.summaries.calls.append(call.summary))
        return self.summaries

    def __exit__(self, *exc_info) -> bool:
        self._handle.remove()
        self._handle = None
        return False
