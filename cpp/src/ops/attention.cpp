// attnlab::scaled_dot_product_attention and its forward/backward operators: schemas, the one
// autograd formula for every normalizer, and the CPU entry points that lay tensors out for the
// one kernel (cpu/attention/attention_kernel.h). Softmax keeps each row's log-sum-exp for the backward
// (_sdpa_forward, _sdpa_backward); a sparse normalizer its threshold τ and U = S·V/ΣS
// (_sparse_sdpa_forward, _sparse_sdpa_backward), where U takes the output's place in δ.

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "attnlab/attention.h"
#include "cpu/attention/attention_kernel.h"
#include "cpu/gemm/gemm.h"
#include "ops/checks.h"
#include "ops/layout.h"

namespace attnlab {
namespace {

using at::Tensor;

constexpr const char* kSdpa = "attnlab.scaled_dot_product_attention";

bool reduced_precision(const Tensor& t) { return at::isReducedFloatingType(t.scalar_type()); }

Tensor to_float(const Tensor& t) { return t.to(at::kFloat); }

// Whether the float32 kernel runs the products of these reduced-precision inputs on bfloat16
// operands: only for bfloat16 inputs, whose widened values round back exactly (float16 ones
// would lose mantissa bits), and only on CPUs where that is faster than float32 products
// (cpu::bf16_products_pay).
bool bf16_products(const Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && cpu::bf16_products_pay();
}

// Dropout of probability dropout_p (in [0, 1), checked) from dropout_seed: cpu::Dropout.
// weights_before_dropout: the weights are P, not P ⊙ D (cpu::Dropout::weights_undropped).
cpu::Dropout dropout_of(double dropout_p, int64_t dropout_seed,
                        bool weights_before_dropout = false) {
  checks::dropout(dropout_p);
  return {dropout_p, static_cast<uint64_t>(dropout_seed), weights_before_dropout};
}

// The forward: (output, row statistic, weights, support_value), the last an empty tensor for
// softmax (alpha == 1). bf16_operands (set by the reduced-precision branch for the float32
// tensors it makes): see cpu::AttentionProblem.
std::tuple<Tensor, Tensor, Tensor, Tensor> sdpa_forward_impl(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, bool bf16_operands, double alpha, const cpu::Dropout& dropout) {
  auto batch = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  const bool sparse = alpha != 1;
  if (!sparse && reduced_precision(query) &&
      (!bf16_products(query) || cpu::bf16_prepacked_route()) &&
      cpu::forward_widens_heads(key.size(-2), query.size(-1), value.size(-1))) {
    // float16 and bfloat16 on the float32 kernel, which widens each batch entry's inputs
    // itself; every sum is float32 and only the results are rounded (the log-sum-exp stays
    // float32, as on CUDA). bfloat16 products (AMX tiles or vdpbf16ps) take this path
    // too, without weights reading the bfloat16 rows themselves (cpu::attention_forward):
    // widening the whole tensors first (torch's copy kernel) took 18 % of a (8, 8, 512, 64)
    // forward on an AMX Xeon.
    const auto options = query.options().dtype(at::kFloat);
    const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
    // The output in the inputs' dtype, rounded by the kernel block by block.
    Tensor output = at::empty(with_tail(batch, {len_q, dim_v}), query.options());
    Tensor lse = at::empty(with_tail(batch, {len_q}), options);
    Tensor weights = need_weights ? empty_weights(with_tail(batch, {len_q, len_k}), options)
                                  : at::empty({0}, options);
    PreparedProblem<float> prepared(query, key, value, attn_mask, is_causal, scale, batch,
                                    /*narrow_inputs=*/true);
    prepared.problem.bf16_operands = bf16_products(query);
    prepared.problem.dropout = dropout;
    cpu::attention_forward<float>(prepared.problem, nullptr, lse.data_ptr<float>(),
                                  need_weights ? weights.data_ptr<float>() : nullptr,
                                  static_cast<uint16_t*>(output.data_ptr()));
    return {output, lse, weights.to(query.scalar_type()), Tensor()};
  }
  if (reduced_precision(query)) {
    // float16 and bfloat16 run through the float32 kernel: the inputs are widened once, every
    // sum is float32, and only the results are rounded (the row statistic and U stay float32,
    // as on CUDA). For bfloat16 softmax the products may round the probabilities to bfloat16,
    // as torch's bfloat16 kernel does, to run on the CPU's bfloat16 dot products.
    const auto wide = widened_to_float({query, key, value});
    auto [output, stat, weights, support_value] =
        sdpa_forward_impl(wide[0], wide[1], wide[2], attn_mask, is_causal, scale, need_weights,
                          !sparse && bf16_products(query), alpha, dropout);
    return {output.to(query.scalar_type()), stat, weights.to(query.scalar_type()),
            support_value};
  }
  const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
  const auto options = query.options();
  Tensor output = at::empty(with_tail(batch, {len_q, dim_v}), options);
  Tensor stat = at::empty(with_tail(batch, {len_q}), options);
  Tensor support_value = sparse ? at::empty(with_tail(batch, {len_q, dim_v}), options) : Tensor();
  Tensor weights = need_weights ? empty_weights(with_tail(batch, {len_q, len_k}), options)
                                : at::empty({0}, options);
  AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "attnlab_sdpa_forward", [&] {
    PreparedProblem<scalar_t> prepared(query, key, value, attn_mask, is_causal, scale, batch);
    prepared.problem.bf16_operands = bf16_operands;
    prepared.problem.alpha = alpha;
    prepared.problem.dropout = dropout;
    cpu::attention_forward<scalar_t>(
        prepared.problem, output.data_ptr<scalar_t>(), stat.data_ptr<scalar_t>(),
        need_weights ? weights.data_ptr<scalar_t>() : nullptr, nullptr,
        sparse ? support_value.data_ptr<scalar_t>() : nullptr);
  });
  return {output, stat, weights, support_value};
}

std::tuple<Tensor, Tensor, Tensor> sdpa_forward_cpu(const Tensor& query, const Tensor& key,
                                                     const Tensor& value,
                                                     const std::optional<Tensor>& attn_mask,
                                                     bool is_causal, std::optional<double> scale,
                                                     bool need_weights, double dropout_p,
                                                     int64_t dropout_seed,
                                                     bool weights_before_dropout) {
  auto [output, lse, weights, unused] =
      sdpa_forward_impl(query, key, value, attn_mask, is_causal, scale, need_weights, false, 1,
                        dropout_of(dropout_p, dropout_seed, weights_before_dropout));
  return {output, lse, weights};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_forward_cpu(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, double alpha, double dropout_p, int64_t dropout_seed) {
  checks::sparse_alpha(alpha);
  auto [output, tau, weights, support_value] =
      sdpa_forward_impl(query, key, value, attn_mask, is_causal, scale, need_weights, false,
                        alpha, dropout_of(dropout_p, dropout_seed));
  return {output, tau, support_value, weights};
}

// grad_weights: also return dP = grad_output·valueᵀ [..., L_q, L_k] at the output's batch
// shape (the gradient with respect to the weights as free variables, at every position); an
// empty tensor otherwise. stat: the log-sum-exp (alpha == 1) or τ; support_value: U for a
// sparse normalizer, undefined for softmax. grad_attn_weights: a gradient arriving at the
// returned weights (which must then be given), added into the backward. dropout: the
// forward's, whose mask the backward makes again.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sdpa_backward_impl(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& stat, const std::optional<Tensor>& weights,
    bool grad_mask, bool grad_weights, bool bf16_operands, double alpha,
    const Tensor& support_value, const std::optional<Tensor>& grad_attn_weights,
    const cpu::Dropout& dropout) {
  auto batch = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  const int64_t len_q = query.size(-2), len_k = key.size(-2);
  const int64_t dim_qk = query.size(-1), dim_v = value.size(-1);
  if (alpha == 1) {
    checks::sdpa_backward_inputs(grad_output, output, stat, weights, batch, len_q, len_k, dim_v);
  } else {
    checks::sparse_sdpa_backward_inputs(grad_output, output, stat, support_value, weights, batch,
                                        len_q, len_k, dim_v);
  }
  const bool has_weights = weights && weights->numel() > 0;
  // (an empty one, of weights with no entry, adds nothing)
  const bool weights_grad =
      grad_attn_weights && grad_attn_weights->defined() && grad_attn_weights->numel() > 0;
  TORCH_CHECK(!weights_grad || (has_weights && grad_attn_weights->sizes() == weights->sizes()),
              kSdpa, " backward: grad_attn_weights needs the forward's weights and their shape ",
              has_weights ? weights->sizes() : at::IntArrayRef{}, ", got ",
              weights_grad ? grad_attn_weights->sizes() : at::IntArrayRef{});
  if (reduced_precision(query)) {
    // As in the forward: float32 sums, the gradients rounded at the end, and for bfloat16
    // products on bfloat16 operands (P and dS rounded, as in torch's bfloat16 kernel).
    std::optional<Tensor> weights32, weights_grad32;
    if (weights && weights->defined()) weights32 = to_float(*weights);
    if (weights_grad) weights_grad32 = to_float(*grad_attn_weights);
    const auto wide = widened_to_float({grad_output, query, key, value, output});
    auto [dq, dk, dv, dmask, dweights] =
        sdpa_backward_impl(wide[0], wide[1], wide[2], wide[3], attn_mask, is_causal, scale,
                           wide[4], stat, weights32, grad_mask, grad_weights,
                           alpha == 1 && bf16_products(query), alpha, support_value,
                           weights_grad32, dropout);
    const auto dtype = query.scalar_type();
    const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
    return {dq.to(dtype), dk.to(dtype), dv.to(dtype), mask_grad ? dmask : dmask.to(dtype),
            dweights.to(dtype)};
  }
  // The forward's weights, when it kept them, replace recomputing the probabilities.
  const Tensor probs = has_weights ? weights->contiguous() : Tensor();
  const Tensor weights_grad_rows = weights_grad ? grad_attn_weights->contiguous() : Tensor();
  const auto options = query.options();
  Tensor grad_q = at::empty(with_tail(batch, {len_q, dim_qk}), options);
  Tensor grad_k = at::empty(with_tail(batch, {len_k, dim_qk}), options);
  Tensor grad_v = at::empty(with_tail(batch, {len_k, dim_v}), options);
  const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
  TORCH_CHECK(!mask_grad || attn_mask->is_floating_point(), kSdpa,
              " backward: a boolean attn_mask has no gradient");
  Tensor grad_m = mask_grad ? at::empty(with_tail(batch, {len_q, len_k}), options)
                            : at::empty({0}, options);
  Tensor grad_w = grad_weights ? empty_weights(with_tail(batch, {len_q, len_k}), options)
                               : at::empty({0}, options);
  AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "attnlab_sdpa_backward", [&] {
    PreparedProblem<scalar_t> prepared(query, key, value, attn_mask, is_causal, scale, batch);
    prepared.problem.bf16_operands = bf16_operands;
    prepared.problem.alpha = alpha;
    prepared.problem.dropout = dropout;
    std::vector<int64_t> grad_offsets;
    const Tensor grad_rows = rows_contiguous(grad_output);
    const auto grad = batched_rows<scalar_t>(grad_rows, batch, grad_offsets);
    cpu::attention_backward<scalar_t>(
        prepared.problem, grad,
        (alpha == 1 ? output : support_value).contiguous().data_ptr<scalar_t>(),
        stat.contiguous().data_ptr<scalar_t>(),
        probs.defined() ? probs.data_ptr<scalar_t>() : nullptr, grad_q.data_ptr<scalar_t>(),
        grad_k.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>(),
        mask_grad ? grad_m.data_ptr<scalar_t>() : nullptr,
        grad_weights ? grad_w.data_ptr<scalar_t>() : nullptr,
        weights_grad ? weights_grad_rows.data_ptr<scalar_t>() : nullptr);
  });
  // Inputs that were broadcast (over batch dimensions, or a mask over queries) receive the sum
  // over the broadcast dimensions.
  if (mask_grad) grad_m = grad_m.sum_to_size(attn_mask->sizes()).to(attn_mask->scalar_type());
  return {grad_q.sum_to_size(query.sizes()), grad_k.sum_to_size(key.sizes()),
          grad_v.sum_to_size(value.sizes()), grad_m, grad_w};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sdpa_backward_cpu(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& logsumexp, const std::optional<Tensor>& weights,
    bool grad_mask, bool grad_weights, const std::optional<Tensor>& grad_attn_weights,
    double dropout_p, int64_t dropout_seed, bool weights_before_dropout) {
  return sdpa_backward_impl(grad_output, query, key, value, attn_mask, is_causal, scale, output,
                            logsumexp, weights, grad_mask, grad_weights, false, 1, Tensor(),
                            grad_attn_weights,
                            dropout_of(dropout_p, dropout_seed, weights_before_dropout));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_backward_cpu(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& tau, const Tensor& support_value, double alpha,
    const std::optional<Tensor>& weights, bool grad_mask,
    const std::optional<Tensor>& grad_attn_weights, double dropout_p, int64_t dropout_seed) {
  checks::sparse_alpha(alpha);
  auto [dq, dk, dv, dmask, unused] =
      sdpa_backward_impl(grad_output, query, key, value, attn_mask, is_causal, scale, output,
                         tau, weights, grad_mask, false, false, alpha, support_value,
                         grad_attn_weights, dropout_of(dropout_p, dropout_seed));
  return {dq, dk, dv, dmask};
}

c10::TypedOperatorHandle<decltype(sdpa_forward_cpu)> forward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sdpa_forward", "")
                       .typed<decltype(sdpa_forward_cpu)>();
  return op;
}

c10::TypedOperatorHandle<decltype(sdpa_backward_cpu)> backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sdpa_backward", "")
                       .typed<decltype(sdpa_backward_cpu)>();
  return op;
}

c10::TypedOperatorHandle<decltype(sparse_forward_cpu)> sparse_forward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sparse_sdpa_forward", "")
                       .typed<decltype(sparse_forward_cpu)>();
  return op;
}

c10::TypedOperatorHandle<decltype(sparse_backward_cpu)> sparse_backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::_sparse_sdpa_backward", "")
                       .typed<decltype(sparse_backward_cpu)>();
  return op;
}

// The forward operators of normalizer alpha: (output, row statistic, weights, support_value),
// the last undefined for softmax.
std::tuple<Tensor, Tensor, Tensor, Tensor> forward_call(const Tensor& query, const Tensor& key,
                                                        const Tensor& value,
                                                        const std::optional<Tensor>& attn_mask,
                                                        bool is_causal,
                                                        std::optional<double> scale,
                                                        bool need_weights, double alpha,
                                                        double dropout_p, int64_t dropout_seed,
                                                        bool weights_before_dropout = false) {
  if (alpha == 1) {
    auto [output, lse, weights] =
        forward_op().call(query, key, value, attn_mask, is_causal, scale, need_weights,
                          dropout_p, dropout_seed, weights_before_dropout);
    return {output, lse, weights, Tensor()};
  }
  auto [output, tau, support_value, weights] =
      sparse_forward_op().call(query, key, value, attn_mask, is_causal, scale, need_weights,
                               alpha, dropout_p, dropout_seed);
  return {output, tau, weights, support_value};
}

// Whether a call that autograd records (records_graph below) keeps the probabilities for the
// backward although nobody asked for the weights: on the CPU, when the weights are at most
// twice the size of the output (L_k <= 2·E_v). There the backward reads them instead of
// recomputing Q·Kᵀ and the softmax, which at the tutorials' shapes (L = 10 or 16) costs more
// than the few kilobytes per head they take.
// With dropout only where the small kernels run (cpu::weights_undropped_fit), which alone keep
// P before dropout, as the backward needs it.
bool keep_probabilities(const Tensor& query, const Tensor& key, const Tensor& value,
                        double dropout_p) {
  if (!query.device().is_cpu() || key.size(-2) > 2 * value.size(-1)) return false;
  if (dropout_p == 0) return true;
  const int64_t len_k = key.size(-2), dim_qk = query.size(-1), dim_v = value.size(-1);
  return query.scalar_type() == at::kDouble
             ? cpu::weights_undropped_fit<double>(len_k, dim_qk, dim_v)
             : cpu::weights_undropped_fit<float>(len_k, dim_qk, dim_v);
}

// Whether autograd records this call: grad mode is on and an input requires grad, or an input
// carries a forward-mode tangent (which SdpaFunction refuses with a clear error).
bool records_graph(const Tensor& query, const Tensor& key, const Tensor& value,
                   const std::optional<Tensor>& attn_mask) {
  const bool has_mask = attn_mask && attn_mask->defined();
  for (const Tensor* t : {&query, &key, &value, has_mask ? &*attn_mask : nullptr}) {
    if (t && t->_fw_grad(/*level=*/0).defined()) return true;
  }
  return at::GradMode::is_enabled() &&
         (query.requires_grad() || key.requires_grad() || value.requires_grad() ||
          (has_mask && attn_mask->requires_grad()));
}

// The one autograd formula: the forward keeps each row's statistic (the log-sum-exp, or τ and
// U), the backward recomputes the probabilities from it (or reads them, when the forward kept
// them).
class SdpaFunction : public torch::autograd::Function<SdpaFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& query, const Tensor& key,
                                                const Tensor& value,
                                                const std::optional<Tensor>& attn_mask,
                                                bool is_causal, std::optional<double> scale,
                                                bool need_weights, bool keep_probs,
                                                double alpha, double dropout_p,
                                                int64_t dropout_seed) {
    // Straight to the CPU (or CUDA) kernel: autograd is this function, so the boxed autograd
    // and view fallbacks of the forward operator are skipped.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    // Kept only for the backward, the weights are P before dropout: the backward makes D again.
    const bool before_dropout = keep_probs && !need_weights && dropout_p > 0;
    auto [output, stat, weights, support_value] =
        forward_call(query, key, value, attn_mask, is_causal, scale, need_weights || keep_probs,
                     alpha, dropout_p, dropout_seed, before_dropout);
    // With need_weights the weights exist anyway: the backward reads them instead of
    // recomputing the probabilities.
    ctx->save_for_backward({query, key, value, output, stat, attn_mask.value_or(Tensor()),
                            need_weights || keep_probs ? weights : Tensor(), support_value});
    // The returned weights are differentiable: a loss on them reaches the inputs through the
    // same backward (on the CPU kernels).
    if (!need_weights) {
      weights = at::empty({0}, output.options());
      ctx->mark_non_differentiable({weights});
    }
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["alpha"] = alpha;
    // The backward makes the dropout mask again from the seed instead of keeping it.
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["dropout_seed"] = dropout_seed;
    ctx->saved_data["weights_before_dropout"] = before_dropout;
    // No zero-filled [..., L_q, L_k] gradient for the weights: backward takes undefined grads.
    ctx->set_materialize_grads(false);
    return {output, weights};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto optional = [](const Tensor& t) {
      return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
    };
    torch::autograd::variable_list result(11);
    const auto weights_grad = optional(grads[1]);
    if (!grads[0].defined() && !weights_grad) return result;
    TORCH_CHECK_NOT_IMPLEMENTED(!weights_grad || saved[0].device().is_cpu(), kSdpa,
                                ": a loss on the returned weights is differentiated on the CPU "
                                "only; on ", saved[0].device(), " detach the weights or compute "
                                "them on the CPU");
    // A loss on the weights alone: the output's gradient is zero.
    const Tensor grad_output = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    // Edges exist for tensor inputs only: the mask is the fourth when it was given.
    const bool mask_grad = saved[5].defined() && ctx->needs_input_grad(3);
    // As in the forward, except under create_graph, where the autograd fallback must still
    // mark the gradients as having no derivative of their own.
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    if (!at::GradMode::is_enabled()) below_autograd.emplace();
    const bool is_causal = ctx->saved_data["is_causal"].toBool();
    const auto scale = ctx->saved_data["scale"].toOptional<double>();
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const double dropout_p = ctx->saved_data["dropout_p"].toDouble();
    const int64_t dropout_seed = ctx->saved_data["dropout_seed"].toInt();
    const bool before_dropout = ctx->saved_data["weights_before_dropout"].toBool();
    Tensor dq, dk, dv, dmask;
    if (alpha == 1) {
      std::tie(dq, dk, dv, dmask, std::ignore) = backward_op().call(
          grad_output, saved[0], saved[1], saved[2], optional(saved[5]), is_causal, scale,
          saved[3], saved[4], optional(saved[6]), mask_grad, /*grad_weights=*/false,
          weights_grad, dropout_p, dropout_seed, before_dropout);
    } else {
      std::tie(dq, dk, dv, dmask) = sparse_backward_op().call(
          grad_output, saved[0], saved[1], saved[2], optional(saved[5]), is_causal, scale,
          saved[3], saved[4], saved[7], alpha, optional(saved[6]), mask_grad, weights_grad,
          dropout_p, dropout_seed);
    }
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (mask_grad) result[3] = dmask;
    return result;
  }
};

// The α of `normalizer` (2 for "sparsemax", 1.5 for "entmax15", `alpha` for "entmax", 1 for
// "softmax"). Raises, naming the argument, for an unknown normalizer, alpha given with a
// normalizer other than "entmax", "entmax" without alpha, or alpha <= 1, NaN or inf.
double normalizer_alpha(std::string_view normalizer, std::optional<double> alpha) {
  const bool general = normalizer == "entmax";
  TORCH_CHECK(general || normalizer == "softmax" || normalizer == "sparsemax" ||
                  normalizer == "entmax15",
              kSdpa, ": unknown normalizer \"", normalizer, "\"; expected one of \"softmax\", "
              "\"sparsemax\", \"entmax15\" or \"entmax\" (with alpha)");
  if (!general) {
    TORCH_CHECK(!alpha, kSdpa, ": alpha is only taken by normalizer=\"entmax\" (sparsemax is "
                "alpha=2, entmax15 alpha=1.5), got alpha=", alpha.value_or(0), " with normalizer=\"",
                normalizer, "\"");
    if (normalizer == "softmax") return 1;
    return normalizer == "sparsemax" ? 2.0 : 1.5;
  }
  TORCH_CHECK(alpha, kSdpa, ": normalizer=\"entmax\" needs alpha, a finite number > 1 "
              "(2 is sparsemax, 1.5 entmax-1.5)");
  checks::sparse_alpha(*alpha);
  return *alpha;
}

std::tuple<Tensor, Tensor> sdpa_composite(const Tensor& query, const Tensor& key,
                                          const Tensor& value,
                                          const std::optional<Tensor>& attn_mask,
                                          bool is_causal, std::optional<double> scale,
                                          bool need_weights, c10::string_view normalizer,
                                          std::optional<double> alpha, double dropout_p) {
  checks::sdpa_kinds(query, key, value, attn_mask, scale);
  const double a = normalizer_alpha(normalizer, alpha);
  checks::dropout(dropout_p);
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0 || query.device().is_cpu(), kSdpa,
                              ": dropout_p > 0 runs in the CPU kernels only; the query is on ",
                              query.device());
  // Each call with dropout draws its seed from torch's default generator, as torch's dropout
  // draws its mask: torch.manual_seed reproduces it.
  const int64_t seed =
      dropout_p > 0 ? at::empty({}, at::kLong).random_().item<int64_t>() : int64_t(0);
  if (!records_graph(query, key, value, attn_mask)) {
    // Nothing for autograd to record: the forward operator alone, without the autograd
    // function's node, context and output wrapping.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, stat, weights, support_value] = forward_call(
        query, key, value, attn_mask, is_causal, scale, need_weights, a, dropout_p, seed);
    return {output, need_weights ? weights : at::empty({0}, output.options())};
  }
  // The kept probabilities pay at softmax's small shapes; the sparse normalizers recompute them
  // from τ.
  auto outs = SdpaFunction::apply(
      query, key, value, attn_mask, is_causal, scale, need_weights,
      a == 1 && keep_probabilities(query, key, value, dropout_p), a, dropout_p, seed);
  return {outs[0], outs[1]};
}

// attnlab::_sdpa_summaries: the forward with summaries of the weights reduced in the kernel
// (cpu::WeightSummaries) in place of the weights: (output, received, entropy, topk_weights,
// topk_indices, pooled, to_weights), each summary not asked for an empty tensor. pooled is the
// mean weight of each block (an edge block's over its own cells). float16 and bfloat16 run on
// the float32 kernel; their summaries stay float32.
using SummaryTensors = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

SummaryTensors sdpa_summaries_cpu(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const std::optional<Tensor>& attn_mask, bool is_causal,
                                  std::optional<double> scale, c10::string_view normalizer,
                                  std::optional<double> alpha, bool received, bool entropy,
                                  int64_t topk, int64_t pool, at::IntArrayRef to) {
  checks::sdpa_kinds(query, key, value, attn_mask, scale);
  const double a = normalizer_alpha(normalizer, alpha);
  if (reduced_precision(query)) {
    const auto wide = widened_to_float({query, key, value});
    auto result = sdpa_summaries_cpu(wide[0], wide[1], wide[2], attn_mask, is_causal, scale,
                                     normalizer, alpha, received, entropy, topk, pool, to);
    std::get<0>(result) = std::get<0>(result).to(query.scalar_type());
    return result;
  }
  auto batch = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
  TORCH_CHECK(topk >= 0 && topk <= len_k, kSdpa, ": summary topk must be at most the number of "
              "keys L_k = ", len_k, ", got ", topk);
  TORCH_CHECK(pool >= 0, kSdpa, ": summary pool must be a positive block size, got ", pool);
  for (const int64_t t : to) {
    TORCH_CHECK(t >= 0 && t < len_k, kSdpa, ": summary to holds key ", t, ", outside [0, L_k = ",
                len_k, ")");
  }
  const auto options = query.options();
  const auto none = [&] { return at::empty({0}, options); };
  const int64_t pooled_q = pool > 0 ? (len_q + pool - 1) / pool : 0;
  const int64_t pooled_k = pool > 0 ? (len_k + pool - 1) / pool : 0;
  Tensor output = at::empty(with_tail(batch, {len_q, dim_v}), options);
  Tensor stat = at::empty(with_tail(batch, {len_q}), options);
  Tensor support_value = a != 1 ? at::empty(with_tail(batch, {len_q, dim_v}), options) : Tensor();
  Tensor received_t = received ? at::zeros(with_tail(batch, {len_k}), options) : none();
  Tensor entropy_t = entropy ? at::empty(with_tail(batch, {len_q}), options) : none();
  Tensor topk_w = topk > 0 ? at::empty(with_tail(batch, {len_q, topk}), options) : none();
  Tensor topk_i = at::empty(topk > 0 ? with_tail(batch, {len_q, topk}) : std::vector<int64_t>{0},
                            options.dtype(at::kLong));
  Tensor pooled_t = pool > 0 ? at::zeros(with_tail(batch, {pooled_q, pooled_k}), options)
                             : none();
  const std::vector<int64_t> to_keys(to.begin(), to.end());
  const int64_t n_to = static_cast<int64_t>(to_keys.size());
  Tensor to_t = n_to > 0 ? at::empty(with_tail(batch, {len_q, n_to}), options) : none();
  AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "attnlab_sdpa_summaries", [&] {
    PreparedProblem<scalar_t> prepared(query, key, value, attn_mask, is_causal, scale, batch);
    prepared.problem.alpha = a;
    cpu::WeightSummaries<scalar_t> s;
    if (received) s.received = received_t.data_ptr<scalar_t>();
    if (entropy) s.entropy = entropy_t.data_ptr<scalar_t>();
    if (topk > 0) {
      s.topk = topk;
      s.topk_weights = topk_w.data_ptr<scalar_t>();
      s.topk_indices = topk_i.data_ptr<int64_t>();
    }
    if (pool > 0) {
      s.pool = pool;
      s.pooled = pooled_t.data_ptr<scalar_t>();
    }
    if (n_to > 0) {
      s.to = to_keys.data();
      s.n_to = n_to;
      s.to_weights = to_t.data_ptr<scalar_t>();
    }
    cpu::attention_forward<scalar_t>(prepared.problem, output.data_ptr<scalar_t>(),
                                     stat.data_ptr<scalar_t>(), nullptr, nullptr,
                                     a != 1 ? support_value.data_ptr<scalar_t>() : nullptr, &s);
  });
  if (pool > 0 && pooled_t.numel() > 0) {
    // The cells of each block: pool × pool, fewer along the last row and column of blocks.
    const auto cells = [&](int64_t blocks, int64_t length) {
      return at::clamp_max(length - at::arange(blocks, options) * pool, pool);
    };
    pooled_t.div_(cells(pooled_q, len_q).unsqueeze(-1) * cells(pooled_k, len_k));
  }
  return {output, received_t, entropy_t, topk_w, topk_i, pooled_t, to_t};
}

// attnlab::_dropout_mask: the D that dropout of probability dropout_p from dropout_seed
// multiplies the weights by (0, or 1/(1 − dropout_p) where kept), at the shape of `like`
// [..., L_q, L_k] and in its dtype, its leading dimensions flattened as the kernels number their
// batch entries: a reference for tests.
Tensor dropout_mask(const Tensor& like, double dropout_p, int64_t dropout_seed) {
  TORCH_CHECK(like.dim() >= 2 && at::isFloatingType(like.scalar_type()),
              "attnlab._dropout_mask: like must be a floating-point tensor [..., L_q, L_k], got ",
              like.scalar_type(), " of shape ", like.sizes());
  const cpu::Dropout dropout = dropout_of(dropout_p, dropout_seed);
  Tensor mask = at::ones(like.sizes(), like.options().dtype(at::kDouble).device(at::kCPU));
  const int64_t cols = like.size(-1), rows = cols > 0 ? mask.numel() / cols : 0;
  cpu::dropout_rows(dropout, 0, 0, mask.data_ptr<double>(), rows, cols, cols,
                    dropout.kept_scale());
  return mask.to(like.options());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> scaled_dot_product_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, std::string_view normalizer, std::optional<double> alpha,
    double dropout_p) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::scaled_dot_product_attention", "")
                       .typed<decltype(sdpa_composite)>();
  return op.call(query, key, value, attn_mask, is_causal, scale, need_weights, normalizer, alpha,
                 dropout_p);
}

}  // namespace attnlab

TORCH_LIBRARY(attnlab, m) {
  // Fake (meta) implementations live in Python, where symbolic shapes come for free.
  m.set_python_module("attnlab._ops");
  m.def(
      "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask=None, bool is_causal=False, float? scale=None, "
      "bool need_weights=False, str normalizer=\"softmax\", float? alpha=None, "
      "float dropout_p=0.0) -> (Tensor output, Tensor weights)");
  m.def(
      "_sdpa_forward(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
      "bool is_causal, float? scale, bool need_weights, float dropout_p=0.0, "
      "int dropout_seed=0, bool weights_before_dropout=False) "
      "-> (Tensor output, Tensor logsumexp, Tensor weights)");
  m.def(
      "_sdpa_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask, bool is_causal, float? scale, Tensor output, Tensor logsumexp, "
      "Tensor? weights=None, bool grad_mask=False, bool grad_weights=False, "
      "Tensor? grad_attn_weights=None, float dropout_p=0.0, int dropout_seed=0, "
      "bool weights_before_dropout=False) "
      "-> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_mask, "
      "Tensor grad_weights)");
  m.def(
      "_sparse_sdpa_forward(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
      "bool is_causal, float? scale, bool need_weights, float alpha, float dropout_p=0.0, "
      "int dropout_seed=0) -> (Tensor output, Tensor tau, Tensor support_value, Tensor weights)");
  m.def(
      "_sparse_sdpa_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask, bool is_causal, float? scale, Tensor output, Tensor tau, "
      "Tensor support_value, float alpha, Tensor? weights=None, bool grad_mask=False, "
      "Tensor? grad_attn_weights=None, float dropout_p=0.0, int dropout_seed=0) "
      "-> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_mask)");
  m.def(
      "_sdpa_summaries(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
      "bool is_causal, float? scale, str normalizer, float? alpha, bool received, "
      "bool entropy, int topk, int pool, int[] to) "
      "-> (Tensor output, Tensor received, Tensor entropy, Tensor topk_weights, "
      "Tensor topk_indices, Tensor pooled, Tensor to_weights)");
  m.def("_dropout_mask(Tensor like, float dropout_p, int dropout_seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CompositeImplicitAutograd, m) {
  m.impl("scaled_dot_product_attention", &attnlab::sdpa_composite);
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("_sdpa_forward", &attnlab::sdpa_forward_cpu);
  m.impl("_sdpa_backward", &attnlab::sdpa_backward_cpu);
  m.impl("_sparse_sdpa_forward", &attnlab::sparse_forward_cpu);
  m.impl("_sparse_sdpa_backward", &attnlab::sparse_backward_cpu);
  m.impl("_sdpa_summaries", &attnlab::sdpa_summaries_cpu);
  m.impl("_dropout_mask", &attnlab::dropout_mask);
}
