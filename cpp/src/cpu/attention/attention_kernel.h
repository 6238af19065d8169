#pragma once
// Scaled dot-product attention on the CPU, over raw pointers, for every normalizer: softmax,
// and the sparse ones (sparsemax, entmax-1.5, α-entmax; sparse_rows.h). The operator layer
// (ops/attention.cpp) broadcasts, validates and lays out the tensors; these functions only
// compute. One blocking, one set of masks, threads and dtypes: what differs per normalizer is
// the row step (softmax_rows.h, sparse_rows.h) and the small kernels' (small_attention.h,
// small_sparse_attention.h).
//
// For a sparse normalizer with α > 1, per query row with scores z_j (−inf where masked or
// hidden by the causal mask):
//   p_j = [(α − 1)·z_j − τ]_+^{1/(α − 1)},  τ such that Σ_j p_j = 1,
// and the backward needs s_j = p_j^{2 − α} on the support: dz_j = s_j·(dp_j − δ) with
// δ = dO·U, U = Σ_j s_j·v_j / Σ_j s_j, which the forward computes. Softmax is the limit α → 1,
// where s = p, U is the output itself and the row statistic is the log-sum-exp instead of τ.

#include <cstdint>

#include "cpu/attention/dropout.h"
#include "cpu/attention/weight_summary.h"

namespace attnlab::cpu {

// A batch of row-major matrices: element (b, row, col) is at
// data[offset[b] + row * row_stride + col]. Broadcast batch entries share offsets.
template <typename T>
struct BatchedRows {
  const T* data = nullptr;
  const int64_t* offset = nullptr;
  int64_t row_stride = 0;
  const T* row(int64_t b, int64_t r) const { return data + offset[b] + r * row_stride; }
};

// The same for outputs: entry b's row r at data + offset[b] + r * row_stride.
template <typename T>
struct OutputRows {
  T* data = nullptr;
  const int64_t* offset = nullptr;
  int64_t row_stride = 0;
  T* row(int64_t b, int64_t r) const { return data + offset[b] + r * row_stride; }
};

template <typename T>
struct AttentionProblem {
  int64_t batch = 0, len_q = 0, len_k = 0, dim_qk = 0, dim_v = 0;
  BatchedRows<T> query, key, value;
  BatchedRows<T> mask;  // additive [len_q, len_k] per batch entry; data == nullptr for none
  bool causal = false;  // query i sees keys j <= i
  T scale = 1;
  // The normalizer: 1 for softmax, 2 sparsemax, 1.5 entmax-1.5, any other α > 1 α-entmax.
  double alpha = 1;
  // The operands are bfloat16 values widened to T = float: the blocked paths' products may
  // then round their operands to bfloat16 (exact for Q, K, V and dO; P and dS rounded, as in
  // torch's bfloat16 kernels) and run on the CPU's bfloat16 dot products where it has them.
  bool bf16_operands = false;
  // Dropout on the weights (dropout.h): P·V takes P ⊙ D, D = keep/(1 − p) from the hash of
  // (seed, b·len_q + i, j); the backward remakes D. The returned weights are P ⊙ D, the ones
  // used. With it the blocked paths run at every size, and a sparse normalizer's U is
  // (S ⊙ D)·V/ΣS, so that δ = dO·U stays the row term.
  Dropout dropout;
  // float16 or bfloat16 inputs that attention_forward widens itself, one batch entry at a time
  // into per-thread buffers that stay in cache (T = float only, and only where
  // forward_widens_heads holds): query16/key16/value16 then hold the inputs' bits and
  // query/key/value are unused. Widening whole tensors first wrote and read back twice their
  // size in float32 (4.5 ms of a 30 ms float16 forward at (8, 8, 512, 64) on an Intel Xeon).
  // bfloat16 with bf16_operands on the AMX route, without weights, is not widened at all: its
  // rows go into the products' bfloat16 layouts as they are.
  enum class Narrow { none, float16, bfloat16 };
  Narrow narrow = Narrow::none;
  BatchedRows<uint16_t> query16, key16, value16;
};

// Whether attention_forward<float> can take float16/bfloat16 inputs itself
// (AttentionProblem::narrow) at these sizes: the blocked path on attnlab's AVX-512 GEMM.
bool forward_widens_heads(int64_t len_k, int64_t dim_qk, int64_t dim_v);

// output [batch, len_q, dim_v] and the row statistic [batch, len_q], contiguous: the
// log-sum-exp for softmax; for a sparse normalizer τ (+inf for a row that sees no key, so
// p = 0; NaN when the row's scores hold NaN or +inf, whose output is NaN), with
// support_value [batch, len_q, dim_v] = U (zeros for a row that sees no key). weights, when
// not null, receives the normalized attention [batch, len_q, len_k]. Memory beyond the outputs
// is O(block²) per thread for softmax, a query block × len_k per thread for the sparse
// normalizers (whose threshold needs a whole row). output16 (only for a narrow softmax
// problem, T = float): the output is written there instead, rounded to the inputs'
// float16/bfloat16 (output is then not used). summaries (with weights null, wide inputs): the
// weights of each block of query rows are reduced into them instead of written out.
template <typename T>
void attention_forward(const AttentionProblem<T>& p, T* output, T* row_stat, T* weights,
                       uint16_t* output16 = nullptr, T* support_value = nullptr,
                       const WeightSummaries<T>* summaries = nullptr);

// Gradients, contiguous at the broadcast batch shape, written (not accumulated):
// grad_query [batch, len_q, dim_qk], grad_key [batch, len_k, dim_qk],
// grad_value [batch, len_k, dim_v]; grad_mask, when not null, [batch, len_q, len_k] (the
// gradient of the scores, which an additive mask receives unchanged). row_values and row_stat
// are the forward's: its output and log-sum-exp for softmax, U and τ for a sparse normalizer
// (δ = dO·row_values in both). weights, when not null, are its normalized weights
// [batch, len_q, len_k], used instead of recomputing them (with dropout they are P ⊙ D, and
// only a softmax gradient of the weights reads them, unless Dropout::weights_undropped). grad_weights, when not null, receives
// the gradient with respect to the weights taken as free variables, dP = grad_output·valueᵀ
// [batch, len_q, len_k], at every position: masked ones and those the causal mask hides
// included.
// weights_grad, when not null (and then weights too), is a gradient arriving at the returned
// weights [batch, len_q, len_k]: it is added to dP before the normalizer's Jacobian, so the
// other gradients are those of a loss on the output and the weights together.
template <typename T>
void attention_backward(const AttentionProblem<T>& p, const BatchedRows<T>& grad_output,
                        const T* row_values, const T* row_stat, const T* weights, T* grad_query,
                        T* grad_key, T* grad_value, T* grad_mask, T* grad_weights,
                        const T* weights_grad = nullptr);

// Whether attention_forward writes the weights of a softmax problem of these sizes on the small
// kernels, which alone can keep them before dropout (Dropout::weights_undropped).
template <typename T>
bool weights_undropped_fit(int64_t len_k, int64_t dim_qk, int64_t dim_v);

// Whether attention_forward and attention_backward compute softmax problem p on the small
// kernels, whose rows stay in registers (every key in one vector, at most 256 query rows per batch entry, the
// inputs in T): the backward then never reads the forward's output, and the forms below take
// p, writing their outputs at any row layout (the encoder block's heads side by side in its
// token rows, where the contiguous forms needed copies).
template <typename T>
bool attention_is_small(const AttentionProblem<T>& p);

// attention_forward without weights, for p where attention_is_small: entry b's output row r at
// output.row(b, r); logsumexp [batch, len_q] contiguous.
template <typename T>
void attention_forward_rows(const AttentionProblem<T>& p, const OutputRows<T>& output,
                            T* logsumexp);

// attention_backward without weights or the mask's gradient, for p where attention_is_small,
// each gradient's rows where its OutputRows puts them.
template <typename T>
void attention_backward_rows(const AttentionProblem<T>& p, const BatchedRows<T>& grad_output,
                             const T* logsumexp, const OutputRows<T>& grad_query,
                             const OutputRows<T>& grad_key, const OutputRows<T>& grad_value);

}  // namespace attnlab::cpu
