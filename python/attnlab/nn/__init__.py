"""torch.nn modules over the attnlab operators, with the tutorials' names and signatures."""

from .encoder import EncoderBlock, TransformerEncoder
from .multihead import MultiheadAttention, load_torch_multihead_attention
from .positional import PositionalEncoding, sinusoidal_table
from .schedule import CosineWarmupScheduler

__all__ = [
    "CosineWarmupScheduler",
    "EncoderBlock",
    "MultiheadAttention",
    "PositionalEncoding",
    "TransformerEncoder",
    "load_torch_multihead_attention",
    "sinusoidal_table",
]
