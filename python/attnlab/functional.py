"""Functional attention ops: thin wrappers over torch.ops.attnlab."""

from __future__ import annotations

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


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                                 scale: float | None = None, need_weights: bool = False
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(query @ key.transpose(-2, -1) * scale + mask) @ value.

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

    Returns:
        The pair ``(output, weights)`` — output ``[..., L_q, E_v]``; weights, or ``None``
        unless ``need_weights``. A query whose keys are all masked gets a zero output and
        zero weights.

    Inside ``attnlab.interpret.record()`` the call is recorded (weights, and after the backward
    the gradient with respect to them); its results are the same.
    """
    if _recorder is not None:
        return _recorder._attend(query, key, value, attn_mask, is_causal, scale, need_weights)
    output, weights = torch.ops.attnlab.scaled_dot_product_attention(
        query, key, value, attn_mask, is_causal, scale, need_weights)
    return output, (weights if need_weights else None)
