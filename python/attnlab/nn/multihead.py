"""Multi-head self-attention with one fused input projection, laid out as the UvA tutorial lays
it out, so that the tutorial's checkpoints load unchanged."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import (AttentionSummary, WeightSummary, check_normalizer,
                          scaled_dot_product_attention)


def _heads_mask(mask: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """The tutorial's mask shapes — [L, L], [B, L, L] or [B, H, L, L] — as a mask that
    broadcasts over [B, H, L, L]. The package's convention holds: boolean True = may attend,
    floating point = added to the scores."""
    if mask is None:
        return None
    if mask.dim() not in (2, 3, 4) or tuple(mask.shape[-2:]) != (length, length):
        raise ValueError(f"mask must have shape [L, L], [B, L, L] or [B, H, L, L] with L = "
                         f"{length}, got {list(mask.shape)}")
    if mask.dim() == 3:
        if mask.shape[0] not in (1, batch):
            raise ValueError(f"mask has batch size {mask.shape[0]} but the input has {batch}")
        mask = mask.unsqueeze(1)
    return mask


class MultiheadAttention(nn.Module):
    """Self-attention: ``qkv_proj`` (input_dim → 3·embed_dim, reshaped to [B, L, H, 3·head_dim]
    and split into q, k, v per head), attention per head, ``o_proj`` (embed_dim → embed_dim).
    Xavier-uniform weights, zero biases.

    Args:
        input_dim: width of the input x.
        embed_dim: width of q, k, v over all heads, and of the output.
        num_heads: number of heads; must divide ``embed_dim``.
        normalizer: how scores become weights, as in
            :func:`attnlab.functional.scaled_dot_product_attention`: ``"softmax"`` (default),
            ``"sparsemax"``, ``"entmax15"`` or ``"entmax"`` (with ``alpha``). The sparse ones
            give keys exactly zero weight.
        alpha: the α of ``normalizer="entmax"`` (a finite number > 1); only with ``"entmax"``.
        dropout: dropout on the attention weights in training mode, in ``[0, 1)`` (as
            ``torch.nn.MultiheadAttention``'s ``dropout``), inside the fused kernel; the weights
            ``return_attention`` gives are then the ones used, after dropout.
    """

    def __init__(self, input_dim: int, embed_dim: int, num_heads: int,
                 normalizer: str = "softmax", alpha: float | None = None,
                 dropout: float = 0.0):
        super().__init__()
        check_normalizer(normalizer, alpha)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        for name, value in (("input_dim", input_dim), ("embed_dim", embed_dim),
                            ("num_heads", num_heads)):
            if not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        self.input_dim = input_dim
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.normalizer = normalizer
        self.alpha = alpha
        self.dropout = float(dropout)
        self.qkv_proj = nn.Linear(input_dim, 3 * embed_dim)
        self.o_proj = nn.Linear(embed_dim, embed_dim)
        self._reset_parameters()

    def _reset_parameters(self):
        for linear in (self.qkv_proj, self.o_proj):
            nn.init.xavier_uniform_(linear.weight)
            linear.bias.data.fill_(0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_attention: bool = False, summary: WeightSummary | None = None
                ) -> (torch.Tensor | tuple[torch.Tensor, torch.Tensor]
                      | tuple[torch.Tensor, AttentionSummary]):
        """Self-attention over x ``[batch, length, input_dim]``.

        Args:
            x: the input ``[B, L, input_dim]``.
            mask: ``[L, L]``, ``[B, L, L]`` or ``[B, H, L, L]``; boolean (``True`` = may attend)
                or floating point (added to the scores).
            return_attention: also return the weights ``[B, H, L, L]``.
            summary: an :class:`attnlab.WeightSummary`: also return the summaries of the
                weights, from the fused kernel without the weights (CPU; not with
                ``return_attention``).

        Returns:
            The output ``[B, L, embed_dim]``, or the pair (output, weights) with
            ``return_attention``, or (output, :class:`attnlab.AttentionSummary`) with
            ``summary``.
        """
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(f"MultiheadAttention expects x of shape [batch, length, "
                             f"{self.input_dim}], got {list(x.shape)}")
        batch, length, _ = x.shape
        # The tutorial's layout [B, L, H, 3·head_dim] split into q, k, v, written as a reshape
        # to [B, L, H, 3, head_dim] and unbind: the backward then stacks three contiguous
        # blocks, where chunk's backward (cat along the last dimension) copies 128-byte rows.
        qkv = self.qkv_proj(x).reshape(batch, length, self.num_heads, 3, self.head_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each [B, H, L, head_dim]
        if summary is not None and return_attention:
            raise ValueError("summary= replaces the weights: pass return_attention=False with it")
        values, attention = scaled_dot_product_attention(
            q, k, v, attn_mask=_heads_mask(mask, batch, length), need_weights=return_attention,
            normalizer=self.normalizer, alpha=self.alpha,
            dropout_p=self.dropout if self.training else 0.0, summary=summary)
        values = values.permute(0, 2, 1, 3).reshape(batch, length, self.embed_dim)
        out = self.o_proj(values)
        return (out, attention) if return_attention or summary is not None else out


@torch.no_grad()
def load_torch_multihead_attention(target: MultiheadAttention,
                                   source: nn.MultiheadAttention) -> MultiheadAttention:
    """Copies the weights of a ``torch.nn.MultiheadAttention`` (packed in-projection, with
    biases, no bias_k/bias_v) into ``target``, which then computes the same outputs for the
    same inputs. torch stacks [W_q; W_k; W_v]; attnlab interleaves them per head. Masks keep
    attnlab's convention (True = may attend), the opposite of torch's boolean attn_mask."""
    embed_dim, heads = source.embed_dim, source.num_heads
    if source.in_proj_weight is None or source.in_proj_bias is None or source.bias_k is not None:
        raise ValueError("only torch.nn.MultiheadAttention with a packed, biased in-projection "
                         "and no bias_k/bias_v can be loaded")
    if (target.embed_dim, target.num_heads, target.input_dim) != (embed_dim, heads, embed_dim):
        raise ValueError(f"target has embed_dim {target.embed_dim}, num_heads "
                         f"{target.num_heads}, input_dim {target.input_dim}; the source needs "
                         f"{embed_dim}, {heads}, {embed_dim}")
    head_dim = embed_dim // heads

    def interleave(t):  # [3·E, ...] as [q; k; v] → per head [q_h; k_h; v_h]
        parts = t.reshape(3, heads, head_dim, *t.shape[1:])
        return parts.transpose(0, 1).reshape(3 * embed_dim, *t.shape[1:])

    target.qkv_proj.weight.copy_(interleave(source.in_proj_weight))
    target.qkv_proj.bias.copy_(interleave(source.in_proj_bias))
    target.o_proj.weight.copy_(source.out_proj.weight)
    target.o_proj.bias.copy_(source.out_proj.bias)
    return target
