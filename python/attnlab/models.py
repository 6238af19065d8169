"""The per-token predictor of the UvA tutorial ("TransformerPredictor")."""

from __future__ import annotations

import torch
from torch import nn

from .nn import PositionalEncoding, TransformerEncoder


class TransformerPredictor(nn.Module):
    """input net Dropout → Linear(input_dim, model_dim); optional positional encoding; encoder
    with d_ff = 2·model_dim; output net Linear → LayerNorm → ReLU → Dropout → Linear(num_classes).
    Inputs [B, L, input_dim] → logits [B, L, num_classes]. ``normalizer`` (and ``alpha``) choose
    how the encoder's attention normalizes its scores, as in
    :func:`attnlab.scaled_dot_product_attention`: ``"softmax"`` (default), ``"sparsemax"``,
    ``"entmax15"`` or ``"entmax"`` with ``alpha``."""

    def __init__(self, input_dim: int, model_dim: int, num_classes: int, num_heads: int,
                 num_layers: int, dropout: float = 0.0, input_dropout: float = 0.0,
                 positional_encoding: bool = True, normalizer: str = "softmax",
                 alpha: float | None = None):
        super().__init__()
        self.input_net = nn.Sequential(nn.Dropout(input_dropout), nn.Linear(input_dim, model_dim))
        self.positional_encoding = PositionalEncoding(model_dim) if positional_encoding else None
        self.transformer = TransformerEncoder(num_layers=num_layers, input_dim=model_dim,
                                              num_heads=num_heads,
                                              dim_feedforward=2 * model_dim, dropout=dropout,
                                              normalizer=normalizer, alpha=alpha)
        self.output_net = nn.Sequential(
            nn.Linear(model_dim, model_dim), nn.LayerNorm(model_dim), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(model_dim, num_classes))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_net(x)
        return self.positional_encoding(x) if self.positional_encoding is not None else x

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.output_net(self.transformer(self.embed(x), mask=mask))

    def forward_with_attention(self, x: torch.Tensor, mask: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The logits of :meth:`forward` and one [B, H, L, L] map per layer, from one pass."""
        x, maps = self.transformer.forward_with_attention(self.embed(x), mask=mask)
        return self.output_net(x), maps

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """One [B, H, L, L] map per layer."""
        return self.transformer.get_attention_maps(self.embed(x), mask=mask)
