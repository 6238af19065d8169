"""Functional attention ops: thin wrappers over torch.ops.attnlab."""

from __future__ import annotations

import math

import torch

# The active attention recorder (attnlab.interpret.record) or None. While one is active, every
# call below goes through it, so that it keeps each call's weights and, after the backward,
# the gradient of the loss with respect to them. Outside a recording the cost is this one
# global lookup. The slot is process-wide: a recording captures the calls of every thread.
_recorder = None


def is_recording() -> bool:
    """Whether an ``attnlab.interpret.record()`` block is active. Modules with a fused path
    that computes attention internally (``attnlab.nn.EncoderBlock``) take their module-by-module
    path while it is, so that every attention call is seen."""
    return _recorder is not None


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

    Inside ``attnlab.interpret.record()`` the call is recorded (weights, and after the backward
    the gradient with respect to them); its results are the same.
    """
    if _recorder is not None:
        return _recorder._attend(query, key, value, attn_mask, is_causal, scale, need_weights,
                                 normalizer, alpha)
    output, weights = torch.ops.attnlab.scaled_dot_product_attention(
        query, key, value, attn_mask, is_causal, scale, need_weights, normalizer, alpha)
    return output, (weights if need_weights else None)
