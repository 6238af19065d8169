"""Float64 references built from plain torch ops: the ground truth the tests compare against."""

import math

import torch


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """softmax(q kᵀ·scale + mask) v in float64; a query whose keys are all masked gets zeros.

    Returns (output, weights)."""
    q, k, v = query.double(), key.double(), value.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.double()
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    blocked = (scores == float("-inf")).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=-1).masked_fill(blocked, 0.0)
    return weights @ v, weights


def tutorial_mha(module, x, mask=None):
    """The tutorial's multi-head attention, from an attnlab.nn.MultiheadAttention's weights, in
    plain torch ops. mask: [L, L], [B, L, L] or [B, H, L, L], boolean (True = may attend) or
    floating point (added to the scores). Returns (output, attention)."""
    B, L, _ = x.shape
    H, hd = module.num_heads, module.head_dim
    qkv = x @ module.qkv_proj.weight.T + module.qkv_proj.bias
    qkv = qkv.reshape(B, L, H, 3 * hd).permute(0, 2, 1, 3)
    q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
    logits = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if mask is not None:
        mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask
    attention = torch.softmax(logits, dim=-1)
    values = (attention @ v).permute(0, 2, 1, 3).reshape(B, L, H * hd)
    return values @ module.o_proj.weight.T + module.o_proj.bias, attention


def tutorial_block(block, x, mask=None):
    """An attnlab.nn.EncoderBlock (no dropout) from its weights in plain torch ops: post-norm
    as the tutorial writes it, or pre-norm when block.norm_first."""
    def layer_norm(norm, t):
        mean = t.mean(-1, keepdim=True)
        var = ((t - mean) ** 2).mean(-1, keepdim=True)
        return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    def ffn(t):
        first, second = block.linear_net[0], block.linear_net[3]
        return torch.relu(t @ first.weight.T + first.bias) @ second.weight.T + second.bias

    if block.norm_first:
        h = x + tutorial_mha(block.self_attn, layer_norm(block.norm1, x), mask)[0]
        return h + ffn(layer_norm(block.norm2, h))
    h = layer_norm(block.norm1, x + tutorial_mha(block.self_attn, x, mask)[0])
    return layer_norm(block.norm2, h + ffn(h))
