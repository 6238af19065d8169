#pragma once
// Host-side helpers shared by the CUDA operator entry points (cuda/ops.cpp for softmax attention
// and additive scores, cuda/sparse_ops.cpp for sparse attention): dispatch by dtype and head-size
// family, the broadcast batch shape as the kernels index it, and the problem description.

#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sdpa_kernels.h"

namespace attnlab::cuda {

// The largest head size (query/key features, value features) the generic kernels take.
constexpr int64_t kMaxHeadSize = 256;

// Calls fn with std::type_identity<T> for the CUDA type T that stores `dtype`.
template <typename Fn>
void with_cuda_type(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kFloat: return fn(std::type_identity<float>{});
    case at::kHalf: return fn(std::type_identity<__half>{});
    case at::kBFloat16: return fn(std::type_identity<__nv_bfloat16>{});
    default: TORCH_CHECK(false, "attnlab: no CUDA kernels for dtype ", dtype);
  }
}

// Calls fn with std::integral_constant<int, kHead> for the smallest head-size family that holds
// `head_size` features.
template <typename Fn>
void with_head_family(int64_t head_size, Fn&& fn) {
  if (head_size <= 32) return fn(std::integral_constant<int, 32>{});
  if (head_size <= 64) return fn(std::integral_constant<int, 64>{});
  if (head_size <= 128) return fn(std::integral_constant<int, 128>{});
  return fn(std::integral_constant<int, 256>{});
}

// The broadcast batch shape as the kernels index it. Size-1 dimensions are dropped; with more
// than kMaxBatchDims left, every operand is reshaped (copied where it must be) to one flat
// batch dimension.
class BatchIndexer {
 public:
  explicit BatchIndexer(at::IntArrayRef batch_shape);

  const BatchShape& shape() const { return shape_; }
  int64_t count() const { return count_; }

  // t's matrices [rows, cols] (t broadcasts to them) at every batch entry, in place unless
  // flattening needs a copy; the tensor read is kept alive with the indexer.
  MatrixOperand operand(const at::Tensor& t, int64_t rows, int64_t cols);

 private:
  std::vector<int64_t> full_, kept_;
  int64_t count_;
  bool flatten_ = false;
  BatchShape shape_;
  std::vector<at::Tensor> alive_;
};

// The problem description shared by the forward and the backward.
SdpaProblem make_problem(BatchIndexer& batch, const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value, const std::optional<at::Tensor>& attn_mask,
                         bool is_causal, std::optional<double> scale);

}  // namespace attnlab::cuda
