"""The attention recorder: every ``attnlab.functional.scaled_dot_product_attention`` call made
while it is active keeps its weights and, after the backward, the gradient of the loss with
respect to them (dP, which the fused backward computes anyway)."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import functional


class _RecordedAttention(torch.autograd.Function):
    """The attention operator with its weights kept, and their gradient dP = dO·Vᵀ taken from
    the fused backward (``_sdpa_backward(..., grad_weights=True)``) instead of an autograd graph
    over the [..., L_q, L_k] weights."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, recorder, index):
        output, logsumexp, weights = torch.ops.attnlab._sdpa_forward(
            query, key, value, attn_mask, is_causal, scale, True)
        ctx.save_for_backward(query, key, value, attn_mask, output, logsumexp, weights)
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.recorder, ctx.index = recorder, index
        ctx.mark_non_differentiable(weights)
        ctx.set_materialize_grads(False)
        return output, weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, _grad_weights):
        if grad_output is None:
            return (None,) * 8
        query, key, value, attn_mask, output, logsumexp, weights = ctx.saved_tensors
        grad_mask = attn_mask is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dmask, dweights = torch.ops.attnlab._sdpa_backward(
            grad_output, query, key, value, attn_mask, ctx.is_causal, ctx.scale, output,
            logsumexp, weights, grad_mask, True)
        ctx.recorder._add_grad(ctx.index, dweights)
        return dq, dk, dv, (dmask if grad_mask else None), None, None, None, None


class Recorder:
    """Keeps the attention weights of every ``attnlab.functional.scaled_dot_product_attention``
    call made inside its ``with`` block, in call order, and, once a backward has passed
    through them, the gradient of the loss with respect to each call's weights.

    Use it through :func:`record`. Both lists come in the maps format of
    :mod:`attnlab.interpret`: one tensor per call, shaped like that call's weights
    (``[batch, heads, L_q, L_k]`` for attnlab's multi-head modules).

    The backward may run inside the block or after it. Gradients of several backward passes
    through the same calls add up, as ``.grad`` does. Recording is for eager mode: under
    ``torch.compile`` the recorder's Python bookkeeping breaks the graph.
    """

    def __init__(self):
        self._weights: list[torch.Tensor] = []
        self._grads: list[torch.Tensor | None] = []
        self._inputs: list[torch.Tensor] = []
        self._keep_inputs = False
        self._previous = None
        self._active = False

    def __enter__(self) -> "Recorder":
        if self._active:
            raise RuntimeError("this Recorder is already active; use a new attnlab.interpret."
                               "record() for a nested recording")
        self._previous = functional._recorder
        functional._recorder = self
        self._active = True
        return self

    def __exit__(self, *exc_info):
        functional._recorder = self._previous
        self._previous = None
        self._active = False
        return False

    def __len__(self) -> int:
        """The number of attention calls recorded."""
        return len(self._weights)

    def _attend(self, query, key, value, attn_mask, is_causal, scale, need_weights,
                normalizer="softmax", alpha=None):
        """One recorded call; results as ``attnlab.functional.scaled_dot_product_attention``."""
        if normalizer == "softmax" and alpha is None:
            output, weights = _RecordedAttention.apply(query, key, value, attn_mask, is_causal,
                                                       scale, self, len(self._weights))
        else:
            # A sparse normalizer: the operator's own autograd, and dP = dO·Vᵀ from the output's
            # gradient as it passes.
            output, weights = torch.ops.attnlab.scaled_dot_product_attention(
                query, key, value, attn_mask, is_causal, scale, True, normalizer, alpha)
            if output.requires_grad:
                index = len(self._weights)
                output.register_hook(
                    lambda grad: self._add_grad(index, grad @ value.transpose(-2, -1)))
        self._weights.append(weights)
        self._grads.append(None)
        if self._keep_inputs:
            self._inputs.extend(t for t in (query, key, value, attn_mask)
                                if isinstance(t, torch.Tensor) and t.requires_grad)
        return output, (weights if need_weights else None)

    def _add_grad(self, index: int, grad: torch.Tensor):
        previous = self._grads[index]
        self._grads[index] = grad if previous is None else previous + grad

    @property
    def weights(self) -> tuple[torch.Tensor, ...]:
        """The attention weights of each recorded call, in call order (not differentiable)."""
        return tuple(self._weights)

    @property
    def grads(self) -> tuple[torch.Tensor, ...]:
        """∂loss/∂weights of each recorded call, in call order, shaped like its weights:
        ``grad_output · valueᵀ`` at every position, masked ones included (the weights taken as
        free variables; relevance methods multiply it by the weights, which are 0 there).

        A call whose output did not reach the loss gets zeros. Raises ``RuntimeError`` when no
        backward has passed through any recorded call yet."""
        if not self._weights:
            raise RuntimeError("attnlab.interpret: no attention call was recorded")
        if all(g is None for g in self._grads):
            raise RuntimeError(
                "attnlab.interpret: no gradient recorded yet; call loss.backward() (inside or "
                "after the record() block) on a loss computed from the recorded attention, "
                "with gradients enabled")
        return tuple(torch.zeros_like(w) if g is None else g
                     for w, g in zip(self._weights, self._grads))

    def clear(self):
        """Forgets every recorded call (the block, if active, goes on recording)."""
        self._weights, self._grads, self._inputs = [], [], []


def record() -> Recorder:
    """A context manager that records every attention call made through
    ``attnlab.functional.scaled_dot_product_attention`` (which attnlab's modules and the
    Hugging Face backend use) in call order::

        with attnlab.interpret.record() as rec:
            loss = model(x).logsumexp(-1).sum()
        loss.backward()
        rec.weights, rec.grads    # tuples, one [batch, heads, L_q, L_k] tensor per call

    Inside the block, ``attnlab.nn.EncoderBlock`` runs module by module instead of through its
    fused operator. Recordings nest; only the innermost one records. The recording is
    process-wide (calls from every thread are captured)."""
    return Recorder()
