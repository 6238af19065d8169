"""Multi-head attention in the style of the NYU self-attention notebook: separate query,
key and value projections without bias, queries, keys and values of different widths."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import scaled_dot_product_attention


class MultiHeadAttention(nn.Module):
    """``forward(X_q, X_k, X_v) -> (H, A)``: ``W_q``, ``W_k``, ``W_v`` (no bias) project the
    inputs to d_model, heads attend separately, ``W_h`` (with bias) mixes the concatenated
    heads. ``A`` is [B, num_heads, L_q, L_k].

    ``d_input`` is None (all inputs d_model wide), one width for all three, or a tuple
    (d_xq, d_xk, d_xv). ``p`` is the dropout probability the tutorial passes; as in the
    tutorial, this layer itself applies no dropout (the encoder layer around it does)."""

    def __init__(self, d_model: int, num_heads: int, p: float = 0.0,
                 d_input: int | tuple[int, int, int] | None = None):
        super().__init__()
        if d_model <= 0 or num_heads <= 0:
            raise ValueError(f"d_model and num_heads must be positive, got {d_model}, {num_heads}")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        if not 0 <= p < 1:
            raise ValueError(f"p is a dropout probability and must be in [0, 1), got {p}")
        if d_input is None:
            d_input = (d_model,) * 3
        elif isinstance(d_input, int):
            d_input = (d_input,) * 3
        if len(d_input) != 3 or any(d <= 0 for d in d_input):
            raise ValueError(f"d_input must be a positive width or three of them, got {d_input}")
        self.d_model, self.num_heads, self.p = d_model, num_heads, p
        self.d_k = d_model // num_heads
        self.d_input = tuple(d_input)
        self.W_q = nn.Linear(d_input[0], d_model, bias=False)
        self.W_k = nn.Linear(d_input[1], d_model, bias=False)
        self.W_v = nn.Linear(d_input[2], d_model, bias=False)
        self.W_h = nn.Linear(d_model, d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, d_model] → [B, num_heads, L, d_k]"""
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.d_k).transpose(1, 2)

    def group_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, num_heads, L, d_k] → [B, L, d_model]"""
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.d_model)

    def forward(self, X_q: torch.Tensor, X_k: torch.Tensor, X_v: torch.Tensor,
                mask: torch.Tensor | None = None):
        for name, x, width in (("X_q", X_q, self.d_input[0]), ("X_k", X_k, self.d_input[1]),
                               ("X_v", X_v, self.d_input[2])):
            if x.dim() != 3 or x.shape[-1] != width:
                raise ValueError(f"{name} must have shape [batch, length, {width}], got "
                                 f"{list(x.shape)}")
        Q = self.split_heads(self.W_q(X_q))
        K = self.split_heads(self.W_k(X_k))
        V = self.split_heads(self.W_v(X_v))
        H_cat, A = scaled_dot_product_attention(Q, K, V, attn_mask=mask, need_weights=True)
        return self.W_h(self.group_heads(H_cat)), A
