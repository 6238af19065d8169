"""torch.nn modules over the attnlab operators, with the tutorials' names and signatures."""

from .attention_layers import (AdditiveAttention, AttentionLayer, MultiplicativeAttention,
                               ScaledDotProductAttention, autoregressive_mask)
from .cross import MultiHeadAttention
from .encoder import EncoderBlock, TransformerEncoder
from .multihead import MultiheadAttention, load_torch_multihead_attention
from .positional import (PositionalEncoder, PositionalEncoding, sinusoidal_embedding,
                         sinusoidal_table)
from .schedule import CosineWarmupScheduler
from .serialization import save_for_cpp

__all__ = [
    "AdditiveAttention",
    "AttentionLayer",
    "MultiplicativeAttention",
    "ScaledDotProductAttention",
    "autoregressive_mask",
    "CosineWarmupScheduler",
    "EncoderBlock",
    "MultiHeadAttention",
    "MultiheadAttention",
    "PositionalEncoder",
    "PositionalEncoding",
    "TransformerEncoder",
    "load_torch_multihead_attention",
    "save_for_cpp",
    "sinusoidal_embedding",
    "sinusoidal_table",
]

