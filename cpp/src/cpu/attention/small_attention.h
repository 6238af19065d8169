#pragma once
// Attention for a block of query rows when every key fits in one vector (L_k <= 16 in float,
// 8 in double): the tutorials' shapes (L = 10 or 16). Scores, softmax and P·V stay in
// registers, a vector's width of query rows at a time (one row per lane), instead of going
// through the blocked path's GEMM, softmax and GEMM calls, whose per-call packing and row loops
// cost more than the arithmetic at these sizes.
// Same results and conventions as the blocked path (cpu/attention/attention_kernel.h, softmax_rows.h).

#include <cstdint>

#include "cpu/attention/dropout.h"

namespace attnlab::cpu {

// The most keys the kernels take: one 64-byte vector's lanes (16 floats, 8 doubles).
template <typename T>
constexpr int64_t kSmallKeys = 64 / sizeof(T);

// The largest head sizes the kernel takes (its packed K and V live on the stack).
constexpr int64_t kSmallAttentionMaxDim = 256;
// The most query rows small_attention_backward takes (one batch entry whole).
constexpr int64_t kSmallBackwardMaxRows = 256;

// Whether small_attention_rows takes a problem of this size.
template <typename T>
constexpr bool small_attention_fits(int64_t len_k, int64_t dim_qk, int64_t dim_v) {
  return len_k <= kSmallKeys<T> && dim_qk <= kSmallAttentionMaxDim &&
         dim_v <= kSmallAttentionMaxDim;
}

// rows query rows q (row stride ldq) against len_k keys k (ldk) and values v (ldv):
// out[r, :] (row stride ld_out) = softmax(scale·q_r·kᵀ + mask_r)·v, lse[r] its log-sum-exp.
// mask (nullable): additive rows with stride mask_ld. Row r sees keys
// j < clamp(visible_base + r, 0, len_k) (kAllVisible: all). weights (nullable, row stride
// ld_weights) receives the probabilities of the len_k keys. A row that sees no key gets zeros
// and lse −inf; NaN scores make the row NaN. dropout (nullable): P ⊙ D takes P's place in P·V
// and the weights (P stays in the weights with dropout->weights_undropped), D that of the rows
// dropout_row0 + r (dropout.h).
void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                          const float* q, int64_t ldq, const float* k, int64_t ldk,
                          const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                          int64_t visible_base, float scale, float* out, int64_t ld_out,
                          float* lse, float* weights, int64_t ld_weights,
                          const Dropout* dropout, int64_t dropout_row0);
void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                          const double* q, int64_t ldq, const double* k, int64_t ldk,
                          const double* v, int64_t ldv, const double* mask, int64_t mask_ld,
                          int64_t visible_base, double scale, double* out, int64_t ld_out,
                          double* lse, double* weights, int64_t ld_weights,
                          const Dropout* dropout, int64_t dropout_row0);

// The gradients of one batch entry (all len_q query rows) under the same conditions: dq
// [len_q, dim_qk], dk [len_k, dim_qk] and dv [len_k, dim_v], their rows ld_dq, ld_dk and ld_dv
// apart, are written (not accumulated);
// dmask and dweights (nullable, [len_q, len_k]) receive dS and dP = dO·Vᵀ. probs (nullable,
// row stride len_k) are the forward's probabilities P, recomputed from lse when null. visible_base as above for the first row (1 under the
// causal mask); dropout and dropout_row0 (the first row's) as the forward's.
void small_attention_backward(int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                              const float* q, int64_t ldq, const float* k, int64_t ldk,
                              const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                              int64_t visible_base, float scale, const float* dout,
                              int64_t ld_dout, const float* lse, const float* probs, float* dq,
                              int64_t ld_dq, float* dk, int64_t ld_dk, float* dv, int64_t ld_dv,
                              float* dmask, float* dweights,
                              const Dropout* dropout, int64_t dropout_row0);
void small_attention_backward(int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                              const double* q, int64_t ldq, const double* k, int64_t ldk,
                              const double* v, int64_t ldv, const double* mask, int64_t mask_ld,
                              int64_t visible_base, double scale, const double* dout,
                              int64_t ld_dout, const double* lse, const double* probs,
                              double* dq, int64_t ld_dq, double* dk, int64_t ld_dk, double* dv,
                              int64_t ld_dv, double* dmask, double* dweights,
                              const Dropout* dropout, int64_t dropout_row0);

// The float kernels in 32-byte vectors, compiled for AVX2 and FMA (small_attention_avx2.cpp):
// what the functions above run on CPUs with AVX2 but not AVX-512 (avx2_without_avx512,
// cpu/isa/isa.h). Callable only where the CPU has AVX2 and FMA.
namespace avx2 {
void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                          const float* q, int64_t ldq, const float* k, int64_t ldk,
                          const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                          int64_t visible_base, float scale, float* out, int64_t ld_out,
                          float* lse, float* weights, int64_t ld_weights,
                          const Dropout* dropout, int64_t dropout_row0);
void small_attention_backward(int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                              const float* q, int64_t ldq, const float* k, int64_t ldk,
                              const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                              int64_t visible_base, float scale, const float* dout,
                              int64_t ld_dout, const float* lse, const float* probs, float* dq,
                              int64_t ld_dq, float* dk, int64_t ld_dk, float* dv, int64_t ld_dv,
                              float* dmask, float* dweights,
                              const Dropout* dropout, int64_t dropout_row0);
}  // namespace avx2

}  // namespace attnlab::cpu
