"""Transformer encoder blocks as the UvA tutorial defines them, post-norm by default."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import WeightSummary, has_attention_hooks, register_summary_hook
from .multihead import MultiheadAttention, _heads_mask, load_torch_multihead_attention


_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class EncoderBlock(nn.Module):
    """``x = norm1(x + dropout(self_attn(x)))``, ``x = norm2(x + dropout(linear_net(x)))`` with
    ``linear_net`` = Linear → Dropout → ReLU → Linear. With ``norm_first=True`` (pre-norm):
    ``x = x + dropout(self_attn(norm1(x)))``, ``x = x + dropout(linear_net(norm2(x)))``.

    On the CPU, whenever dropout is inactive (p = 0, or eval mode) and the normalizer is
    softmax, the whole block runs as one fused operator, ``torch.ops.attnlab.encoder_block``,
    forward and backward; otherwise it runs module by module. Inside ``attnlab.interpret.record()`` it always runs module by
    module, so that the recorder sees its attention call.

    Args:
        input_dim: width of the input and output.
        num_heads: attention heads; must divide ``input_dim``.
        dim_feedforward: hidden width of ``linear_net``.
        dropout: dropout probability, in [0, 1).
        norm_first: pre-norm instead of post-norm.
        normalizer: the attention's normalizer (``"softmax"``, ``"sparsemax"``, ``"entmax15"``
            or ``"entmax"`` with ``alpha``), as in
            :func:`attnlab.functional.scaled_dot_product_attention`. The fused operator is
            softmax-only: with any other normalizer the block always runs module by module.
        alpha: the α of ``normalizer="entmax"``; only with ``"entmax"``.
    """

    def __init__(self, input_dim: int, num_heads: int, dim_feedforward: int,
                 dropout: float = 0.0, norm_first: bool = False, normalizer: str = "softmax",
                 alpha: float | None = None):
        super().__init__()
        if dim_feedforward <= 0:
            raise ValueError(f"dim_feedforward must be positive, got {dim_feedforward}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.norm_first = norm_first
        self.self_attn = MultiheadAttention(input_dim, input_dim, num_heads,
                                            normalizer=normalizer, alpha=alpha)
        self.linear_net = nn.Sequential(
            nn.Linear(input_dim, dim_feedforward),
            nn.Dropout(dropout),
            nn.ReLU(inplace=True),
            nn.Linear(dim_feedforward, input_dim),
        )
        self.norm1 = nn.LayerNorm(input_dim)
        self.norm2 = nn.LayerNorm(input_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block applied to x ``[B, L, input_dim]``; mask as for
        :class:`MultiheadAttention`."""
        if self._fusable(x, mask):
            attn = self.self_attn
            return torch.ops.attnlab.encoder_block(
                x, *self._fused_parameters(), attn.num_heads,
                _heads_mask(mask, x.shape[0], x.shape[1]), self.norm_first,
                self._modules["norm1"].eps, self._modules["norm2"].eps)
        return self._module_by_module(x, mask, return_attention=False)[0]

    def _module_by_module(self, x: torch.Tensor, mask: torch.Tensor | None,
                          return_attention: bool):
        """(output, the attention's weights [B, H, L, L] or None): the block computed module by
        module, its attention returning its weights when asked."""
        attended = self.self_attn(self.norm1(x) if self.norm_first else x, mask=mask,
                                  return_attention=return_attention)
        attended, attention = attended if return_attention else (attended, None)
        if self.norm_first:
            x = x + self.dropout(attended)
            return x + self.dropout(self.linear_net(self.norm2(x))), attention
        x = self.norm1(x + self.dropout(attended))
        return self.norm2(x + self.dropout(self.linear_net(x))), attention

    # Both below run on every fused call, whose operator takes ~20 µs at small shapes:
    # nn.Module's attribute lookup (a Python __getattr__ per level) and Sequential's indexing
    # made them cost 11 and 27 µs on one AMD EPYC (Zen 5) core, so they read the modules' and
    # parameters' dicts directly: 1.4 and 1.6 µs, and the reversal-shape layer's forward+backward
    # 1.06-1.08x faster (in-process A/B, 20 rounds).

    def _fusable(self, x: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Whether the fused operator computes this forward: softmax attention, on the CPU in
        float32, float64, float16 or bfloat16 (the last two computed in float32 and rounded once
        at the end), with dropout inactive, no mask that wants a gradient, and no attention
        recorder active (the fused operator computes attention internally)."""
        modules = self._modules
        attn = modules["self_attn"]
        if (not x.is_cpu or x.dim() != 3 or x.dtype not in _FUSED_DTYPES
                or attn.normalizer != "softmax" or x.shape[-1] != attn.input_dim
                or x.dtype != attn._modules["qkv_proj"]._parameters["weight"].dtype
                or (mask is not None and mask.requires_grad) or has_attention_hooks()):
            return False
        if self.training:
            ff_dropout = next(m for m in modules["linear_net"] if isinstance(m, nn.Dropout))
            return modules["dropout"].p == 0 and ff_dropout.p == 0
        return True

    def _fused_parameters(self):
        """The fused operator's twelve parameters, in its order."""
        modules = self._modules
        attn = modules["self_attn"]._modules
        linears = [m for m in modules["linear_net"] if isinstance(m, nn.Linear)]
        return tuple(m._parameters[name]
                     for m in (attn["qkv_proj"], attn["o_proj"], modules["norm1"], linears[0],
                               linears[1], modules["norm2"])
                     for name in ("weight", "bias"))

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "EncoderBlock":
        """An EncoderBlock with the weights of a ``torch.nn.TransformerEncoderLayer``
        (batch_first=True, ReLU); it computes the same outputs (masks in attnlab's convention:
        True = may attend)."""
        if not layer.self_attn.batch_first:
            raise ValueError("only batch_first=True TransformerEncoderLayer can be loaded")
        if layer.activation_relu_or_gelu != 1:
            raise ValueError("only TransformerEncoderLayer with the ReLU activation can be loaded")
        attn = layer.self_attn
        block = cls(attn.embed_dim, attn.num_heads, layer.linear1.out_features,
                    dropout=layer.dropout.p, norm_first=layer.norm_first)
        load_torch_multihead_attention(block.self_attn, attn)
        with torch.no_grad():
            for ours, theirs in ((block.linear_net[0], layer.linear1),
                                 (block.linear_net[3], layer.linear2),
                                 (block.norm1, layer.norm1), (block.norm2, layer.norm2)):
                ours.weight.copy_(theirs.weight)
                ours.bias.copy_(theirs.bias)
            block.norm1.eps, block.norm2.eps = layer.norm1.eps, layer.norm2.eps
        return block


class TransformerEncoder(nn.Module):
    """``num_layers`` EncoderBlocks built from ``block_args`` (``input_dim``, ``num_heads``,
    ``dim_feedforward``, and optionally ``dropout``, ``norm_first``, ``normalizer``,
    ``alpha``: see :class:`EncoderBlock`; blocks with a normalizer other than softmax run module
    by module)."""

    def __init__(self, num_layers: int, **block_args):
        super().__init__()
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        self.layers = nn.ModuleList([EncoderBlock(**block_args) for _ in range(num_layers)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask=mask)
        return x

    def forward_with_attention(self, x: torch.Tensor, mask: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The output of :meth:`forward` and one attention map ``[B, H, L, L]`` per layer, from
        one pass (module by module)."""
        maps = []
        for layer in self.layers:
            x, attention = layer._module_by_module(x, mask, return_attention=True)
            maps.append(attention)
        return x, maps

    def forward_with_summaries(self, x: torch.Tensor, summary: WeightSummary,
                               mask: torch.Tensor | None = None):
        """The output of :meth:`forward` and one :class:`attnlab.AttentionSummary` per layer
        (``summary`` says which), from the fused kernel without any layer's ``L × L``
        weights."""
        summaries = []
        with register_summary_hook(summary, lambda call: summaries.append(call.summary)):
            out = self.forward(x, mask=mask)  # (module by module while a hook is registered)
        return out, summaries

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """One attention map [B, H, L, L] per layer, for the input x."""
        return self.forward_with_attention(x, mask=mask)[1]
