"""Attention layers behind one interface (the permutation-composition lab's): ``get_scores(features, queries)`` and
``attend(features, queries, mask=None)``, where the features are both keys and values, and the
detached weights of the last ``attend`` kept as ``last_weights``. Every kind takes
``normalizer=`` (and ``alpha=``) as :func:`attnlab.scaled_dot_product_attention` does: softmax
by default, or sparsemax / entmax, whose maps hold exact zeros."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..functional import check_normalizer, scaled_dot_product_attention


def autoregressive_mask(size: int, device=None) -> torch.Tensor:
    """[size, size] boolean mask: query i may attend to objects j <= i."""
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def _check_pair(features: torch.Tensor, queries: torch.Tensor):
    if features.dim() != 3 or queries.dim() != 3:
        raise ValueError(f"features and queries must be [batch, objects, features] and "
                         f"[batch, queries, features], got {list(features.shape)} and "
                         f"{list(queries.shape)}")
    if features.shape[0] != queries.shape[0]:
        raise ValueError(f"features have batch size {features.shape[0]} but queries have "
                         f"{queries.shape[0]}")


class AttentionLayer(nn.Module):
    """The shared interface. Subclasses define ``get_scores`` and ``_attend``.

    Args:
        normalizer: how the scores become weights: ``"softmax"`` (default), ``"sparsemax"``,
            ``"entmax15"`` or ``"entmax"`` (with ``alpha``), as in
            :func:`attnlab.scaled_dot_product_attention`; checked when the layer is built.
        alpha: the α of ``normalizer="entmax"``; only with ``"entmax"``.
    """

    def __init__(self, normalizer: str = "softmax", alpha: float | None = None):
        super().__init__()
        check_normalizer(normalizer, alpha)
        self.normalizer, self.alpha = normalizer, alpha
        self.last_weights: torch.Tensor | None = None

    @staticmethod
    def get_autoregressive_mask(size: int, device=None) -> torch.Tensor:
        return autoregressive_mask(size, device)

    def attend(self, features: torch.Tensor, queries: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, Q, F]: each query's weighted mean of the features. ``mask`` (True = may attend)
        broadcasts to [B, Q, K]; a query with every object masked gets zeros."""
        _check_pair(features, queries)
        output, weights = self._attend(features, queries, mask)
        self.last_weights = weights.detach()
        return output

    def forward(self, features, queries, mask=None):
        return self.attend(features, queries, mask)


class ScaledDotProductAttention(AttentionLayer):
    """scores = qᵀk / sqrt(d); queries and features of the same width; ``normalizer`` and
    ``alpha`` as for :class:`AttentionLayer`."""

    scale: float | None = None  # None: 1/sqrt(d)

    @staticmethod
    def _check_widths(features: torch.Tensor, queries: torch.Tensor):
        _check_pair(features, queries)
        if features.shape[-1] != queries.shape[-1]:
            raise ValueError(f"queries have {queries.shape[-1]} features but the objects have "
                             f"{features.shape[-1]}; dot-product attention needs equal widths")

    def get_scores(self, features: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        self._check_widths(features, queries)
        scale = 1 / math.sqrt(queries.shape[-1]) if self.scale is None else self.scale
        return queries @ features.transpose(-2, -1) * scale

    def _attend(self, features, queries, mask):
        self._check_widths(features, queries)
        return scaled_dot_product_attention(queries, features, features, attn_mask=mask,
                                            scale=self.scale, need_weights=True,
                                            normalizer=self.normalizer, alpha=self.alpha)


class MultiplicativeAttention(ScaledDotProductAttention):
    """Luong's scores qᵀk, unscaled."""

    scale = 1.0


class AdditiveAttention(AttentionLayer):
    """Bahdanau's scores w₃ᵀ tanh(W₁q + W₂k) (no biases); queries and objects may have
    different widths. The scores come from the attnlab.additive_scores operator, which never
    holds the [B, Q, K, hidden] tensor; ``normalizer`` and ``alpha`` as for
    :class:`AttentionLayer`."""

    def __init__(self, obj_feature_dim: int, query_feature_dim: int, hidden_dim: int,
                 normalizer: str = "softmax", alpha: float | None = None):
        super().__init__(normalizer, alpha)
        for name, value in (("obj_feature_dim", obj_feature_dim),
                            ("query_feature_dim", query_feature_dim),
                            ("hidden_dim", hidden_dim)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.W1 = nn.Linear(query_feature_dim, hidden_dim, bias=False)
        self.W2 = nn.Linear(obj_feature_dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(hidden_dim, 1, bias=False)

    def get_scores(self, features: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        _check_pair(features, queries)
        return torch.ops.attnlab.additive_scores(self.W1(queries), self.W2(features),
                                                 self.w3.weight[0])

    def _attend(self, features, queries, mask):
        scores = self.get_scores(features, queries)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise ValueError(f"mask must be boolean (True = may attend), got {mask.dtype}")
            scores = scores.masked_fill(~mask, float("-inf"))
        # The scores enter the attention operator as an additive mask over zero dot products:
        # normalize(0 + scores)·features, with the operator's normalizers, masking rules and
        # gradient for the mask.
        zeros_q = queries.new_zeros(queries.shape[0], queries.shape[1], 1)
        zeros_k = features.new_zeros(features.shape[0], features.shape[1], 1)
        return scaled_dot_product_attention(zeros_q, zeros_k, features, attn_mask=scores,
                                            need_weights=True, normalizer=self.normalizer,
                                            alpha=self.alpha)
