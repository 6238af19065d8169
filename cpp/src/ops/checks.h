#pragma once
// Argument checks, one place per operator. Every message names the operator, the argument,
// what was expected and what was given.

#include <optional>

#include <ATen/Tensor.h>

namespace attnlab::checks {

// Rank, dtype and device agreement only: safe on fake tensors with symbolic sizes.
void sdpa_kinds(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                const std::optional<at::Tensor>& attn_mask, std::optional<double> scale);

// Everything, including sizes; returns the broadcast batch shape of query, key and value.
std::vector<int64_t> sdpa_inputs(const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask,
                                 std::optional<double> scale);

// The backward's extra tensors against the forward's inputs.
void sdpa_backward_inputs(const at::Tensor& grad_output, const at::Tensor& output,
                          const at::Tensor& logsumexp, const std::optional<at::Tensor>& weights,
                          at::IntArrayRef batch_shape, int64_t len_q, int64_t len_k,
                          int64_t dim_v);

// attnlab.additive_scores: rank, dtype and device agreement only (safe on fake tensors).
void additive_scores_kinds(const at::Tensor& query_proj, const at::Tensor& key_proj,
                           const at::Tensor& weight);

// attnlab.additive_scores: query_proj [B, Q, h], key_proj [B, K, h], weight [h].
void additive_scores_inputs(const at::Tensor& query_proj, const at::Tensor& key_proj,
                            const at::Tensor& weight);

// attnlab.encoder_block: ranks, dtypes and devices only (safe on fake tensors).
void encoder_block_kinds(const at::Tensor& x, at::TensorList params,
                         const std::optional<at::Tensor>& attn_mask);

// attnlab.encoder_block: x [B, L, dim], the twelve parameters in EncoderBlock's order and
// shapes, a mask broadcastable to [B, heads, L, L], heads dividing dim, finite eps.
void encoder_block_inputs(const at::Tensor& x, at::TensorList params, int64_t num_heads,
                          const std::optional<at::Tensor>& attn_mask, double norm1_eps,
                          double norm2_eps);

}  // namespace attnlab::checks

namespace attnlab::checks {

// dropout_p in [0, 1).
void dropout(double dropout_p);
// The α of a sparse normalizer: a finite number > 1.
void sparse_alpha(double alpha);

// The sparse-normalizer backward's extra tensors (tau [..., L_q], support_value
// [..., L_q, E_v], the weights when given) against the forward's inputs.
void sparse_sdpa_backward_inputs(const at::Tensor& grad_output, const at::Tensor& output,
                                 const at::Tensor& tau, const at::Tensor& support_value,
                                 const std::optional<at::Tensor>& weights,
                                 at::IntArrayRef batch_shape, int64_t len_q, int64_t len_k,
                                 int64_t dim_v);

}  // namespace attnlab::checks
