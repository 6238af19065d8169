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


class PositionalEncoder(nn.Module):
    """The permutation lab's encoder: the sinusoidal table with ``scale`` in place of 10000,
    added to x [B, L, dim] (``add=True``) or concatenated to it (``add=False``, the output is
    ``extra_output_shape`` = dim wider)."""

    def __init__(self, dim: int, max_len: int = 50, scale: float = 10000.0, add: bool = True):
        super().__init__()
        if max_len <= 0 or scale <= 0:
            raise ValueError(f"max_len and scale must be positive, got {max_len}, {scale}")
        self.dim, self.max_len, self.scale, self.add = dim, max_len, scale, add
        self.extra_output_shape = 0 if add else dim
        self.register_buffer("pe", sinusoidal_table(max_len, dim, scale), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"PositionalEncoder expects x of shape [batch, length, features], "
                             f"got {list(x.shape)}")
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds max_len {self.max_len} of "
                             f"this PositionalEncoder")
        table = self.pe[: x.shape[1]].to(x.dtype)
        if self.add:
            if x.shape[-1] != self.dim:
                raise ValueError(f"add=True needs inputs {self.dim} wide (the encoding's dim), "
                                 f"got {x.shape[-1]}")
            return x + table
        return torch.cat([x, table.expand(x.shape[0], -1, -1)], dim=-1)


def sinusoidal_embedding(num_positions: int, dim: int) -> nn.Embedding:
    """A learnable position-embedding table initialised with the sinusoids (the NYU notebook's)."""
    embedding = nn.Embedding(num_positions, dim)
    with torch.no_grad():
        embedding.weight.copy_(sinusoidal_table(num_positions, dim))
    return embedding
