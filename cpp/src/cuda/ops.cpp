// CUDA entry points of the attnlab operators: the same checks as on the CPU, the tensors laid
// out for the kernels (broadcast and strided batch dimensions read in place), dispatch by dtype
// and head size, on torch's current stream. The autograd formulas in ops/ are shared.

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include "cuda/op_layout.h"
#include "cuda/sdpa_kernels.h"
#include "ops/checks.h"
#include "ops/layout.h"

namespace attnlab::cuda {
namespace {

using at::Tensor;
using attnlab::with_tail;

// need_weights on the flash forward (its second pass over the keys writes the weights): only
// with ATTNLAB_CUDA_FLASH_WEIGHTS=1 until it has run on a GPU (tested so far on the warp
// emulator only, tests/cpp/test_flash_emulated.cpp); otherwise the generic forward writes them.
bool flash_weights_enabled() {
  const char* choice = std::getenv("ATTNLAB_CUDA_FLASH_WEIGHTS");
  return choice != nullptr && std::string_view(choice) == "1";
}

// Warps per block of the flash forward: 4 (default), or with ATTNLAB_CUDA_FLASH_WARPS=8 (read
// at every call) blocks of 8 warps of 16 query rows, 128 rows per block: tested on the warp
// emulator, not yet timed on a GPU.
int flash_block_warps() {
  const char* choice = std::getenv("ATTNLAB_CUDA_FLASH_WARPS");
  return choice != nullptr && std::string_view(choice) == "8" ? 8 : 4;
}

// grad_output read by the flash backward: unit column stride, 16-byte-aligned rows.
bool aligned_rows(const MatrixOperand& op, int dims) {
  constexpr int64_t kVector = 8;  // half-precision elements in 16 bytes
  if (op.col_stride != 1 || op.row_stride % kVector != 0 ||
      reinterpret_cast<uintptr_t>(op.data) % 16 != 0) {
    return false;
  }
  for (int d = 0; d < dims; ++d) {
    if (op.batch_stride[d] % kVector != 0) return false;
  }
  return true;
}

// The tensor-core kernels' conditions (see sdpa_kernels.h; the backward also needs grad_output's
// rows aligned); anything else takes the generic kernels.
bool tensor_core_kernels_apply(const SdpaProblem& p, at::ScalarType dtype, bool need_weights) {
  if (dtype == at::kFloat || need_weights || p.mask.data != nullptr) return false;
  // mma.sync m16n8k16 on bfloat16 and cp.async need sm_80 (the kernels trap if built for an
  // older GPU). Asked of the CUDA runtime: at::cuda's device properties would make libattnlab
  // need libtorch_cuda.
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                        c10::cuda::current_device()));
  if (major < 8) return false;
  if (p.dim_qk != p.dim_v || (p.dim_qk != 64 && p.dim_qk != 128)) return false;
  for (const MatrixOperand* op : {&p.query, &p.key, &p.value}) {
    if (!aligned_rows(*op, p.shape.dims)) return false;
  }
  return true;
}

void check_head_sizes(const Tensor& query, const Tensor& value) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      query.size(-1) <= kMaxHeadSize && value.size(-1) <= kMaxHeadSize,
      "attnlab.scaled_dot_product_attention on CUDA: query, key and value may have at most ",
      kMaxHeadSize, " features per head, got ", query.size(-1), " (query, key) and ",
      value.size(-1), " (value)");
}

std::tuple<Tensor, Tensor, Tensor> sdpa_forward_cuda(const Tensor& query, const Tensor& key,
                                                      const Tensor& value,
                                                      const std::optional<Tensor>& attn_mask,
                                                      bool is_causal, std::optional<double> scale,
                                                      bool need_weights, double dropout_p,
                                                      int64_t /*dropout_seed*/,
                                                      bool /*weights_before_dropout*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0, "attnlab.scaled_dot_product_attention: "
                              "dropout_p > 0 runs in the CPU kernels only");
  const auto batch_shape = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  check_head_sizes(query, value);
  const c10::cuda::CUDAGuard device_guard(query.device());
  const int64_t len_q = query.size(-2), len_k = key.size(-2), dim_v = value.size(-1);
  const auto options = query.options();
  Tensor output = at::empty(with_tail(batch_shape, {len_q, dim_v}), options);
  // The log-sum-exp stays float32 for half-precision inputs: the backward's probabilities
  // exp(s − lse) would otherwise carry its rounding error.
  Tensor lse = at::empty(with_tail(batch_shape, {len_q}), options.dtype(at::kFloat));
  Tensor weights = need_weights ? at::empty(with_tail(batch_shape, {len_q, len_k}), options)
                                : at::empty({0}, options);
  BatchIndexer batch(batch_shape);
  const SdpaProblem p = make_problem(batch, query, key, value, attn_mask, is_causal, scale);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // With weights, the flash forward writes them only when ATTNLAB_CUDA_FLASH_WEIGHTS=1.
  const bool flash = tensor_core_kernels_apply(p, query.scalar_type(),
                                               need_weights && !flash_weights_enabled());
  with_cuda_type(query.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    with_head_family(std::max(p.dim_qk, p.dim_v), [&](auto family) {
      constexpr int kHead = decltype(family)::value;
      if constexpr (!std::is_same_v<T, float> && (kHead == 64 || kHead == 128)) {
        if (flash) {
          return sdpa_forward_flash<T, kHead>(
              p, static_cast<T*>(output.data_ptr()), lse.data_ptr<float>(),
              need_weights ? static_cast<T*>(weights.data_ptr()) : nullptr, flash_block_warps(),
              stream);
        }
      }
      sdpa_forward<T, kHead>(p, static_cast<T*>(output.data_ptr()), lse.data_ptr<float>(),
                             need_weights ? static_cast<T*>(weights.data_ptr()) : nullptr,
                             stream);
    });
  });
  return {output, lse, weights};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sdpa_backward_cuda(
    const Tensor& grad_output, const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
    const Tensor& output, const Tensor& logsumexp, const std::optional<Tensor>& weights,
    bool grad_mask, bool grad_weights, const std::optional<Tensor>& grad_attn_weights,
    double dropout_p, int64_t /*dropout_seed*/, bool /*weights_before_dropout*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0, "attnlab.scaled_dot_product_attention: "
                              "dropout_p > 0 runs in the CPU kernels only");
  TORCH_CHECK_NOT_IMPLEMENTED(!grad_attn_weights || !grad_attn_weights->defined(),
                              "attnlab.scaled_dot_product_attention backward: grad_attn_weights "
                              "is taken on the CPU only");
  const auto batch_shape = checks::sdpa_inputs(query, key, value, attn_mask, scale);
  const int64_t len_q = query.size(-2), len_k = key.size(-2);
  const int64_t dim_qk = query.size(-1), dim_v = value.size(-1);
  checks::sdpa_backward_inputs(grad_output, output, logsumexp, weights, batch_shape, len_q,
                               len_k, dim_v);
  TORCH_CHECK(output.device() == query.device(),
              "attnlab.scaled_dot_product_attention backward: output is on ", output.device(),
              " but query is on ", query.device());
  // The kernels read output as the inputs' type (the CPU path fails in data_ptr<T> instead).
  TORCH_CHECK(output.scalar_type() == query.scalar_type(),
              "attnlab.scaled_dot_product_attention backward: output has dtype ",
              output.scalar_type(), ", expected the inputs' ", query.scalar_type());
  check_head_sizes(query, value);
  const c10::cuda::CUDAGuard device_guard(query.device());
  const bool mask_grad = grad_mask && attn_mask && attn_mask->defined();
  TORCH_CHECK(!mask_grad || attn_mask->is_floating_point(),
              "attnlab.scaled_dot_product_attention backward: a boolean attn_mask has no "
              "gradient");
  // The forward's weights are not read: in half precision they are rounded, and the
  // probabilities recomputed from the float32 log-sum-exp are not.
  const auto options = query.options();
  Tensor grad_q = at::empty(with_tail(batch_shape, {len_q, dim_qk}), options);
  Tensor grad_k = at::empty(with_tail(batch_shape, {len_k, dim_qk}), options);
  Tensor grad_v = at::empty(with_tail(batch_shape, {len_k, dim_v}), options);
  // Zeros: pairs the causal mask hides are never visited.
  Tensor grad_m = mask_grad ? at::zeros(with_tail(batch_shape, {len_q, len_k}),
                                        options.dtype(at::kFloat))
                            : at::empty({0}, options);
  const Tensor out = output.contiguous();
  const Tensor lse = logsumexp.to(at::kFloat).contiguous();

  BatchIndexer batch(batch_shape);
  const SdpaProblem p = make_problem(batch, query, key, value, attn_mask, is_causal, scale);
  const MatrixOperand dout = batch.operand(grad_output, len_q, dim_v);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // Per query row: delta (flash), or max, 1/sum and delta (generic).
  Tensor row_scratch = at::empty({3 * p.batch * len_q}, options.dtype(at::kFloat));
  const bool flash = !mask_grad && tensor_core_kernels_apply(p, query.scalar_type(), false) &&
                     aligned_rows(dout, p.shape.dims);
  with_cuda_type(query.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    with_head_family(std::max(p.dim_qk, p.dim_v), [&](auto family) {
      constexpr int kHead = decltype(family)::value;
      if constexpr (!std::is_same_v<T, float> && (kHead == 64 || kHead == 128)) {
        if (flash) {
          // dQ is summed over the key blocks in float32, then rounded.
          Tensor grad_q_accum = at::zeros({p.batch, len_q, dim_qk}, options.dtype(at::kFloat));
          return sdpa_backward_flash<T, kHead>(
              p, dout, static_cast<const T*>(out.const_data_ptr()), lse.const_data_ptr<float>(),
              row_scratch.data_ptr<float>(), grad_q_accum.data_ptr<float>(),
              static_cast<T*>(grad_q.data_ptr()), static_cast<T*>(grad_k.data_ptr()),
              static_cast<T*>(grad_v.data_ptr()), stream);
        }
      }
      sdpa_backward<T, decltype(family)::value>(
          p, dout, row_scratch.data_ptr<float>(), static_cast<T*>(grad_q.data_ptr()),
          static_cast<T*>(grad_k.data_ptr()), static_cast<T*>(grad_v.data_ptr()),
          mask_grad ? grad_m.data_ptr<float>() : nullptr, stream);
    });
  });
  // Inputs that were broadcast receive the sum over the broadcast dimensions.
  if (mask_grad) grad_m = grad_m.sum_to_size(attn_mask->sizes()).to(attn_mask->scalar_type());
  // dP = grad_output·valueᵀ at every position, in float32, at the output's batch shape (the
  // kernels keep their dP blocks in shared memory; one batched GEMM writes them out instead).
  Tensor grad_w = grad_weights
                      ? at::matmul(grad_output.to(at::kFloat),
                                   value.to(at::kFloat).transpose(-2, -1))
                            .expand(with_tail(batch_shape, {len_q, len_k}))
                            .to(query.scalar_type())
                            .contiguous()
                      : at::empty({0}, options);
  return {grad_q.sum_to_size(query.sizes()), grad_k.sum_to_size(key.sizes()),
          grad_v.sum_to_size(value.sizes()), grad_m, grad_w};
}

Tensor additive_scores_forward_cuda(const Tensor& query_proj, const Tensor& key_proj,
                                    const Tensor& weight) {
  checks::additive_scores_inputs(query_proj, key_proj, weight);
  const c10::cuda::CUDAGuard device_guard(query_proj.device());
  const Tensor qp = query_proj.contiguous(), kp = key_proj.contiguous(), w = weight.contiguous();
  const int64_t batch = qp.size(0), len_q = qp.size(1), len_k = kp.size(1), hidden = qp.size(2);
  Tensor scores = at::empty({batch, len_q, len_k}, qp.options());
  with_cuda_type(qp.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    additive_scores_forward<T>(static_cast<const T*>(qp.const_data_ptr()),
                               static_cast<const T*>(kp.const_data_ptr()),
                               static_cast<const T*>(w.const_data_ptr()), batch, len_q, len_k,
                               hidden, static_cast<T*>(scores.data_ptr()),
                               at::cuda::getCurrentCUDAStream());
  });
  return scores;
}

std::tuple<Tensor, Tensor, Tensor> additive_scores_backward_cuda(const Tensor& grad_scores,
                                                                 const Tensor& query_proj,
                                                                 const Tensor& key_proj,
                                                                 const Tensor& weight) {
  checks::additive_scores_inputs(query_proj, key_proj, weight);
  const int64_t batch = query_proj.size(0), len_q = query_proj.size(1),
                len_k = key_proj.size(1), hidden = query_proj.size(2);
  TORCH_CHECK(grad_scores.sizes() == at::IntArrayRef({batch, len_q, len_k}),
              "attnlab.additive_scores backward: grad_scores has shape ", grad_scores.sizes(),
              ", expected [", batch, ", ", len_q, ", ", len_k, "]");
  TORCH_CHECK(grad_scores.device() == query_proj.device(),
              "attnlab.additive_scores backward: grad_scores is on ", grad_scores.device(),
              " but query_proj is on ", query_proj.device());
  const c10::cuda::CUDAGuard device_guard(query_proj.device());
  const Tensor qp = query_proj.contiguous(), kp = key_proj.contiguous(), w = weight.contiguous();
  const Tensor g = grad_scores.to(qp.scalar_type()).contiguous();
  Tensor grad_qp = at::empty_like(qp), grad_kp = at::empty_like(kp);
  Tensor grad_w_rows = at::empty({batch * len_q, hidden}, qp.options().dtype(at::kFloat));
  with_cuda_type(qp.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    additive_scores_backward<T>(
        static_cast<const T*>(g.const_data_ptr()), static_cast<const T*>(qp.const_data_ptr()),
        static_cast<const T*>(kp.const_data_ptr()), static_cast<const T*>(w.const_data_ptr()),
        batch, len_q, len_k, hidden, static_cast<T*>(grad_qp.data_ptr()),
        static_cast<T*>(grad_kp.data_ptr()), grad_w_rows.data_ptr<float>(),
        at::cuda::getCurrentCUDAStream());
  });
  return {grad_qp, grad_kp, grad_w_rows.sum(0).to(qp.scalar_type())};
}

}  // namespace
}  // namespace attnlab::cuda

TORCH_LIBRARY_IMPL(attnlab, CUDA, m) {
  m.impl("_sdpa_forward", &attnlab::cuda::sdpa_forward_cuda);
  m.impl("_sdpa_backward", &attnlab::cuda::sdpa_backward_cuda);
  m.impl("_additive_scores_forward", &attnlab::cuda::additive_scores_forward_cuda);
  m.impl("_additive_scores_backward", &attnlab::cuda::additive_scores_backward_cuda);
}
