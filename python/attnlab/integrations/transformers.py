"""attnlab as an attention backend for Hugging Face ``transformers`` models.

Importing this module registers the name ``"attnlab"`` with transformers' ``AttentionInterface``
(the attention function) and ``AttentionMaskInterface`` (the masks it is given), so any model
that accepts ``attn_implementation`` runs every attention layer through
:func:`attnlab.functional.scaled_dot_product_attention`::

    import attnlab.integrations.transformers  # registers "attnlab"
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, attn_implementation="attnlab")   # or from_config
    out = model(**batch, output_attentions=True)
    out.attentions       # one [batch, heads, q, k] tensor per layer, from the fused kernel

- **Attention weights** are computed only when the model is asked for them
  (``output_attentions=True`` in the call); they then come from the same fused computation as the
  output (``need_weights=True``), and are differentiable as eager's are. Otherwise no ``L x L`` weights
  tensor is made. transformers refuses ``output_attentions=True`` *in the config* (at
  ``from_pretrained`` or on ``model.config``) for every implementation but ``"eager"``; ask for
  them per call instead. Models whose layers do not pass the request on (GPT-2, Falcon,
  Pix2Struct's vision encoder) get their attentions too.
- **Masks** are transformers' boolean masks (``True`` = may attend), or ``None`` with a causal
  flag when no padding is present; 4-D masks given by the caller (boolean or additive float)
  are passed on as they are, but for rows that may attend to no key (below).
- **Grouped-query attention** runs without repeating keys and values: the query heads of one
  group see the same key/value head through broadcasting (query head ``h`` uses key/value head
  ``h // (num_heads // num_kv_heads)``, as in transformers' ``repeat_kv``).
- **Dropout on the attention weights** (a model in training mode) runs inside attnlab's kernel,
  with the model's probability, its mask drawn from torch's generator; the attentions returned
  are the weights after dropout, as eager's are.
- Features the operator lacks (soft-capping, attention sinks, position biases, paged caches,
  flash-attention packing arguments) and keyword arguments this backend does not know raise,
  rather than being ignored. So does LongT5, whose encoder computes its attention in its own
  layers, never through the interface: it would otherwise run its own attention under this
  name.
- A query row whose keys are all masked (e.g. left padding in a causal model) gets what
  ``"eager"`` gives it: uniform weights over all keys, and eager's gradients. transformers'
  shifted loss reads the logits at the last such position, so padded training gives eager's
  loss and gradients. (attnlab's operator itself gives such rows zeros.)
- **Sparse normalizers**: ``"attnlab_sparsemax"`` and ``"attnlab_entmax15"`` are registered too,
  and run every attention layer with sparsemax or 1.5-entmax instead of softmax (weights with
  exact zeros; see ``normalizer=`` of :func:`attnlab.functional.scaled_dot_product_attention`).
  A model trained with softmax computes something else under them: they are for training or
  fine-tuning with a sparse attention. ``register(name, normalizer="entmax", alpha=1.3)`` adds
  any other.

Needs ``pip install attnlab[hf]`` (transformers 5.23 or newer).
"""

from __future__ import annotations

import functools
import sys

import torch

try:
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as error:
    raise ImportError(
        "attnlab.integrations.transformers needs Hugging Face transformers (5.23 or newer): "
        "pip install attnlab[hf]") from error

try:  # where transformers keeps the outputs (attentions, hidden states) a forward should collect
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover - other transformers versions
    _active_collector = None

from .. import functional

NAME = "attnlab"
"""The ``attn_implementation`` name of attnlab's softmax attention."""

SPARSE_NAMES = {"attnlab_sparsemax": ("sparsemax", None), "attnlab_entmax15": ("entmax15", None)}
"""The sparse-normalizer backends this module also registers: name → (normalizer, alpha)."""

_registered: set[str] = set()  # every name register() has given transformers

# Keyword arguments models pass to their attention function that do not change what the
# attention computes here (transformers has already folded them into the mask, or they are for
# other parts of the model), so the backend may ignore them.
_IGNORED_KWARGS = frozenset({
    "position_ids",            # positions; packed sequences are already in the mask
    "cache_position",
    "use_cache",
    "past_key_values",         # the layer has already updated the cache and passes its keys
    "output_hidden_states",
    "output_router_logits",
    "num_items_in_batch",
    "encoder_hidden_states",   # cross attention: its keys/values are already projected
    "sliding_window",          # the mask transformers builds already holds the window
    "return_dict",
    "deterministic",           # flash-attention's choice of a deterministic backward; attnlab's
                               # is always deterministic
})

# Features that change the result and that the operator does not have: refused unless unset.
_UNSUPPORTED_KWARGS = {
    "softcap": "soft-capping of the attention logits",
    "s_aux": "attention sinks (s_aux)",
    "position_bias": "an additive position bias passed beside the mask",
    "cache": "paged attention caches",
    "head_mask": "head masks",
    "cu_seq_lens_q": "flash-attention packing arguments (give position_ids instead)",
    "cu_seq_lens_k": "flash-attention packing arguments (give position_ids instead)",
    "max_length_q": "flash-attention packing arguments (give position_ids instead)",
    "max_length_k": "flash-attention packing arguments (give position_ids instead)",
    "seq_idx": "packed-sequence indices (give position_ids instead)",
}


def _weights_requested(output_attentions) -> bool:
    """Whether the running forward asks for attention weights.

    Models decorated with transformers' ``capture_outputs`` collect the attentions through hooks
    on the attention modules; the collector of the running forward lists ``"attentions"`` (or
    ``"cross_attentions"``, ...) when they were requested, and some models (GPT-2) do not pass
    ``output_attentions`` on to the attention function at all. Others pass
    ``output_attentions`` down, which is honoured too. (Without the collector, in another
    transformers version, GPT-2-like models would then return no attentions, never wrong ones;
    the tests catch it.) Where a module takes ``output_attentions`` and keeps it, the request
    is read from its call: the nearest caller whose ``output_attentions`` argument is ``True``
    or ``False``, looking no further up than the model's own ``forward``. That caller is the
    attention layer itself in Falcon, and the encoder two modules above it in Pix2Struct's
    vision model.
    """
    if output_attentions:
        return True
    if _active_collector is not None:
        collected = _active_collector.get()
        if collected and any(key.endswith("attentions") for key in collected):
            return True
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        # f_locals copies a frame's variables: read only those of forward methods (the model's
        # among them) and of functions with an output_attentions argument.
        if frame.f_globals.get("__name__") != __name__ and (
                code.co_name == "forward" or "output_attentions" in code.co_varnames):
            local = frame.f_locals
            requested = local.get("output_attentions")
            if isinstance(requested, bool):
                return requested
            if isinstance(local.get("self"), PreTrainedModel):
                return False  # the model's forward, which does not take the argument
        frame = frame.f_back
    return False


def _check_kwargs(module: torch.nn.Module, kwargs: dict) -> None:
    unsupported = [name for name, value in kwargs.items()
                   if name in _UNSUPPORTED_KWARGS and value is not None]
    if unsupported:
        what = ", ".join(f"{name} ({_UNSUPPORTED_KWARGS[name]})" for name in unsupported)
        raise ValueError(f"attn_implementation='{NAME}': {type(module).__name__} passed {what}, "
                         "which attnlab's attention does not support; use "
                         "attn_implementation='eager' for this model")
    unknown = sorted(name for name, value in kwargs.items()
                     if name not in _IGNORED_KWARGS and name not in _UNSUPPORTED_KWARGS
                     and value is not None)
    if unknown:
        raise TypeError(f"attn_implementation='{NAME}': {type(module).__name__} passed the "
                        f"keyword argument(s) {', '.join(map(repr, unknown))}, which this "
                        "backend does not know how to honour; use attn_implementation='eager' "
                        "or report the model")


def _as_eager_for_empty_rows(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask itself, unless a query row in it may attend to no key (left padding in a
    causal model): then the additive mask eager builds, 0 where attending and the dtype's
    lowest value elsewhere. Added to such a row's scores, that value swallows them all, so the
    row's weights are uniform over every key and its gradients are eager's; attnlab gives a row
    masked with False (or -inf) zeros instead. (In float16, whose lowest value is -65504, the
    row's scores are not swallowed, and its weights are the softmax of its scores.)"""
    if bool(mask.any(-1).all()):
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, output_attentions: bool | None = None,
                      *, normalizer: str = "softmax", alpha: float | None = None, **kwargs):
    """The attention function transformers calls for ``attn_implementation="attnlab"``.

    Args:
        module: the attention layer calling (read for ``is_causal`` when the argument is unset).
        query: ``[B, H, L_q, D]``; key, value: ``[B, H_kv, L_k, D]`` and ``[B, H_kv, L_k, D_v]``,
            ``H`` a multiple of ``H_kv`` (grouped-query attention).
        attention_mask: ``None``, or a mask broadcastable to ``[B, H, L_q, L_k]``: boolean
            (``True`` = may attend) or floating point (added to the scores).
        dropout: attention dropout probability (models pass it in training mode), applied to
            the weights inside attnlab's kernel as eager applies it; the weights returned are
            those after dropout, as eager's are.
        scaling: multiplies the scores; ``1/sqrt(D)`` when ``None``.
        is_causal: whether the layer is causal (default ``module.is_causal``, else ``True``);
            used only when ``attention_mask`` is ``None`` and ``L_q > 1``, as transformers'
            masks already hold causality otherwise.
        output_attentions: ask for the weights; they are also computed whenever the running
            model forward collects attentions.
        normalizer: ``"softmax"`` (``attn_implementation="attnlab"``), or the sparse normalizer
            a name registered by :func:`register` fixes (``"sparsemax"``, ``"entmax15"``,
            ``"entmax"``).
        alpha: the α of ``normalizer="entmax"``.
        **kwargs: what models pass besides; those that do not change the attention are ignored,
            anything else raises ``TypeError`` / ``ValueError``.

    Returns:
        ``(output [B, L_q, H, D_v], weights [B, H, L_q, L_k] or None)``.
    """
    _check_kwargs(module, kwargs)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"attn_implementation='{NAME}': query, key and value must be "
                         f"[batch, heads, length, head_dim], got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    heads, kv_heads = query.shape[1], key.shape[1]
    if value.shape[1] != kv_heads or heads % kv_heads:
        raise ValueError(f"attn_implementation='{NAME}': query has {heads} heads, key "
                         f"{kv_heads} and value {value.shape[1]}; key and value need the same "
                         "number of heads, dividing the query's")
    need_weights = _weights_requested(output_attentions)
    q_length = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # transformers hands over no mask when a plain causal (or no) mask would do; a mask it gives
    # already holds causality. A single query (decoding) sees every cached key.
    causal = bool(is_causal) and attention_mask is None and q_length > 1

    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    if mask is not None and mask.dtype == torch.bool:
        mask = _as_eager_for_empty_rows(mask, query.dtype)
    # Grouped-query attention without repeat_kv: enable_gqa shares each key/value head with its
    # group of query heads by broadcasting.
    output, weights = functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=causal, scale=scaling,
        need_weights=need_weights, normalizer=normalizer, alpha=alpha,
        dropout_p=float(dropout or 0.0), enable_gqa=True)
    return output.transpose(1, 2).contiguous(), weights


def register(name: str = NAME, normalizer: str = "softmax", alpha: float | None = None) -> None:
    """Register ``name`` with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``
    (the masks are transformers' ``sdpa`` masks: boolean, or ``None`` when a causal flag
    suffices), so that ``attn_implementation=name`` runs through attnlab with ``normalizer``
    (and ``alpha`` for ``"entmax"``). Idempotent; importing this module already registers
    ``"attnlab"`` (softmax), ``"attnlab_sparsemax"`` and ``"attnlab_entmax15"``.

    Args:
        name: the ``attn_implementation`` name.
        normalizer: ``"softmax"``, ``"sparsemax"``, ``"entmax15"`` or ``"entmax"``.
        alpha: the α of ``"entmax"`` (a finite number > 1); only with ``"entmax"``.

    Raises:
        ValueError: an unknown normalizer, or alpha missing, misplaced or not > 1.
    """
    functional.check_normalizer(normalizer, alpha)
    if normalizer == "softmax":
        forward = attention_forward
    else:
        @functools.wraps(attention_forward)
        def forward(*args, **kwargs):
            return attention_forward(*args, normalizer=normalizer, alpha=alpha, **kwargs)
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    _registered.add(name)


def _refuse_longt5() -> None:
    """Make LongT5 refuse the names registered here when it runs.

    LongT5's encoder computes its local or transient-global attention in its own layers
    (``LongT5LocalAttention``, ``LongT5TransientGlobalAttention``: blocks of ``local_radius + 1``
    queries against three blocks of keys, plus the global tokens, with their relative position
    biases), never through the ``AttentionInterface``; its decoder's layers pass a relative
    position bias, which the attention function refuses. ``LongT5EncoderModel`` never calls the
    attention function at all: under ``attn_implementation="attnlab"`` it would run its own
    attention without a word. Its stacks (``LongT5Stack``, encoder and decoder) check the
    name when they run instead.
    """
    try:
        from transformers.models.longt5.modeling_longt5 import LongT5Stack
    except ImportError:  # pragma: no cover - a transformers without LongT5
        return
    forward = LongT5Stack.forward
    if getattr(forward, "_refuses_attnlab", False):
        return

    @functools.wraps(forward)
    def refusing_forward(self, *args, **kwargs):
        implementation = self.config._attn_implementation
        if implementation in _registered:
            raise ValueError(
                f"attn_implementation='{implementation}': LongT5 computes its encoder's local and "
                "transient-global attention in its own layers (LongT5LocalAttention, "
                "LongT5TransientGlobalAttention), not through transformers' AttentionInterface, "
                "so attnlab would not run it, and its decoder adds a relative position bias to "
                "the scores, which this backend does not support; use "
                "attn_implementation='eager' for this model")
        return forward(self, *args, **kwargs)

    refusing_forward._refuses_attnlab = True
    LongT5Stack.forward = refusing_forward


register()
_refuse_longt5()
for _name, (_normalizer, _alpha) in SPARSE_NAMES.items():
    register(_name, _normalizer, _alpha)
del _name, _normalizer, _alpha

__all__ = ["NAME", "SPARSE_NAMES", "attention_forward", "register"]
