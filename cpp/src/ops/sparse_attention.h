#pragma once
// The sparse normalizers of attnlab::scaled_dot_product_attention (sparsemax, entmax-1.5,
// α-entmax): the composite operator (ops/attention.cpp) routes every normalizer but softmax
// here.

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/Tensor.h>

namespace attnlab {

// The α of `normalizer` (2 for "sparsemax", 1.5 for "entmax15", `alpha` for "entmax"), or
// nullopt for "softmax". Raises, naming the argument, for an unknown normalizer, alpha given
// with a normalizer other than "entmax", "entmax" without alpha, or alpha <= 1, NaN or inf.
std::optional<double> normalizer_alpha(std::string_view normalizer,
                                       std::optional<double> alpha);

// (output, weights) through the differentiable sparse-normalizer attention with α = alpha;
// weights is an empty tensor unless need_weights.
std::tuple<at::Tensor, at::Tensor> sparse_scaled_dot_product_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, double alpha);

}  // namespace attnlab
