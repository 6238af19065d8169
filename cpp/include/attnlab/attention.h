#pragma once
// Public C++ API of the attention operators. Every function goes through the registered
// torch operator (torch::ops attnlab::*), so C++ callers get the same kernels, checks and
// autograd as Python callers.

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/Tensor.h>

namespace attnlab {

// normalize(query·keyᵀ·scale + mask)·value over the last two dimensions.
//   query [..., L_q, E], key [..., L_k, E], value [..., L_k, E_v]; leading dimensions broadcast.
//   attn_mask: bool (true = may attend) or floating point (added to the scores), broadcastable
//   to [..., L_q, L_k]. is_causal: query i sees keys j <= i (top-left aligned, as in PyTorch).
//   scale defaults to 1/sqrt(E). A query whose keys are all masked gets zeros and zero weights.
//   normalizer: "softmax" (default), "sparsemax" (α = 2), "entmax15" (α = 1.5) or "entmax" with
//   alpha > 1 (α-entmax): p = [(α − 1)·z − τ]_+^{1/(α − 1)} per query row, τ such that the row
//   sums to 1, so keys below the threshold get exactly zero weight. alpha only with "entmax".
//   dropout_p: dropout on the weights inside the kernel (CPU), each kept weight scaled by
//   1/(1 − dropout_p), its mask drawn from torch's default generator; the returned weights are
//   the ones used, after dropout.
// Returns (output [..., L_q, E_v], weights [..., L_q, L_k]); weights is an empty tensor unless
// need_weights is true. Gradients flow to query, key, value and a floating-point mask.
std::tuple<at::Tensor, at::Tensor> scaled_dot_product_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask = std::nullopt, bool is_causal = false,
    std::optional<double> scale = std::nullopt, bool need_weights = false,
    std::string_view normalizer = "softmax", std::optional<double> alpha = std::nullopt,
    double dropout_p = 0.0);

// Additive (Bahdanau) scores: scores[b, q, k] = Σ_j weight[j]·tanh(query_proj[b, q, j] +
// key_proj[b, k, j]) for query_proj [B, Q, h] (= W₁·queries) and key_proj [B, K, h]
// (= W₂·keys). Neither direction holds a [B, Q, K, h] tensor. Differentiable in all three.
at::Tensor additive_scores(const at::Tensor& query_proj, const at::Tensor& key_proj,
                           const at::Tensor& weight);

// The parameters of one encoder block, named and shaped as in attnlab.nn.EncoderBlock:
// qkv [3·dim, dim] (per head [q_h; k_h; v_h]) and [3·dim], out [dim, dim] and [dim],
// norm1/norm2 [dim], ff1 [dim_ff, dim] and [dim_ff], ff2 [dim, dim_ff] and [dim].
struct EncoderBlockWeights {
  at::Tensor qkv_weight, qkv_bias, out_weight, out_bias, norm1_weight, norm1_bias;
  at::Tensor ff1_weight, ff1_bias, ff2_weight, ff2_bias, norm2_weight, norm2_bias;
};

// One transformer encoder block without dropout, fused into one operator (CPU; float32 or
// float64, and float16 or bfloat16 computed in float32). x [B, L, dim]. Post-norm: h = LN1(x + attn(x)), y = LN2(h + ff(h)); pre-norm
// (norm_first): h = x + attn(LN1(x)), y = h + ff(LN2(h)); ff = Linear, ReLU, Linear. attn_mask
// as for scaled_dot_product_attention, broadcastable to [B, heads, L, L] (no gradient).
// Differentiable in x and every weight.
at::Tensor encoder_block(const at::Tensor& x, const EncoderBlockWeights& weights,
                         int64_t num_heads,
                         const std::optional<at::Tensor>& attn_mask = std::nullopt,
                         bool norm_first = false, double norm1_eps = 1e-5,
                         double norm2_eps = 1e-5);

}  // namespace attnlab
