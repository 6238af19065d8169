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
