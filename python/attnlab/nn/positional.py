"""Sinusoidal positional encodings."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(length: int, dim: int, scale: float = 10000.0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / scale^(2i/dim)), PE[pos, 2i+1] = cos(pos / scale^(2i/dim)),
    shape [length, dim]; an odd dim is computed for dim + 1 and cropped."""
    if length < 0 or dim <= 0:
        raise ValueError(f"need length >= 0 and dim > 0, got length {length}, dim {dim}")
    even = dim + dim % 2
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, even, 2, dtype=torch.float64) * (-math.log(scale) / even))
    table = torch.zeros(length, even, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table[:, :dim].float()


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table to x [B, L, d_model]; precomputed up to ``max_len``."""

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.d_model = d_model
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_table(max_len, d_model).unsqueeze(0),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"PositionalEncoding expects x of shape [batch, length, "
                             f"{self.d_model}], got {list(x.shape)}")
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds max_len {self.max_len} of "
                             f"this PositionalEncoding")
        return x + self.pe[:, : x.shape[1]]
