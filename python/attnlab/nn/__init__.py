"""torch.nn modules over the attnlab operators, with the tutorials' names and signatures."""

from .cross import MultiHeadAttention
from .encoder import EncoderBlock, TransformerEncoder
from .multihead import MultiheadAttention, load_torch_multihead_attention
from .positional import (PositionalEncoder, PositionalEncoding, sinusoidal_embedding,
                         sinusoidal_table)
from .schedule import CosineWarmupScheduler

__all__ = [
    "CosineWarmupScheduler",
    "EncoderBlock",
    "MultiHeadAttention",
    "MultiheadAttention",
    "PositionalEncoder",
    "PositionalEncoding",
    "TransformerEncoder",
    "load_torch_multihead_attention",
    "sinusoidal_embedding",
    "sinusoidal_table",
]
