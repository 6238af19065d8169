#pragma once
// CUDA scaled dot-product attention over raw device pointers. The operator layer
// (cuda/ops.cpp) validates, broadcasts and lays out the tensors; these launchers only compute,
// on the stream they are given. Plain C++: included by host code and by the .cu files.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/sdpa_problem.h"

namespace attnlab::cuda {

// Outputs are contiguous at the flattened batch: output [batch, len_q, dim_v] (T),
// logsumexp [batch, len_q] (float32), weights [batch, len_q, len_k] (T, may be null).
// A query with every key masked gets zeros, zero weights and logsumexp −inf.
template <typename T, int kHead>
void sdpa_forward(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                  cudaStream_t stream);

// The same forward on tensor cores, FlashAttention-2-style (mma.sync, ldmatrix, cp.async;
// sm_80+), for T = __half or __nv_bfloat16 and dim_qk == dim_v == kHead ∈ {64, 128}, without
// mask. Needs unit column strides and 16-byte-aligned rows (pointers, row and batch strides):
// see tensor_core_kernels_apply. Blocks of 4 warps of 32 query rows at kHead = 64 and of 16 at
// kHead = 128, or with block_warps = 8, blocks of 8 warps of 16 rows. weights (may be null): as
// sdpa_forward's, written by a second pass over the keys.
template <typename T, int kHead>
void sdpa_forward_flash(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                        int block_warps, cudaStream_t stream);

// The backward on tensor cores under the same conditions (grad_output too: unit column stride,
// 16-byte-aligned rows); outputs as sdpa_backward's, without grad_mask. grad_query_accum is
// float32 scratch of [batch, len_q, kHead], zero on entry.
template <typename T, int kHead>
void sdpa_backward_flash(const SdpaProblem& p, const MatrixOperand& grad_output, const T* output,
                         const float* logsumexp, float* delta, float* grad_query_accum,
                         T* grad_query, T* grad_key, T* grad_value, cudaStream_t stream);

// Gradients at the flattened batch, contiguous, written (not accumulated): grad_query
// [batch, len_q, dim_qk], grad_key [batch, len_k, dim_qk], grad_value [batch, len_k, dim_v];
// grad_mask (float32 [batch, len_q, len_k], may be null) receives the scores' gradient.
// row_scratch is float32 scratch of 3·batch·len_q (each query row's max, 1/sum and delta, found
// again from the scores: the forward's log-sum-exp is not read, see sdpa_generic.cuh).
// grad_output is indexed like the query.
template <typename T, int kHead>
void sdpa_backward(const SdpaProblem& p, const MatrixOperand& grad_output, float* row_scratch,
                   T* grad_query, T* grad_key, T* grad_value, float* grad_mask,
                   cudaStream_t stream);

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
