"""Functional attention ops: thin wrappers over torch.ops.attnlab."""

from __future__ import annotations

import dataclasses
import math

import torch

# Hooks that see every call of scaled_dot_product_attention (register_attention_hook). With
# none registered the cost of a call is one check of this list's length. Process-wide: a hook
# sees the calls of every thread.
_hooks: list = []


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One call of :func:`scaled_dot_product_attention`, as an attention hook sees it: the
    inputs, the output and the normalized weights (always computed while a hook is registered,
    whether or not the caller asked for them). The tensors are the call's own: a hook may keep
    them or register autograd hooks on them (``output.register_hook``), not change them."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    normalizer: str
    alpha: float | None
    output: torch.Tensor
    weights: torch.Tensor


class _HookHandle:
    """What register_attention_hook returns: ``remove()`` unregisters the hook (also as a
    context manager, on leaving the block)."""

    def __init__(self, hook):
        self._hook = hook

    def remove(self) -> None:
        for i, registered in enumerate(_hooks):
            if registered is self._hook:
                del _hooks[i]
                return

    def __enter__(self) -> "_HookHandle":
        return self

    def __exit__(self, *exc_info) -> bool:
        self.remove()
        return False


def register_attention_hook(hook) -> _HookHandle:
    """Calls ``hook(call)`` with an :class:`AttentionCall` after every call of
    :func:`scaled_dot_product_attention` (which attnlab's modules, tutorial adapters and the
    Hugging Face backend use), until the returned handle's ``remove()``. Hooks run in the order
    registered; the call's results are the same as without hooks. While any hook is registered,
    modules with a fused path that computes attention internally (``attnlab.nn.EncoderBlock``)
    take their module-by-module path, so that every attention call is seen.
    ``attnlab.interpret.record`` is built on this."""
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    _hooks.append(hook)
    return _HookHandle(hook)


def has_attention_hooks() -> bool:
    """Whether any attention hook is registered (:func:`register_attention_hook`)."""
    return bool(_hooks)


NORMALIZERS = ("softmax", "sparsemax", "entmax15", "entmax")
"""The names ``normalizer=`` takes: softmax, sparsemax (α = 2), entmax-1.5 (α = 1.5) and
α-entmax for any ``alpha > 1``."""


def check_normalizer(normalizer: str, alpha: float | None) -> None:
    """Raises ``ValueError`` (``TypeError`` for a wrong type) unless ``normalizer`` and
    ``alpha`` form a valid choice: a name of :data:`NORMALIZERS`, with ``alpha`` (a finite
    number > 1) given for ``"entmax"`` and only for it. Modules call it when they are built;
    the operator itself checks the same and raises ``RuntimeError``."""
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer must be a string, one of {', '.join(map(repr, NORMALIZERS))}"
                        f"; got {normalizer!r}")
    if normalizer not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {normalizer!r}; expected one of "
                         f"{', '.join(map(repr, NORMALIZERS))}")
    if normalizer != "entmax":
        if alpha is not None:
            raise ValueError(f"alpha is only taken by normalizer='entmax' (sparsemax is alpha=2, "
                             f"entmax15 alpha=1.5), got alpha={alpha!r} with "
                             f"normalizer={normalizer!r}")
        return
    if alpha is None:
        raise ValueError("normalizer='entmax' needs alpha, a finite number > 1 (2 is sparsemax, "
                         "1.5 entmax-1.5)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a number, got {alpha!r}")
    if not math.isfinite(alpha) or alpha <= 1:
        raise ValueError(f"alpha must be a finite number > 1 (2 is sparsemax, 1.5 entmax-1.5; "
                         f"alpha -> 1 approaches softmax), got {alpha}")


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                                 scale: float | None = None, need_weights: bool = False,
                                 normalizer: str = "softmax", alpha: float | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """normalize(query @ key.transpose(-2, -1) * scale + mask) @ value, normalize = softmax by
    default, or a sparse normalizer (sparsemax, entmax) that gives keys exactly zero weight.

    Args:
        query: ``[..., L_q, E]``; key: ``[..., L_k, E]``; value: ``[..., L_k, E_v]``. Leading
            (batch) dimensions broadcast, as in ``torch.nn.functional.scaled_dot_product_attention``.
        attn_mask: boolean (``True`` = may attend) or floating point (added to the scores),
            broadcastable to ``[..., L_q, L_k]``. A floating-point mask that requires grad
            receives the gradient of the scores (e.g. a learnable position bias).
        is_causal: query ``i`` sees keys ``j <= i`` (top-left aligned, as in PyTorch); may be
            combined with ``attn_mask``.
        scale: multiplies the scores; ``1/sqrt(E)`` when ``None``.
        need_weights: also return the normalized attention weights ``[..., L_q, L_k]``.
        normalizer: how each query's scores ``z`` become weights: ``"softmax"`` (default),
            ``"sparsemax"`` (Martins & Astudillo, 2016), ``"entmax15"`` (1.5-entmax, Peters et
            al., 2019) or ``"entmax"`` (α-entmax, Blondel et al., 2019, with ``alpha``). The
            sparse ones give ``p_j = [(α-1)·z_j - τ]_+^(1/(α-1))`` with the threshold ``τ`` that
            makes the row sum to 1: keys below it get exactly 0 (sparsemax: α = 2; entmax15:
            α = 1.5). CPU: float32 and float64.
        alpha: the α of ``normalizer="entmax"``, a finite number > 1 (α → 1 approaches softmax;
            2 and 1.5 take the exact sparsemax and entmax-1.5 paths). Only with ``"entmax"``.

    Returns:
        The pair ``(output, weights)`` — output ``[..., L_q, E_v]``; weights, or ``None``
        unless ``need_weights``. A query whose keys are all masked gets a zero output and
        zero weights.

    Raises:
        RuntimeError: bad shapes, dtypes or devices, an unknown normalizer, or ``alpha``
            missing, misplaced or not > 1; the message names the argument.

    Every hook registered with :func:`register_attention_hook` (``attnlab.interpret.record()``
    among them) sees the call; its results are the same.
    """
    if not _hooks:
        output, weights = torch.ops.attnlab.scaled_dot_product_attention(
            query, key, value, attn_mask, is_causal, scale, need_weights, normalizer, alpha)
        return output, (weights if need_weights else None)
    output, weights = torch.ops.attnlab.scaled_dot_product_attention(
        query, key, value, attn_mask, is_causal, scale, True, normalizer, alpha)
    call = AttentionCall(query, key, value, attn_mask, is_causal, scale, normalizer, alpha,
                         output, weights)
    for hook in tuple(_hooks):
        hook(call)
    return output, (weights if need_weights else None)
