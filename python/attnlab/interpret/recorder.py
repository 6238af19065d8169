"""The attention recorder: every ``attnlab.functional.scaled_dot_product_attention`` call made
while it is active keeps its weights and, after the backward, the gradient of the loss with
respect to them (dP = dO·Vᵀ). It is an attention hook of the operator layer
(``attnlab.functional.register_attention_hook``); the operator's own autograd formula runs
unchanged."""

from __future__ import annotations

import torch

from .. import functional

# The active recorders, innermost last: only the innermost one records a call.
_active: list["Recorder"] = []


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
        self._handle = None

    def __enter__(self) -> "Recorder":
        if self._handle is not None:
            raise RuntimeError("this Recorder is already active; use a new attnlab.interpret."
                               "record() for a nested recording")
        _active.append(self)
        self._handle = functional.register_attention_hook(self._on_call)
        return self

    def __exit__(self, *exc_info):
        self._handle.remove()
        self._handle = None
        _active.remove(self)
        return False

    def __len__(self) -> int:
        """The number of attention calls recorded."""
        return len(self._weights)

    def _on_call(self, call: functional.AttentionCall) -> None:
        """Keeps one call's weights and, as the output's gradient passes in the backward, the
        gradient with respect to the weights taken as free variables: dO·Vᵀ."""
        if not _active or _active[-1] is not self:
            return
        index = len(self._weights)
        if call.output.requires_grad:
            value = call.value.detach()
            # grad is None where autograd passes an undefined gradient (an output that reached
            # no loss through this path): nothing to add.
            call.output.register_hook(
                lambda grad: None if grad is None
                else self._add_grad(index, grad @ value.transpose(-2, -1)))
        # Kept for looking at: a recording holds no autograd graph alive.
        self._weights.append(call.weights.detach())
        self._grads.append(None)
        if self._keep_inputs:
            self._inputs.extend(t for t in (call.query, call.key, call.value, call.attn_mask)
                                if isinstance(t, torch.Tensor) and t.requires_grad)

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
