#pragma once
// Sparsemax, entmax-1.5 and α-entmax attention when every key fits in one vector (L_k <= 16 in float, 8
// in double): the tutorials' shapes (L = 10 or 16). As small_attention.h does for softmax, the
// scores of a few query rows, their threshold, P and S stay in registers, instead of the
// blocked path's GEMM, row and GEMM calls, whose per-call costs exceed the arithmetic at these
// sizes. Same results and conventions as the blocked path (attention_kernel.h, sparse_rows.h): exact
// zeros, −inf mask entries hide their key, a row that sees no key gets zeros and τ = +inf, a
// row with a NaN or +inf score is NaN (τ NaN).
//
// The threshold over at most one vector of values y_j = (α − 1)·(z_j − max z) is found without
// a sort: for each j, the keys at or above y_j (ties together) form a candidate support, and
// j is in the support exactly when that candidate's own threshold lies below y_j (for
// sparsemax 1 + k_j·y_j > Σ_{i: y_i ≥ y_j} y_i; for entmax-1.5 the same test on the closed-form
// threshold). All the candidates' counts and sums come from one pass of lane-wise compares;
// τ is then solved in double on the support found. Any other α (α-entmax) solves
// Σ_j [c_j − τ]_+^{1/(α−1)} = 1 as the blocked path does (Newton steps inside a bisection
// bracket, in double, to the same tolerance), each step over the whole row in double vectors
// (the powers from branch-free exp and log lanes).

#include <cstdint>

#include "cpu/attention/small_attention.h"

namespace attnlab::cpu {

// Whether the small sparse kernels take a problem of this size and normalizer.
template <typename T>
constexpr bool small_sparse_fits(double alpha, int64_t len_k, int64_t dim_qk, int64_t dim_v) {
  return alpha > 1.0 && len_k > 0 &&
         small_attention_fits<T>(len_k, dim_qk, dim_v);
}

// rows query rows q (row stride ldq) against len_k keys k (ldk) and values v (ldv), alpha 2
// (sparsemax), 1.5 (entmax-1.5) or any other alpha > 1 (α-entmax): out[r, :] = P_r·V and
// support_value[r, :] = S_r·V/ΣS_r
// (row stride dim_v), tau[r] the threshold (as in attention_forward). mask (nullable):
// additive rows with stride mask_ld. Row r sees keys j < clamp(visible_base + r, 0, len_k)
// (kAllVisible: all). weights (nullable, row stride ld_weights) receives P over the len_k keys.
void small_sparse_rows(double alpha, int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                       const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                       int64_t ldv, const float* mask, int64_t mask_ld, int64_t visible_base,
                       float scale, float* out, float* tau, float* support_value,
                       float* weights, int64_t ld_weights);
void small_sparse_rows(double alpha, int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                       const double* q, int64_t ldq, const double* k, int64_t ldk,
                       const double* v, int64_t ldv, const double* mask, int64_t mask_ld,
                       int64_t visible_base, double scale, double* out, double* tau,
                       double* support_value, double* weights, int64_t ld_weights);

// The gradients of one batch entry (all len_q <= kSmallBackwardMaxRows query rows) under the
// same conditions: dq [len_q, dim_qk], dk [len_k, dim_qk] and dv [len_k, dim_v] are written
// (not accumulated); dmask (nullable, [len_q, len_k]) receives dZ. tau is the forward's;
// delta[i] = dO_i·U_i with U its support_value; probs (nullable, row stride len_k) are the
// forward's weights, read instead of recomputing P from tau. visible_base as above for the
// first row.
void small_sparse_backward(double alpha, int64_t len_q, int64_t len_k, int64_t dim_qk,
                           int64_t dim_v, const float* q, int64_t ldq, const float* k,
                           int64_t ldk, const float* v, int64_t ldv, const float* mask,
                           int64_t mask_ld, int64_t visible_base, float scale, const float* dout,
                           int64_t ld_dout, const float* tau, const float* delta,
                           const float* probs, float* dq, float* dk, float* dv, float* dmask);
void small_sparse_backward(double alpha, int64_t len_q, int64_t len_k, int64_t dim_qk,
                           int64_t dim_v, const double* q, int64_t ldq, const double* k,
                           int64_t ldk, const double* v, int64_t ldv, const double* mask,
                           int64_t mask_ld, int64_t visible_base, double scale,
                           const double* dout, int64_t ld_dout, const double* tau,
                           const double* delta, const double* probs, double* dq, double* dk,
                           double* dv, double* dmask);

}  // namespace attnlab::cpu
