// Sparse normalizers for attnlab::scaled_dot_product_attention: the operators
// _sparse_sdpa_forward and _sparse_sdpa_backward (schemas, CPU entry points) and the autograd
// formula the composite operator uses for normalizer = "sparsemax", "entmax15" and "entmax".

#include "ops/sparse_attention.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "cpu/sparse_attention_kernel.h"
#include "ops/checks.h"
#include "ops/layout.h"

namespace attnlab {
namespace {

using at::Tensor;

constexpr const char* kSdpa = "attnlab.scaled_dot_product_attention";

// The CPU kernels' dtypes (float32, float64), named in the error.
void cpu_dtype(const Tensor& query) {
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kDouble, kSdpa,
              ": the sparse normalizers (sparsemax, entmax15, entmax) run in float32 or float64 "
              "on the CPU, got ", query.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_forward_cpu(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, double alpha) {
  auto batch = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  checks::sparse_alpha(alpha);
  if (at::isReducedFloatingType(query.scalar_type())) {
    // float16 and bfloat16 run through the float32 kernel (tau and support_value stay float32,
    // as on CUDA); only the output and the weights are rounded.
    auto [output, tau, support_value, weights] =
        sparse_forward_cpu(query.to(at::kFloat), key.to(at::kFloat), value.to(at::kFloat),
                           attn_mask, is_causal, scale, need_weights, alpha);
    return {output.to(query.scalar_type()), tau, support_value,
            weights.to(query.scalar_type())};
  }
  cpu_dtype(query);
  const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
  const auto options = query.options();
  Tensor output = at::empty(with_tail(batch, {len_q, dim_v}), options);
  Tensor tau = at::empty(with_tail(batch, {len_q}), options);
  Tensor support_value = at::empty(with_tail(batch, {len_q, dim_v}), options);
  Tensor weights = need_weights ? empty_weights(with_tail(batch, {len_q, len_k}), options)
                                : at::empty({0}, options);
  AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "attnlab_sparse_sdpa_forward", [&] {
    PreparedProblem<scalar_t> prepared(query, key, value, attn_mask, is_causal, scale, batch);
    cpu::sparse_attention_forward<scalar_t>(
        prepared.problem, alpha, output.data_ptr<scalar_t>(), tau.data_ptr<scalar_t>(),
        support_value.data_ptr<scalar_t>(),
        need_weights ? weights.data_ptr<scalar_t>() : nullptr);
  });
  return {output, tau, support_value, weights};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_backward_cpu(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& tau, const Tensor& support_value, double alpha,
    const std::optional<Tensor>& weights, bool grad_mask) {
  auto batch = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  checks::sparse_alpha(alpha);
  const int64_t len_q = query.size(-2), len_k = key.size(-2);
  const int64_t dim_qk = query.size(-1), dim_v = value.size(-1);
  checks::sparse_sdpa_backward_inputs(grad_output, output, tau, support_value, weights, batch,
                                      len_q, len_k, dim_v);
  if (at::isReducedFloatingType(query.scalar_type())) {
    // As in the forward: float32 throughout, the gradients rounded at the end.
    const auto wide = [](const Tensor& t) { return t.to(at::kFloat); };
    std::optional<Tensor> weights32;
    if (weights && weights->defined()) weights32 = wide(*weights);
    auto [dq, dk, dv, dmask] = sparse_backward_cpu(
        wide(grad_output), wide(query), wide(key), wide(value), attn_mask, is_causal, scale,
        wide(output), tau, support_value, alpha, weights32, grad_mask);
    const auto dtype = query.scalar_type();
    const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
    return {dq.to(dtype), dk.to(dtype), dv.to(dtype), mask_grad ? dmask : dmask.to(dtype)};
  }
  // The forward's weights, when it kept them, replace recomputing the probabilities.
  const Tensor probs = weights && weights->numel() > 0 ? weights->contiguous() : Tensor();
  const auto options = query.options();
  Tensor grad_q = at::empty(with_tail(batch, {len_q, dim_qk}), options);
  Tensor grad_k = at::empty(with_tail(batch, {len_k, dim_qk}), options);
  Tensor grad_v = at::empty(with_tail(batch, {len_k, dim_v}), options);
  const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
  TORCH_CHECK(!mask_grad || attn_mask->is_floating_point(), kSdpa,
              " backward: a boolean attn_mask has no gradient");
  Tensor grad_m = mask_grad ? at::empty(with_tail(batch, {len_q, len_k}), options)
                            : at::empty({0}, options);
  AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "attnlab_sparse_sdpa_backward", [&] {
    PreparedProblem<scalar_t> prepared(query, key, value, attn_mask, is_causal, scale, batch);
    std::vector<int64_t> grad_offsets;
    const Tensor grad_rows = rows_contiguous(grad_output);
    const auto grad = batched_rows<scalar_t>(grad_rows, batch, grad_offsets);
    cpu::sparse_attention_backward<scalar_t>(
        prepared.problem, alpha, grad, tau.contiguous().data_ptr<scalar_t>(),
        support_value.contiguous().data_ptr<scalar_t>(),
        probs.defined() ? probs.data_ptr<scalar_t>() : nullptr, grad_q.data_ptr<scalar_t>(),
        grad_k.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>(),
        mask_grad ? grad_m.data_ptr<scalar_t>() : nullptr);
  });
  // Broadcast inputs receive the sum over the dimensions they were broadcast along.
  if (mask_grad) grad_m = grad_m.sum_to_size(attn_mask->sizes()).to(attn_mask->scalar_type());
  return {grad_q.sum_to_size(query.sizes()), grad_k.sum_to_size(key.sizes()),
          grad_v.sum_to_size(value.sizes()), grad_m};
}

c10::TypedOperatorHandle<decltype(sparse_forward_cpu)> forward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sparse_sdpa_forward", "")
                       .typed<decltype(sparse_forward_cpu)>();
  return op;
}

c10::TypedOperatorHandle<decltype(sparse_backward_cpu)> backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sparse_sdpa_backward", "")
                       .typed<decltype(sparse_backward_cpu)>();
  return op;
}

// The forward keeps each row's threshold tau and U = S·V/ΣS; the backward recomputes the
// probabilities from tau block by block (or reads the weights when the forward made them).
class SparseSdpaFunction : public torch::autograd::Function<SparseSdpaFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& query, const Tensor& key,
                                                const Tensor& value,
                                                const std::optional<Tensor>& attn_mask,
                                                bool is_causal, std::optional<double> scale,
                                                bool need_weights, double alpha) {
    auto [output, tau, support_value, weights] = forward_op().call(
        query, key, value, attn_mask, is_causal, scale, need_weights, alpha);
    ctx->save_for_backward({query, key, value, output, tau, support_value,
                            attn_mask.value_or(Tensor()), need_weights ? weights : Tensor()});
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["alpha"] = alpha;
    ctx->mark_non_differentiable({weights});
    ctx->set_materialize_grads(false);
    return {output, weights};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& grad_output = grads[0];
    torch::autograd::variable_list result(8);
    if (!grad_output.defined()) return result;
    const auto optional = [](const Tensor& t) {
      return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
    };
    const bool mask_grad = saved[6].defined() && ctx->needs_input_grad(3);
    auto [dq, dk, dv, dmask] = backward_op().call(
        grad_output, saved[0], saved[1], saved[2], optional(saved[6]),
        ctx->saved_data["is_causal"].toBool(), ctx->saved_data["scale"].toOptional<double>(),
        saved[3], saved[4], saved[5], ctx->saved_data["alpha"].toDouble(), optional(saved[7]),
        mask_grad);
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (mask_grad) result[3] = dmask;
    return result;
  }
};

}  // namespace

std::optional<double> normalizer_alpha(std::string_view normalizer,
                                       std::optional<double> alpha) {
  const bool general = normalizer == "entmax";
  TORCH_CHECK(general || normalizer == "softmax" || normalizer == "sparsemax" ||
                  normalizer == "entmax15",
              kSdpa, ": unknown normalizer \"", normalizer, "\"; expected one of \"softmax\", "
              "\"sparsemax\", \"entmax15\" or \"entmax\" (with alpha)");
  if (!general) {
    TORCH_CHECK(!alpha, kSdpa, ": alpha is only taken by normalizer=\"entmax\" (sparsemax is "
                "alpha=2, entmax15 alpha=1.5), got alpha=", alpha.value_or(0), " with normalizer=\"",
                normalizer, "\"");
    if (normalizer == "softmax") return std::nullopt;
    return normalizer == "sparsemax" ? 2.0 : 1.5;
  }
  TORCH_CHECK(alpha, kSdpa, ": normalizer=\"entmax\" needs alpha, a finite number > 1 "
              "(2 is sparsemax, 1.5 entmax-1.5)");
  checks::sparse_alpha(*alpha);
  return *alpha;
}

std::tuple<Tensor, Tensor> sparse_scaled_dot_product_attention(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, double alpha) {
  auto outs = SparseSdpaFunction::apply(query, key, value, attn_mask, is_causal, scale,
                                        need_weights, alpha);
  return {outs[0], outs[1]};
}

}  // namespace attnlab

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def(
      "_sparse_sdpa_forward(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
      "bool is_causal, float? scale, bool need_weights, float alpha) "
      "-> (Tensor output, Tensor tau, Tensor support_value, Tensor weights)");
  m.def(
      "_sparse_sdpa_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask, bool is_causal, float? scale, Tensor output, Tensor tau, "
      "Tensor support_value, float alpha, Tensor? weights=None, bool grad_mask=False) "
      "-> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_mask)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("_sparse_sdpa_forward", &attnlab::sparse_forward_cpu);
  m.impl("_sparse_sdpa_backward", &attnlab::sparse_backward_cpu);
}
