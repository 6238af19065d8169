// CUDA entry points of the sparse attention operators (sparsemax, entmax-1.5, α-entmax):
// attnlab::_sparse_sdpa_forward and attnlab::_sparse_sdpa_backward. The same input checks as on
// the CPU, the tensors laid out for the kernels (broadcast and strided batch dimensions read in
// place), dispatch by dtype and head size, on torch's current stream.
//
// dtypes: float32, float16 and bfloat16 inputs, float32 arithmetic. tau and support_value are
// always float32 on CUDA (for float16/bfloat16 inputs as the log-sum-exp of the softmax kernels:
// the backward recomputes the probabilities from tau, and rounding it to half precision would
// move the support; U enters every gradient through delta = dO·U); output, weights and the
// gradients have the inputs' dtype, the mask's gradient the mask's. The fake kernel
// (attnlab/_ops.py) must say the same. The backward also takes a tau and support_value in the
// output's dtype (the CPU forward's), converted to float32.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda/op_layout.h"
#include "cuda/sparse_kernels.h"
#include "ops/checks.h"
#include "ops/layout.h"

namespace attnlab::cuda {
namespace {

using at::Tensor;
using attnlab::with_tail;

// The CPU operators' name in messages (ops/attention.cpp): the public entry point is
// attnlab.scaled_dot_product_attention(..., normalizer=...).
constexpr const char* kSdpa = "attnlab.scaled_dot_product_attention";

// Upper bound on the forward's score workspace (float32, kSparseRowsPerBlock·L_k per block in
// flight); a larger problem runs in waves. ATTNLAB_SPARSE_WORKSPACE_BYTES overrides it (the
// tests use a small value to exercise the waves).
constexpr int64_t kDefaultWorkspaceBytes = int64_t(256) << 20;

int64_t workspace_budget_bytes() {
  const char* text = std::getenv("ATTNLAB_SPARSE_WORKSPACE_BYTES");
  if (text == nullptr || *text == '\0') return kDefaultWorkspaceBytes;
  char* end = nullptr;
  const long long bytes = std::strtoll(text, &end, 10);
  TORCH_CHECK(end != text && *end == '\0' && bytes > 0,
              "attnlab: ATTNLAB_SPARSE_WORKSPACE_BYTES must be a positive number of bytes, got '",
              text, "'");
  return bytes;
}

// The same check and message as the CPU operators (checks::sparse_alpha).
void check_alpha(double alpha) {
  TORCH_CHECK(std::isfinite(alpha) && alpha > 1, kSdpa,
              ": alpha must be a finite number > 1 (2 is sparsemax, 1.5 entmax-1.5; alpha -> 1 "
              "approaches softmax, normalizer=\"softmax\"), got ", alpha);
}

void check_head_sizes(const Tensor& query, const Tensor& value) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      query.size(-1) <= kMaxHeadSize && value.size(-1) <= kMaxHeadSize, kSdpa,
      " on CUDA: query, key and value may have at most ", kMaxHeadSize,
      " features per head, got ", query.size(-1), " (query, key) and ", value.size(-1),
      " (value)");
}

// A tensor of the backward against the shape, dtypes (the first named in the message) and
// device (that of `other`, named other_name) it must have, with the CPU operators' messages
// (checks::sparse_sdpa_backward_inputs).
void check_saved(const Tensor& t, const char* name, at::IntArrayRef shape,
                 std::initializer_list<at::ScalarType> dtypes, const Tensor& other,
                 const char* other_name = "output") {
  TORCH_CHECK(t.defined(), kSdpa, " backward: ", name, " is an undefined tensor");
  TORCH_CHECK(t.sizes() == shape, kSdpa, " backward: ", name, " has shape ", t.sizes(),
              ", expected ", shape);
  TORCH_CHECK(std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) != dtypes.end(), kSdpa,
              " backward: ", name, " has dtype ", t.scalar_type(), ", expected ",
              *dtypes.begin());
  TORCH_CHECK(t.device() == other.device(), kSdpa, " backward: ", name, " is on ", t.device(),
              " but ", other_name, " is on ", other.device());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_forward_cuda(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    bool need_weights, double alpha, double dropout_p, int64_t /*dropout_seed*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0, "attnlab.scaled_dot_product_attention: "
                              "dropout_p > 0 runs in the CPU kernels only");
  const auto batch_shape = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  check_alpha(alpha);
  check_head_sizes(query, value);
  const c10::cuda::CUDAGuard device_guard(query.device());
  const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
  const auto options = query.options();
  const auto float_options = options.dtype(at::kFloat);
  Tensor output = at::empty(with_tail(batch_shape, {len_q, dim_v}), options);
  Tensor tau = at::empty(with_tail(batch_shape, {len_q}), float_options);
  Tensor support_value = at::empty(with_tail(batch_shape, {len_q, dim_v}), float_options);
  Tensor weights = need_weights ? at::empty(with_tail(batch_shape, {len_q, len_k}), options)
                                : at::empty({0}, options);

  BatchIndexer batch(batch_shape);
  const SdpaProblem p = make_problem(batch, query, key, value, attn_mask, is_causal, scale);
  const EntmaxParams e = entmax_params(alpha);

  // The score workspace: as many blocks per wave as the budget holds (at least one).
  const int64_t blocks = sparse_forward_blocks(p);
  const int64_t floats_per_block = int64_t(kSparseRowsPerBlock) * len_k;
  int64_t wave = blocks;
  if (floats_per_block > 0 && blocks > 0) {
    const int64_t fit = workspace_budget_bytes() / (floats_per_block * int64_t(sizeof(float)));
    wave = std::max<int64_t>(1, std::min(blocks, fit));
  }
  Tensor workspace = at::empty({wave * floats_per_block}, float_options);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_cuda_type(query.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    with_head_family(std::max(p.dim_qk, p.dim_v), [&](auto family) {
      sparse_forward<T, decltype(family)::value>(
          p, e, workspace.data_ptr<float>(), wave, static_cast<T*>(output.data_ptr()),
          tau.data_ptr<float>(), support_value.data_ptr<float>(),
          need_weights ? static_cast<T*>(weights.data_ptr()) : nullptr, stream);
    });
  });
  return {output, tau, support_value, weights};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sparse_backward_cuda(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& tau, const Tensor& support_value, double alpha,
    const std::optional<Tensor>& weights, bool grad_mask,
    const std::optional<Tensor>& grad_attn_weights, double dropout_p,
    int64_t /*dropout_seed*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0, "attnlab.scaled_dot_product_attention: "
                              "dropout_p > 0 runs in the CPU kernels only");
  TORCH_CHECK_NOT_IMPLEMENTED(!grad_attn_weights || !grad_attn_weights->defined(),
                              "attnlab.scaled_dot_product_attention backward: grad_attn_weights "
                              "is taken on the CPU only");
  const auto batch_shape = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  check_alpha(alpha);
  check_head_sizes(query, value);
  const int64_t len_q = query.size(-2), len_k = key.size(-2);
  const int64_t dim_qk = query.size(-1), dim_v = value.size(-1);
  const auto out_shape = with_tail(batch_shape, {len_q, dim_v});
  // The kernels read grad_output as the inputs' type (the CPU path fails in data_ptr<T>).
  const auto dtype = query.scalar_type();
  check_saved(output, "output", out_shape, {dtype}, query, "query");
  check_saved(grad_output, "grad_output", out_shape, {dtype}, output);
  // tau and support_value are float32 from the CUDA forward; the CPU forward's (output dtype)
  // are taken too, converted.
  check_saved(tau, "tau", with_tail(batch_shape, {len_q}), {at::kFloat, dtype}, output);
  check_saved(support_value, "support_value", out_shape, {at::kFloat, dtype}, output);
  // The forward's weights are not read (the probabilities are recomputed from tau, which is
  // float32 where the weights may be rounded); when given they must still fit.
  if (weights && weights->defined() && weights->numel() > 0) {
    check_saved(*weights, "weights", with_tail(batch_shape, {len_q, len_k}), {dtype}, output);
  }
  const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
  TORCH_CHECK(!mask_grad || attn_mask->is_floating_point(), kSdpa,
              " backward: a boolean attn_mask has no gradient");
  const c10::cuda::CUDAGuard device_guard(query.device());

  const auto options = query.options();
  const auto float_options = options.dtype(at::kFloat);
  Tensor grad_q = at::empty(with_tail(batch_shape, {len_q, dim_qk}), options);
  Tensor grad_k = at::empty(with_tail(batch_shape, {len_k, dim_qk}), options);
  Tensor grad_v = at::empty(with_tail(batch_shape, {len_k, dim_v}), options);
  // Zeros: pairs the causal mask hides past a query block's last key are never visited.
  Tensor grad_m = mask_grad ? at::zeros(with_tail(batch_shape, {len_q, len_k}), float_options)
                            : at::empty({0}, options);
  Tensor delta = at::empty(with_tail(batch_shape, {len_q}), float_options);
  const Tensor tau_f = tau.to(at::kFloat).contiguous();
  const Tensor support_f = support_value.to(at::kFloat).contiguous();

  BatchIndexer batch(batch_shape);
  const SdpaProblem p = make_problem(batch, query, key, value, attn_mask, is_causal, scale);
  const MatrixOperand dout = batch.operand(grad_output, len_q, dim_v);
  const EntmaxParams e = entmax_params(alpha);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_cuda_type(query.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    with_head_family(std::max(p.dim_qk, p.dim_v), [&](auto family) {
      sparse_backward<T, decltype(family)::value>(
          p, e, dout, tau_f.const_data_ptr<float>(), support_f.const_data_ptr<float>(),
          delta.data_ptr<float>(), static_cast<T*>(grad_q.data_ptr()),
          static_cast<T*>(grad_k.data_ptr()), static_cast<T*>(grad_v.data_ptr()),
          mask_grad ? grad_m.data_ptr<float>() : nullptr, stream);
    });
  });
  // Inputs that were broadcast receive the sum over the broadcast dimensions.
  if (mask_grad) grad_m = grad_m.sum_to_size(attn_mask->sizes()).to(attn_mask->scalar_type());
  return {grad_q.sum_to_size(query.sizes()), grad_k.sum_to_size(key.sizes()),
          grad_v.sum_to_size(value.sizes()), grad_m};
}

}  // namespace
}  // namespace attnlab::cuda

TORCH_LIBRARY_IMPL(attnlab, CUDA, m) {
  m.impl("_sparse_sdpa_forward", &attnlab::cuda::sparse_forward_cuda);
  m.impl("_sparse_sdpa_backward", &attnlab::cuda::sparse_backward_cuda);
}
