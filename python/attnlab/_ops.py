"""Fake (meta) implementations of the C++ operators, for torch.compile, torch.export and
FakeTensor tracing. Output shapes and strides match the C++ kernels: contiguous outputs at
the broadcast batch shape."""

import torch


def _batch_shape(query, key, value):
    return torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])


@torch.library.register_fake("attnlab::_sdpa_forward")
def _sdpa_forward_fake(query, key, value, attn_mask, is_causal, scale, need_weights,
                       dropout_p=0.0, dropout_seed=0, weights_before_dropout=False):
    batch = _batch_shape(query, key, value)
    len_q, len_k, dim_v = query.shape[-2], key.shape[-2], value.shape[-1]
    output = query.new_empty((*batch, len_q, dim_v))
    # The CUDA kernels keep the log-sum-exp in float32 for half-precision inputs.
    lse_dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    logsumexp = query.new_empty((*batch, len_q), dtype=lse_dtype)
    weights = query.new_empty((*batch, len_q, len_k) if need_weights else (0,))
    return output, logsumexp, weights


@torch.library.register_fake("attnlab::_sdpa_backward")
def _sdpa_backward_fake(grad_output, query, key, value, attn_mask, is_causal, scale, output,
                        logsumexp, weights=None, grad_mask=False, grad_weights=False,
                        grad_attn_weights=None, dropout_p=0.0, dropout_seed=0,
                        weights_before_dropout=False):
    grad_attn_mask = (attn_mask.new_empty(attn_mask.shape) if grad_mask and attn_mask is not None
                      else query.new_empty((0,)))
    # dP = grad_output @ value^T at the output's batch shape, in the inputs' dtype.
    grad_w = (query.new_empty((*_batch_shape(query, key, value), query.shape[-2], key.shape[-2]))
              if grad_weights else query.new_empty((0,)))
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            grad_attn_mask, grad_w)


@torch.library.register_fake("attnlab::_sparse_sdpa_forward")
def _sparse_sdpa_forward_fake(query, key, value, attn_mask, is_causal, scale, need_weights,
                              alpha, dropout_p=0.0, dropout_seed=0):
    batch = _batch_shape(query, key, value)
    len_q, len_k, dim_v = query.shape[-2], key.shape[-2], value.shape[-1]
    output = query.new_empty((*batch, len_q, dim_v))
    # tau and support_value, like the log-sum-exp, are float32 for half-precision inputs.
    tau_dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    tau = query.new_empty((*batch, len_q), dtype=tau_dtype)
    support_value = query.new_empty((*batch, len_q, dim_v), dtype=tau_dtype)
    weights = query.new_empty((*batch, len_q, len_k) if need_weights else (0,))
    return output, tau, support_value, weights


@torch.library.register_fake("attnlab::_sparse_sdpa_backward")
def _sparse_sdpa_backward_fake(grad_output, query, key, value, attn_mask, is_causal, scale,
                               output, tau, support_value, alpha, weights=None,
                               grad_mask=False, grad_attn_weights=None, dropout_p=0.0,
                               dropout_seed=0):
    grad_attn_mask = (attn_mask.new_empty(attn_mask.shape) if grad_mask and attn_mask is not None
                      else query.new_empty((0,)))
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            grad_attn_mask)


@torch.library.register_fake("attnlab::_sdpa_summaries")
def _sdpa_summaries_fake(query, key, value, attn_mask, is_causal, scale, normalizer, alpha,
                         received, entropy, topk, pool, to):
    batch = _batch_shape(query, key, value)
    len_q, len_k, dim_v = query.shape[-2], key.shape[-2], value.shape[-1]
    wide = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    empty = lambda *shape, dtype=wide: query.new_empty(shape, dtype=dtype)  # noqa: E731
    blocks = lambda n: (n + pool - 1) // pool if pool else 0  # noqa: E731
    return (query.new_empty((*batch, len_q, dim_v)),
            empty(*batch, len_k) if received else empty(0),
            empty(*batch, len_q) if entropy else empty(0),
            empty(*batch, len_q, topk) if topk else empty(0),
            empty(*batch, len_q, topk, dtype=torch.long) if topk else empty(0, dtype=torch.long),
            empty(*batch, blocks(len_q), blocks(len_k)) if pool else empty(0),
            empty(*batch, len_q, len(to)) if to else empty(0))


@torch.library.register_fake("attnlab::_dropout_mask")
def _dropout_mask_fake(like, dropout_p, dropout_seed):
    return like.new_empty(like.shape)


@torch.library.register_fake("attnlab::_additive_scores_forward")
def _additive_scores_forward_fake(query_proj, key_proj, weight):
    return query_proj.new_empty((query_proj.shape[0], query_proj.shape[1], key_proj.shape[1]))


@torch.library.register_fake("attnlab::_additive_scores_backward")
def _additive_scores_backward_fake(grad_scores, query_proj, key_proj, weight):
    return (query_proj.new_empty(query_proj.shape), key_proj.new_empty(key_proj.shape),
            weight.new_empty(weight.shape))


def _encoder_block_activations(x, params, num_heads):
    """Elements the forward keeps for the backward (cpu/encoder/encoder_block_kernel.h)."""
    batch, length, dim = x.shape
    dim_ff = params[6].shape[0]
    tokens = batch * length
    return tokens * (8 * dim + dim_ff + 2) + batch * num_heads * length


@torch.library.register_fake("attnlab::_encoder_block_forward")
def _encoder_block_forward_fake(x, params, num_heads, attn_mask, norm_first, norm1_eps,
                                norm2_eps):
    activations = x.new_empty((_encoder_block_activations(x, params, num_heads),))
    return x.new_empty(x.shape), activations


@torch.library.register_fake("attnlab::_encoder_block_backward")
def _encoder_block_backward_fake(grad_output, x, params, num_heads, attn_mask, norm_first,
                                 activations, input_grad):
    grad_x = x.new_empty(x.shape) if input_grad else x.new_empty((0,))
    return [grad_x] + [p.new_empty(p.shape) for p in params]
