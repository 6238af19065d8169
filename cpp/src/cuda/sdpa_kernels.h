#pragma once
// CUDA scaled dot-product attention over raw device pointers. The operator layer
// (cuda/ops.cpp) validates, broadcasts and lays out the tensors; these launchers only compute,
// on the stream they are given. Plain C++: included by host code and by the .cu files.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace attnlab::cuda {

// Batch dimensions the kernels index directly (size-1 dimensions are dropped first); the
// operator layer flattens anything with more.
constexpr int kMaxBatchDims = 6;

// The batch shape that every operand is indexed by: batch entry b has the multi-index of b in
// row-major order over `sizes`.
struct BatchShape {
  int dims = 0;
  int64_t sizes[kMaxBatchDims] = {};
};

// One operand seen as a matrix per batch entry: element (b, row, col) is at
// data[Σ_d index_d(b)·batch_stride[d] + row·row_stride + col·col_stride]. Broadcast
// dimensions have stride 0.
struct MatrixOperand {
  const void* data = nullptr;
  int64_t batch_stride[kMaxBatchDims] = {};
  int64_t row_stride = 0, col_stride = 0;
};

struct SdpaProblem {
  int64_t batch = 0, len_q = 0, len_k = 0;
  int dim_qk = 0, dim_v = 0;
  BatchShape shape;
  MatrixOperand query, key, value;
  // [len_q, len_k] per batch entry; data == nullptr for none. Boolean (true = may attend) or
  // float32 (added to the scores).
  MatrixOperand mask;
  bool mask_is_bool = false;
  bool causal = false;  // query i sees keys j <= i
  float scale = 1;
};

// Outputs are contiguous at the flattened batch: output [batch, len_q, dim_v] (T),
// logsumexp [batch, len_q] (float32), weights [batch, len_q, len_k] (T, may be null).
// A query with every key masked gets zeros, zero weights and logsumexp −inf.
template <typename T, int kHead>
void sdpa_forward(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                  cudaStream_t stream);

// The same forward on tensor cores (sm_80+) for T = __half or __nv_bfloat16 and
// dim_qk == dim_v == kHead ∈ {64, 128}, without mask or weights. Needs unit column strides and
// 16-byte-aligned rows (pointers, row and batch strides): see tensor_core_forward_applies.
template <typename T, int kHead>
void sdpa_forward_tensor_core(const SdpaProblem& p, T* output, float* logsumexp,
                              cudaStream_t stream);

// Gradients at the flattened batch, contiguous, written (not accumulated): grad_query
// [batch, len_q, dim_qk], grad_key [batch, len_k, dim_qk], grad_value [batch, len_k, dim_v];
// grad_mask (float32 [batch, len_q, len_k], may be null) receives the scores' gradient.
// delta is float32 scratch of [batch, len_q]. grad_output is indexed like the query.
template <typename T, int kHead>
void sdpa_backward(const SdpaProblem& p, const MatrixOperand& grad_output, const T* output,
                   const float* logsumexp, float* delta, T* grad_query, T* grad_key,
                   T* grad_value, float* grad_mask, cudaStream_t stream);

// Additive (Bahdanau) scores over contiguous tensors, float32 accumulation:
//   scores[b, q, k] = Σ_j weight[j]·tanh(query_proj[b, q, j] + key_proj[b, k, j]).
template <typename T>
void additive_scores_forward(const T* query_proj, const T* key_proj, const T* weight,
                             int64_t batch, int64_t len_q, int64_t len_k, int64_t hidden,
                             T* scores, cudaStream_t stream);

// grad_weight_rows is float32 [batch·len_q, hidden]: each query row's share of the weight's
// gradient, summed by the caller.
template <typename T>
void additive_scores_backward(const T* grad_scores, const T* query_proj, const T* key_proj,
                              const T* weight, int64_t batch, int64_t len_q, int64_t len_k,
                              int64_t hidden, T* grad_query_proj, T* grad_key_proj,
                              float* grad_weight_rows, cudaStream_t stream);

}  // namespace attnlab::cuda
