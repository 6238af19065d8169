"""Functional attention ops: thin wrappers over torch.ops.attnlab."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

# Hooks that see every call of scaled_dot_product_attention (register_attention_hook). With
# none registered the cost of a call is one check of this list's length. Process-wide: a hook
# sees the calls of every thread.
_hooks: list = []
# (WeightSummary, hook) pairs of register_summary_hook: hooks that see each call's summaries.
_summary_hooks: list = []


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One call of :func:`scaled_dot_product_attention`, as an attention hook sees it: the
    inputs, the output and the normalized weights (always computed while a hook is registered,
    whether or not the caller asked for them), or for a summary hook
    (:func:`register_summary_hook`) the summaries instead of the weights. The tensors are the call's own: a hook may keep
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
    weights: torch.Tensor | None
    summary: "AttentionSummary | None" = None


@dataclasses.dataclass(frozen=True)
class WeightSummary:
    """Which summaries of the attention weights :func:`scaled_dot_product_attention` computes
    inside its fused CPU kernel (``summary=``), in place of the ``[..., L_q, L_k]`` weights:
    memory O(L·k) beside the output, whatever the length.

    Args:
        received: the attention each key receives, ``Σ_i P_ij`` ``[..., L_k]``.
        entropy: each query's entropy ``−Σ_j P_ij log P_ij`` in nats ``[..., L_q]``.
        topk: the ``k`` largest weights of each query, descending, with their keys
            ``[..., L_q, k]`` (ties: the lower key first); at most ``L_k``.
        pool: the mean weight in each ``pool × pool`` block ``[..., ⌈L_q/pool⌉, ⌈L_k/pool⌉]``
            (an edge block: the mean over its own cells).
        to: keys (ints in ``[0, L_k)``) whose weight from every query is kept,
            ``[..., L_q, len(to)]``.

    A query whose keys are all masked has zero weights, so zero summaries: entropy 0, received
    and pooled add nothing, top-k weights 0 at keys ``0 .. k−1``.
    """

    received: bool = False
    entropy: bool = False
    topk: int | None = None
    pool: int | None = None
    to: tuple | list | None = None

    def __post_init__(self):
        for name in ("received", "entropy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"WeightSummary: {name} must be a bool, got "
                                f"{getattr(self, name)!r}")
        for name in ("topk", "pool"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"WeightSummary: {name} must be a positive int or None, got "
                                f"{value!r}")
            if value is not None and value <= 0:
                raise ValueError(f"WeightSummary: {name} must be a positive int, got {value}")
        if self.to is not None:
            keys = tuple(self.to.tolist() if isinstance(self.to, torch.Tensor) else self.to)
            if not keys or any(isinstance(t, bool) or not isinstance(t, int) for t in keys):
                raise TypeError(f"WeightSummary: to must be a non-empty sequence of key "
                                f"indices (ints), got {self.to!r}")
            object.__setattr__(self, "to", keys)
        if not (self.received or self.entropy or self.topk or self.pool or self.to):
            raise ValueError("WeightSummary: ask for at least one summary (received, entropy, "
                             "topk, pool or to)")


@dataclasses.dataclass(frozen=True)
class AttentionSummary:
    """The summaries a :class:`WeightSummary` asked for (the others are ``None``), at the
    output's batch shape. They carry no gradient; for float16 and bfloat16 inputs they are
    float32."""

    received: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None
    topk_indices: torch.Tensor | None = None
    pooled: torch.Tensor | None = None
    to: torch.Tensor | None = None


def _summarize(query, key, value, attn_mask, is_causal, scale, normalizer, alpha, summary,
               grouped):
    """(output, AttentionSummary) from the fused forward that reduces the weights in place."""
    if not isinstance(summary, WeightSummary):
        raise TypeError(f"summary must be an attnlab.WeightSummary, got "
                        f"{type(summary).__name__}")
    if query.device.type != "cpu":
        raise NotImplementedError(f"summary= runs in the CPU kernels only; the query is on "
                                  f"{query.device} (ask for need_weights=True there, or move "
                                  f"the tensors to the CPU)")
    with torch.no_grad():
        output, received, entropy, topk_w, topk_i, pooled, to = \
            torch.ops.attnlab._sdpa_summaries(query, key, value, attn_mask, is_causal, scale,
                                              normalizer, alpha, summary.received,
                                              summary.entropy, summary.topk or 0,
                                              summary.pool or 0, list(summary.to or ()))
    # [..., H_kv, G, ...] back to [..., H_q, ...] for grouped heads; None where not asked for.
    def shaped(tensor, asked, trailing):
        if not asked:
            return None
        return tensor.flatten(-2 - trailing, -1 - trailing) if grouped else tensor

    if grouped:
        output = output.flatten(-4, -3)
    return output, AttentionSummary(
        received=shaped(received, summary.received, 1),
        entropy=shaped(entropy, summary.entropy, 1),
        topk_weights=shaped(topk_w, summary.topk, 2),
        topk_indices=shaped(topk_i, summary.topk, 2),
        pooled=shaped(pooled, summary.pool, 2),
        to=shaped(to, summary.to, 2))


class _HookHandle:
    """What register_attention_hook and register_summary_hook return: ``remove()``
    unregisters the hook (also as a context manager, on leaving the block)."""

    def __init__(self, hook, registry=None):
        self._hook = hook
        self._registry = _hooks if registry is None else registry

    def remove(self) -> None:
        for i, registered in enumerate(self._registry):
            if registered is self._hook:
                del self._registry[i]
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


def register_summary_hook(summary: WeightSummary, hook) -> _HookHandle:
    """Calls ``hook(call)`` after every call of :func:`scaled_dot_product_attention` with an
    :class:`AttentionCall` whose ``summary`` holds the summaries ``summary`` asks for and whose
    ``weights`` are ``None`` (unless the caller asked for them), until the returned handle's
    ``remove()``. Calls that do not ask for their weights then run the fused forward with the
    summaries: one pass, no ``L × L`` weights. ``attnlab.interpret.summarize`` is built on
    this."""
    if not isinstance(summary, WeightSummary):
        raise TypeError(f"summary must be an attnlab.WeightSummary, got "
                        f"{type(summary).__name__}")
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    entry = (summary, hook)
    _summary_hooks.append(entry)
    return _HookHandle(entry, _summary_hooks)


def has_attention_hooks() -> bool:
    """Whether any attention hook is registered (:func:`register_attention_hook`,
    :func:`register_summary_hook`)."""
    return bool(_hooks or _summary_hooks)


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


def dropout_seed() -> int:
    """Draws a seed from torch's default generator exactly as each call of
    :func:`scaled_dot_product_attention` with ``dropout_p > 0`` draws its own: after the same
    ``torch.manual_seed``, the seed that call used (for :func:`dropout_mask`)."""
    return int(torch.empty((), dtype=torch.long).random_())


def dropout_mask(shape, dropout_p: float, seed: int,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The factor dropout multiplies the weights by: ``D`` of ``shape`` ``[..., L_q, L_k]``,
    ``0`` where a weight is dropped and ``1/(1 - dropout_p)`` where it is kept, as the
    operator makes it from ``seed`` (:func:`dropout_seed`). ``shape`` is the output's batch
    shape with ``L_q, L_k``: the weights of a call with dropout are ``P * D``, its output
    ``(P * D) @ value``. Whether a weight is kept is a hash of the seed and its position, so
    any blocking and any number of threads give the same mask."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a number, got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(f"shape must be [..., L_q, L_k], got {shape}")
    return torch.ops.attnlab._dropout_mask(torch.empty(shape, dtype=dtype), float(dropout_p),
                                           seed)


def _check_call(query, key, value, attn_mask, is_causal, scale, need_weights, normalizer, alpha,
                dropout_p, enable_gqa) -> None:
    """TypeError naming the argument for a value of the wrong kind (the operator's own error
    would print its whole schema), and the arguments torch's SDPA takes that attnlab does not
    honour yet."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got "
                        f"{type(attn_mask).__name__}")
    for name, flag in (("is_causal", is_causal), ("need_weights", need_weights),
                       ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__} {scale!r}")
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer must be a string, got {type(normalizer).__name__} "
                        f"{normalizer!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise TypeError(f"alpha must be a number or None, got {type(alpha).__name__} {alpha!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a number, got {type(dropout_p).__name__} "
                        f"{dropout_p!r}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")


def _grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attn_mask: torch.Tensor | None):
    """enable_gqa: query heads [..., H_q, L, E] as [..., H_kv, H_q/H_kv, L, E] against key and
    value heads [..., H_kv, 1, S, E]: each group of query heads sees its key/value head through
    broadcasting, without copies (query head h uses key/value head h // (H_q/H_kv), as torch
    defines it). The mask follows the query's head dimension."""
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if value.shape[-3] != kv_heads or heads % kv_heads:
        raise ValueError(f"enable_gqa=True: query has {heads} heads, key {kv_heads} and value "
                         f"{value.shape[-3]}; key and value need the same number of heads, "
                         f"dividing the query's")
    groups = heads // kv_heads
    query = query.unflatten(-3, (kv_heads, groups))
    key, value = key.unsqueeze(-3), value.unsqueeze(-3)
    if attn_mask is not None and attn_mask.dim() >= 3:
        attn_mask = (attn_mask.unflatten(-3, (kv_heads, groups)) if attn_mask.shape[-3] == heads
                     else attn_mask.unsqueeze(-3))
    return query, key, value, attn_mask


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                                 scale: float | None = None, need_weights: bool = False,
                                 normalizer: str = "softmax", alpha: float | None = None,
                                 dropout_p: float = 0.0, enable_gqa: bool = False,
                                 summary: Any = None
                                 ) -> tuple[torch.Tensor, Any]:
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
        dropout_p: dropout on the weights, as in torch's SDPA: each weight is zeroed with
            probability ``dropout_p`` and the kept ones scaled by ``1/(1 - dropout_p)``, inside
            the fused kernel (CPU). It applies whenever it is > 0 (modules pass it only in
            training). The mask comes from torch's default generator, so ``torch.manual_seed``
            reproduces it, and the backward makes it again instead of storing it
            (:func:`dropout_mask` gives it for a reference). With ``need_weights`` the weights
            returned are the ones used, after dropout; ``summary=`` describes the weights
            before dropout.
        summary: a :class:`WeightSummary`: the second result is then an
            :class:`AttentionSummary` of the weights, reduced inside the fused kernel without
            the ``[..., L_q, L_k]`` weights (CPU only; not with ``need_weights``). The output
            keeps its gradient (where autograd records the call, it comes from the ordinary
            forward, and the summaries from a second pass).
        enable_gqa: grouped-query attention as torch defines it: query ``[..., H_q, L_q, E]``
            against key and value ``[..., H_kv, L_k, E]`` with ``H_kv`` dividing ``H_q``; query
            head ``h`` attends with key/value head ``h // (H_q / H_kv)``, which are shared by
            broadcasting, not copied. A mask's head dimension is the query's.

    Returns:
        The pair ``(output, weights)`` — output ``[..., L_q, E_v]``; weights, or ``None``
        unless ``need_weights``. A query whose keys are all masked gets a zero output and
        zero weights. Where autograd records the call, the weights are differentiable: a loss
        on them (attention supervision, an entropy term) reaches query, key, value and a
        floating-point mask through the operator's own backward, alone or with a loss on the
        output. On CUDA that backward raises ``NotImplementedError`` (detach the weights there).

    Raises:
        TypeError: an argument of the wrong kind (a query that is not a tensor, a non-bool
            flag, ...), named.
        ValueError: ``enable_gqa`` with head counts that do not divide, ``dropout_p`` outside
            ``[0, 1)``.
        NotImplementedError: ``dropout_p`` > 0 on CUDA tensors; a loss on the weights of a
            sparse normalizer with ``dropout_p`` > 0 (raised by the backward).
        RuntimeError: bad shapes, dtypes or devices, an unknown normalizer, or ``alpha``
            missing, misplaced or not > 1; the message names the argument.

    ``torch.jit.script`` compiles functions that call this one (the operator is called
    directly there; attention hooks do not see scripted calls).

    Every hook registered with :func:`register_attention_hook` (``attnlab.interpret.record()``
    among them) sees the call; its results are the same.
    """
    if torch.jit.is_scripting():
        # TorchScript: the operator itself (it checks its arguments' types and shapes).
        if enable_gqa:
            raise NotImplementedError("enable_gqa=True is not available in TorchScript: give "
                                      "key and value the query's heads (repeat_interleave)")
        # (summary= cannot be given there: scripted code cannot make a WeightSummary.)
        output, weights = torch.ops.attnlab.scaled_dot_product_attention(
            query, key, value, attn_mask, is_causal, scale, need_weights, normalizer, alpha,
            float(dropout_p))
        return output, (weights if need_weights else None)
    return _attend(query, key, value, attn_mask, is_causal, scale, need_weights, normalizer,
                   alpha, dropout_p, enable_gqa, summary)


@torch.jit.unused
def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attn_mask: torch.Tensor | None, is_causal: bool, scale: float | None,
            need_weights: bool, normalizer: str, alpha: float | None, dropout_p: float,
            enable_gqa: bool, summary=None):
    """scaled_dot_product_attention outside TorchScript, with the summary hooks."""
    if summary is not None or not _summary_hooks:
        return _attend_core(query, key, value, attn_mask, is_causal, scale, need_weights,
                            normalizer, alpha, dropout_p, enable_gqa, summary)
    hooks = tuple(_summary_hooks)
    args = (query, key, value, attn_mask, is_causal, scale)
    options = (normalizer, alpha, dropout_p, enable_gqa)
    found = {}  # one pass per distinct WeightSummary
    if need_weights:
        output, weights = _attend_core(*args, True, *options)
    else:
        output, found[hooks[0][0]] = _attend_core(*args, False, *options, hooks[0][0])
        weights = None
    for wanted, hook in hooks:
        if wanted not in found:
            found[wanted] = _attend_core(*args, False, *options, wanted)[1]
        hook(AttentionCall(query, key, value, attn_mask, is_causal, scale, normalizer, alpha,
                           output, weights, found[wanted]))
    return output, weights


def _attend_core(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None, is_causal: bool, scale: float | None,
                 need_weights: bool, normalizer: str, alpha: float | None, dropout_p: float,
                 enable_gqa: bool, summary=None):
    """scaled_dot_product_attention outside TorchScript: the checks, grouped heads and hooks."""
    if (type(dropout_p) is not float or type(enable_gqa) is not bool
            or type(need_weights) is not bool or type(is_causal) is not bool):
        _check_call(query, key, value, attn_mask, is_causal, scale, need_weights, normalizer,
                    alpha, dropout_p, enable_gqa)
    try:
        grouped = enable_gqa and min(query.dim(), key.dim(), value.dim()) >= 3 \
            and query.shape[-3] != key.shape[-3]
        q, k, v, mask = _grouped(query, key, value, attn_mask) if grouped else \
            (query, key, value, attn_mask)
        if summary is not None:
            if need_weights:
                raise ValueError("summary= replaces the weights: pass need_weights=False with "
                                 "it")
            records = torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, mask))
            if not records and not _hooks and dropout_p == 0:
                return _summarize(q, k, v, mask, is_causal, scale, normalizer, alpha, summary,
                                  grouped)
            # The output with its gradient (and the hooks' call) from the ordinary forward.
            output, _ = _attend_core(query, key, value, attn_mask, is_causal, scale, False,
                                     normalizer, alpha, dropout_p, enable_gqa)
            return output, _summarize(q, k, v, mask, is_causal, scale, normalizer, alpha,
                                      summary, grouped)[1]
        output, weights = torch.ops.attnlab.scaled_dot_product_attention(
            q, k, v, mask, is_causal, scale, need_weights or bool(_hooks), normalizer, alpha,
            float(dropout_p))
    except (RuntimeError, TypeError, AttributeError):
        # Checked here, on the way out, so that correct calls pay nothing for it: an argument
        # of the wrong kind raises a TypeError that names it.
        _check_call(query, key, value, attn_mask, is_causal, scale, need_weights, normalizer,
                    alpha, dropout_p, enable_gqa)
        raise
    if grouped:
        output = output.flatten(-4, -3)
        weights = weights.flatten(-4, -3) if weights.dim() >= 4 else weights
    if not _hooks:
        return output, (weights if need_weights else None)
    call = AttentionCall(query, key, value, attn_mask, is_causal, scale, normalizer, alpha,
                         output, weights)
    for hook in tuple(_hooks):
        hook(call)
    return output, (weights if need_weights else None)
