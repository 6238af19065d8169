"""explain(): one forward (and for gradient relevance one backward) under the recorder, and the
relevance of the chosen method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .methods import attention_flow, gradient_relevance, rollout
from .recorder import record

METHODS = ("gradient", "rollout", "flow")


@dataclass
class Explanation:
    """What :func:`explain` found.

    Attributes:
        relevance: ``[batch, L, L]``; row i: how much each input position matters for output
            position i (for a classifier reading a ``[CLS]`` token at position 0, row 0).
        output: what the forward returned.
        score: the scalar that was explained (``None`` for rollout and flow).
        weights: the recorded attention maps, one per call.
        grads: the gradient of ``score`` with respect to each map (``None`` for rollout and
            flow).
    """

    relevance: torch.Tensor
    output: Any
    score: torch.Tensor | None
    weights: tuple[torch.Tensor, ...]
    grads: tuple[torch.Tensor, ...] | None


def _logits(output) -> torch.Tensor:
    """The tensor a target indexes: the output itself, its ``logits`` (Hugging Face model
    outputs) or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"explain: cannot find a tensor in the forward's output of type "
                    f"{type(output).__name__}; pass target as a function of the output that "
                    f"returns the scalar to explain")


def _score(output, target) -> torch.Tensor:
    if callable(target):
        score = target(output)
        if not isinstance(score, torch.Tensor) or score.numel() != 1:
            raise ValueError(f"explain: target(output) must return a one-element tensor, got "
                             f"{score!r:.80}")
        return score.reshape(())
    logits = _logits(output)
    if target is None:
        if logits.numel() != 1:
            raise ValueError(f"explain: the output has shape {list(logits.shape)}; pass target "
                             f"(a class index, a tensor of them, or a function of the output)")
        return logits.reshape(())
    classes = logits.shape[-1] if logits.dim() > 0 else 0
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < classes:
            raise ValueError(f"explain: target must be a class index in [0, {classes - 1}], got "
                             f"{target}")
        return logits[..., target].sum()
    if isinstance(target, torch.Tensor) and not target.is_floating_point() \
            and target.dtype != torch.bool:
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"explain: a tensor target must have the output's leading shape "
                             f"{list(logits.shape[:-1])} (one class per entry), got "
                             f"{list(target.shape)}")
        if target.numel() and (target.min() < 0 or target.max() >= classes):
            raise ValueError(f"explain: target holds class indices outside [0, {classes - 1}]")
        return logits.gather(-1, target.to(logits.device).unsqueeze(-1)).sum()
    raise TypeError(f"explain: target must be None, an int, an integer tensor or a function of "
                    f"the output, got {type(target).__name__}")


def explain(forward: Callable[[], Any],
            target: int | torch.Tensor | Callable[[Any], torch.Tensor] | None = None,
            method: str = "gradient", start_layer: int = 0, **options: Any) -> Explanation:
    """Runs ``forward()`` under :func:`record` and returns the relevance of its inputs.

    Example::

        from attnlab.models import TransformerPredictor
        model = TransformerPredictor(10, 32, 10, num_heads=2, num_layers=2)
        x = torch.nn.functional.one_hot(torch.randint(10, (1, 16)), 10).float()
        exp = attnlab.interpret.explain(lambda: model(x), target=lambda out: out[0, 3].max())
        exp.relevance[0, 3]    # how much position 3's top logit draws on each input position

    Args:
        forward: called once with no arguments; every attention call it makes through
            ``attnlab.functional.scaled_dot_product_attention`` is recorded. All of them must be
            self-attention maps of one shape (one per layer).
        target: what to explain (``method="gradient"`` only): ``None`` when the output is a
            one-element tensor; a class index (``output[..., target]``, summed over the batch,
            whose entries stay independent); an integer tensor with one class per entry; or a
            function ``target(output) -> one-element tensor``. The output is the forward's
            result, its ``logits`` attribute, or its first element.
        method: ``"gradient"`` (:func:`gradient_relevance`, one backward), ``"rollout"``
            (:func:`rollout`) or ``"flow"`` (:func:`attention_flow`); the last two run the
            forward without gradients.
        start_layer: the first layer taken into account.
        **options: passed to the method (``residual``, ``head_fusion`` for rollout and flow;
            ``output_positions``, ``progress`` for flow).

    The backward uses ``torch.autograd.grad`` on the recorded attention inputs, so the
    model's parameters' ``.grad`` are left untouched.
    """
    if method not in METHODS:
        raise ValueError(f"explain: method must be one of {', '.join(map(repr, METHODS))}, got "
                         f"{method!r}")
    if not callable(forward):
        raise TypeError(f"explain: forward must be a function taking no arguments, got "
                        f"{type(forward).__name__}")
    if method == "gradient" and options:
        raise TypeError(f"explain: method 'gradient' takes no options, got "
                        f"{', '.join(sorted(options))}")
    rec = record()
    rec._keep_inputs = method == "gradient"
    with rec, torch.set_grad_enabled(method == "gradient"):
        output = forward()
    if len(rec) == 0:
        raise RuntimeError("explain: forward() made no attention call through "
                           "attnlab.functional.scaled_dot_product_attention")
    if method != "gradient":
        explain_fn = rollout if method == "rollout" else attention_flow
        relevance = explain_fn(rec.weights, start_layer=start_layer, **options)
        return Explanation(relevance, output, None, rec.weights, None)
    score = _score(output, target)
    if not score.requires_grad or not rec._inputs:
        raise RuntimeError("explain: the score does not depend on the recorded attention through "
                           "anything that requires grad; are the model's parameters frozen? "
                           "(model.requires_grad_(True))")
    torch.autograd.grad(score, rec._inputs, allow_unused=True)
    rec._inputs = []
    if all(g is None for g in rec._grads):
        raise RuntimeError("explain: the score does not depend on any recorded attention call")
    relevance = gradient_relevance(rec.weights, rec.grads, start_layer=start_layer)
    return Explanation(relevance, output, score.detach(), rec.weights, rec.grads)
