#pragma once
// Public C++ API of the attention operators. Every function goes through the registered
// torch operator (torch::ops attnlab::*), so C++ callers get the same kernels, checks and
// autograd as Python callers.

#include <optional>
#include <tuple>

#include <ATen/Tensor.h>

namespace attnlab {

// softmax(query·keyᵀ·scale + mask)·value over the last two dimensions.
//   query [..., L_q, E], key [..., L_k, E], value [..., L_k, E_v]; leading dimensions broadcast.
//   attn_mask: bool (true = may attend) or floating point (added to the scores), broadcastable
//   to [..., L_q, L_k]. is_causal: query i sees keys j <= i (top-left aligned, as in PyTorch).
//   scale defaults to 1/sqrt(E). A query whose keys are all masked gets zeros and zero weights.
// Returns (output [..., L_q, E_v], weights [..., L_q, L_k]); weights is an empty tensor unless
// need_weights is true. Gradients flow to query, key and value.
std::tuple<at::Tensor, at::Tensor> scaled_dot_product_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask = std::nullopt, bool is_causal = false,
    std::optional<double> scale = std::nullopt, bool need_weights = false);

// Additive (Bahdanau) scores: scores[b, q, k] = Σ_j weight[j]·tanh(query_proj[b, q, j] +
// key_proj[b, k, j]) for query_proj [B, Q, h] (= W₁·queries) and key_proj [B, K, h]
// (= W₂·keys). Neither direction holds a [B, Q, K, h] tensor. Differentiable in all three.
at::Tensor additive_scores(const at::Tensor& query_proj, const at::Tensor& key_proj,
                           const at::Tensor& weight);

}  // namespace attnlab
