#include "cpu/small_attention.h"

// The helpers (vec_lanes.h) pass 64-byte vectors by value; they are all inlined into the
// per-ISA clones, so the note that such an ABI differs between instruction sets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/isa.h"
#include "cpu/vec_math.h"
#include "cpu/vec_lanes.h"

namespace attnlab::cpu {
namespace {

// The multiply-add loops take rows in passes of eight: eight independent accumulator chains
// (one per row) cover the FMA latency twice over, and each key or value vector loaded serves
// eight rows.

// s[i] = Σ_e q[i, e]·kt[e] for the NR rows of q from first (rows past last repeat it: finite
// padding), one accumulator chain per row.
template <typename T, int NR>
ATTNLAB_INLINE void scores_pass(const T* q, int64_t ldq, int64_t first, int64_t last,
                                const Vec<T>* kt, int64_t dim_qk, Vec<T>* s) {
  constexpr int64_t L = kLanes<T>;
  // The rows copied to the stack, where one register addresses all of them (eight row
  // pointers did not fit in registers next to the rest of the kernel and were reloaded).
  alignas(64) T qs[NR][kSmallAttentionMaxDim];
  for (int64_t i = 0; i < NR; ++i) {
    const T* row = q + std::min(first + i, last) * ldq;
    for (int64_t e = 0; e < dim_qk; e += L) {
      store_part(qs[i] + e, load_part(row + e, std::min(L, dim_qk - e)), L);
    }
  }
  Vec<T> acc[NR];
  for (int64_t i = 0; i < NR; ++i) acc[i] = Vec<T>{};
  for (int64_t e = 0; e < dim_qk; ++e) {
    const Vec<T> key = kt[e];
    for (int64_t i = 0; i < NR; ++i) acc[i] += qs[i][e] * key;
  }
  for (int64_t i = 0; i < NR; ++i) s[i] = acc[i];
}

// out[i, c·L : (c + NC)·L] = Σ_j p[i][j]·vp[j·value_vectors + c + t] for the first n_rows <= NR
// rows of p (the others are computed from finite padding and not stored).
template <typename T, int NR, int NC>
ATTNLAB_INLINE void probs_times_values(const T (*p)[kLanes<T>], int64_t n_rows, int64_t len_k,
                                       const Vec<T>* vp, int64_t value_vectors, int64_t c,
                                       int64_t dim_v, T* out) {
  constexpr int64_t L = kLanes<T>;
  Vec<T> acc[NR][NC];
  for (int64_t i = 0; i < NR; ++i) {
    for (int t = 0; t < NC; ++t) acc[i][t] = Vec<T>{};  // (`= {}` became a `rep stos`)
  }
  for (int64_t j = 0; j < len_k; ++j) {
    Vec<T> value[NC];
    for (int t = 0; t < NC; ++t) value[t] = vp[j * value_vectors + c + t];
    for (int64_t i = 0; i < NR; ++i) {
      const T pij = p[i][j];
      for (int t = 0; t < NC; ++t) acc[i][t] += pij * value[t];
    }
  }
  // Over the constant NR with a guard: a variable trip count kept the accumulators in memory.
  for (int64_t i = 0; i < NR; ++i) {
    if (i >= n_rows) break;
    for (int t = 0; t < NC; ++t) {
      store_part(out + i * dim_v + (c + t) * L, acc[i][t], std::min(L, dim_v - (c + t) * L));
    }
  }
}

// P·V for the rows of p from i0, NR of them (n_rows stored), two value vectors at a time.
template <typename T, int NR>
ATTNLAB_INLINE void probs_times_values_rows(const T (*p)[kLanes<T>], int64_t n_rows,
                                            int64_t len_k, const Vec<T>* vp,
                                            int64_t value_vectors, int64_t dim_v, T* out) {
  int64_t c = 0;
  for (; c + 2 <= value_vectors; c += 2) {
    probs_times_values<T, NR, 2>(p, n_rows, len_k, vp, value_vectors, c, dim_v, out);
  }
  if (c < value_vectors) {
    probs_times_values<T, NR, 1>(p, n_rows, len_k, vp, value_vectors, c, dim_v, out);
  }
}

template <typename T>
ATTNLAB_INLINE void small_attention_rows_impl(int64_t rows, int64_t len_k, int64_t dim_qk,
                                              int64_t dim_v, const T* q, int64_t ldq,
                                              const T* k, int64_t ldk, const T* v, int64_t ldv,
                                              const T* mask, int64_t mask_ld,
                                              int64_t visible_base, T scale, T* out, T* lse,
                                              T* weights, int64_t ld_weights) {
  constexpr int64_t L = kLanes<T>;
  static_assert(L % 8 == 0);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  // kt[e]: feature e of every key, one key per lane (Kᵀ by in-register transposes).
  alignas(64) Vec<T> kt[kSmallAttentionMaxDim];
  transpose_rows(k, ldk, len_k, dim_qk, kt);
  // vp[j·value_vectors + c]: value row j in whole vectors, zero-padded.
  const int64_t value_vectors = (dim_v + L - 1) / L;
  alignas(64) Vec<T> vp[kSmallAttentionMaxDim];  // len_k·value_vectors <= L·(256 / L)
  for (int64_t j = 0; j < len_k; ++j) row_vectors(v + j * ldv, dim_v, vp + j * value_vectors);
  Vec<T> lane = {};
  for (int64_t j = 0; j < L; ++j) lane[j] = static_cast<T>(j);
  const auto max_op = [](Vec<T> a, Vec<T> b) { return a > b ? a : b; };
  const auto sum_op = [](Vec<T> a, Vec<T> b) { return a + b; };

  // Up to L rows at a time: scores, then the softmax of all of them with the per-row steps in
  // straight loops (no calls or early exits, so the rows' reductions and exponentials overlap)
  // and the maxima, sums, reciprocals and logs as one vector each, then P·V.
  for (int64_t r0 = 0; r0 < rows; r0 += L) {
    const int64_t group = std::min(L, rows - r0);
    // Rows in passes of eight (four for a last pass of at most four rows), padded up to
    // `padded`; rows past the group hold finite padding that is never stored.
    alignas(64) Vec<T> s[L];
    int64_t padded = 0;
    for (; padded < group; padded += group - padded > 4 ? 8 : 4) {
      if (group - padded > 4) {
        scores_pass<T, 8>(q, ldq, r0 + padded, r0 + group - 1, kt, dim_qk, s + padded);
      } else {
        scores_pass<T, 4>(q, ldq, r0 + padded, r0 + group - 1, kt, dim_qk, s + padded);
      }
    }
    alignas(64) T row_max[L] = {};
    for (int64_t i = 0; i < padded; ++i) {
      Vec<T> si = s[i] * scale;
      if (mask && i < group) {
        // A −inf mask entry hides the key whatever its score (NaN included).
        const Vec<T> m = load_part(mask + (r0 + i) * mask_ld, len_k);
        si = m == kNegInf ? kNegInf : si + m;
      }
      const int64_t visible = std::clamp<int64_t>(visible_base + r0 + i, 0, len_k);
      si = lane < static_cast<T>(visible) ? si : kNegInf;
      s[i] = si;
      // The max skips NaN; a NaN score still reaches the sum below and makes the row NaN.
      row_max[i] = reduce_lanes<T>(si == si ? si : kNegInf, max_op);
    }
    Vec<T> maxima;
    std::memcpy(&maxima, row_max, sizeof(maxima));
    // Rows that see no key (max −inf) are finished apart below; 0 keeps their arithmetic quiet.
    const Vec<T> shift = maxima == kNegInf ? T(0) : maxima;
    alignas(64) T row_sum[L];
    std::fill(row_sum + padded, row_sum + L, T(1));
    for (int64_t i = 0; i < padded; ++i) {
      s[i] = exp_nonpositive_vec(s[i] - shift[i]);
      row_sum[i] = reduce_lanes<T>(s[i], sum_op);
    }
    Vec<T> sums;
    std::memcpy(&sums, row_sum, sizeof(sums));
    const Vec<T> inv_sums = T(1) / sums;
    const Vec<T> row_lse = maxima + log_positive_vec(sums);
    store_part(lse + r0, row_lse, group);
    alignas(64) T p[L][L];
    for (int64_t i = 0; i < padded; ++i) {
      const Vec<T> pi = s[i] * inv_sums[i];
      std::memcpy(p[i], &pi, sizeof(pi));
      if (weights && i < group) store_part(weights + (r0 + i) * ld_weights, pi, len_k);
    }
    for (int64_t i0 = 0; i0 < group; i0 += 8) {
      const int64_t n_rows = std::min<int64_t>(8, group - i0);
      T* o = out + (r0 + i0) * dim_v;
      if (n_rows > 4) {
        probs_times_values_rows<T, 8>(p + i0, n_rows, len_k, vp, value_vectors, dim_v, o);
      } else {
        probs_times_values_rows<T, 4>(p + i0, n_rows, len_k, vp, value_vectors, dim_v, o);
      }
    }
    // A row that sees no key gets zeros and lse −inf, or NaN when one of its scores was NaN.
    for (int64_t i = 0; i < group; ++i) {
      if (row_max[i] != kNegInf) continue;
      const int64_t r = r0 + i;
      const int64_t visible = std::clamp<int64_t>(visible_base + r, 0, len_k);
      // s[i] now holds exp(score): NaN exactly where the masked score was NaN.
      const bool has_nan = reduce_lanes<T>(s[i] != s[i] ? Vec<T>{} + 1 : Vec<T>{}, max_op) > 0;
      std::fill(out + r * dim_v, out + (r + 1) * dim_v, has_nan ? kNaN : T(0));
      lse[r] = has_nan ? kNaN : kNegInf;
      if (weights) {
        T* w = weights + r * ld_weights;
        std::fill(w, w + len_k, T(0));
        if (has_nan) std::fill(w, w + visible, kNaN);
      }
    }
  }
}

// What small_attention_backward_impl's row groups read and write.
template <typename T>
struct SmallBackwardRows {
  int64_t len_q, len_k, dim_qk, dim_v;
  const T* q;
  int64_t ldq;
  const T* mask;
  int64_t mask_ld, visible_base;
  T scale;
  const T* dout;
  int64_t ld_dout;
  const T *lse, *delta, *probs;
  T *dq, *dmask, *dweights;
  const Vec<T>*kt, *vt, *kp;  // Kᵀ, Vᵀ and K's rows as vectors
  T (*ds_all)[kLanes<T>];     // dS and P of every row
  T (*p_all)[kLanes<T>];
};

// Rows r0 .. r0 + kGroup of the small backward (those past len_q repeat the last row and are
// not stored): P, dP = dO·Vᵀ, dS = P ⊙ (dP − delta) and dQ = scale·dS·K, one accumulator
// chain per row. A function templated on the group size: a templated lambda in its place made
// the backward four times slower (most likely because a lambda inside an ISA clone is a
// function of its own, without the clone's instruction set, that GCC did not inline).
template <typename T, int64_t kGroup>
ATTNLAB_INLINE void small_backward_row_group(const SmallBackwardRows<T>& st, int64_t r0) {
  constexpr int64_t L = kLanes<T>;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t len_q = st.len_q, len_k = st.len_k, dim_qk = st.dim_qk, dim_v = st.dim_v;
  const int64_t ldq = st.ldq, mask_ld = st.mask_ld, visible_base = st.visible_base;
  const int64_t ld_dout = st.ld_dout;
  const T scale = st.scale;
  const T *q = st.q, *mask = st.mask, *dout = st.dout, *lse = st.lse, *delta = st.delta;
  const T* probs = st.probs;
  T *dq = st.dq, *dmask = st.dmask, *dweights = st.dweights;
  const Vec<T>*kt = st.kt, *vt = st.vt, *kp = st.kp;
  T(*ds_all)[L] = st.ds_all;
  T(*p_all)[L] = st.p_all;
  Vec<T> lane = {};
  for (int64_t j = 0; j < L; ++j) lane[j] = static_cast<T>(j);
  const int64_t group = std::min(kGroup, len_q - r0);
  const T* qr[kGroup];
  const T* dor[kGroup];
  for (int64_t i = 0; i < kGroup; ++i) {
    const int64_t r = std::min(r0 + i, len_q - 1);
    qr[i] = q + r * ldq;
    dor[i] = dout + r * ld_dout;
  }
  // P: the forward's, or exp(scale·q·kᵀ + mask − lse) on the visible keys.
  Vec<T> prob[kGroup];
  if (probs) {
    for (int64_t i = 0; i < kGroup; ++i) {
      prob[i] = load_part(probs + std::min(r0 + i, len_q - 1) * len_k, len_k);
    }
  } else {
    Vec<T> s[kGroup];
    group_row_products<T, kGroup>(qr, kt, dim_qk, s);
    for (int64_t i = 0; i < kGroup; ++i) {
      const int64_t r = std::min(r0 + i, len_q - 1);
      const T l = lse[r];
      Vec<T> si = s[i] * scale;
      if (mask) {
        const Vec<T> m = load_part(mask + r * mask_ld, len_k);
        si = m == kNegInf ? kNegInf : si + m;
      }
      const int64_t visible =
          l == kNegInf ? 0 : std::clamp<int64_t>(visible_base + r, 0, len_k);
      si = lane < static_cast<T>(visible) ? si : kNegInf;
      prob[i] = exp_nonpositive_vec(si - l);
      prob[i] = lane < static_cast<T>(visible) ? prob[i] : T(0);
    }
  }
  // dP_i = dO_i·Vᵀ over the keys, then dS_i = P_i ⊙ (dP_i − delta_i).
  Vec<T> dp[kGroup];
  group_row_products<T, kGroup>(dor, vt, dim_v, dp);
  alignas(64) T ds[kGroup][L];
  for (int64_t i = 0; i < kGroup; ++i) {
    const int64_t r = std::min(r0 + i, len_q - 1);
    const Vec<T> dsi = prob[i] * (dp[i] - delta[r]);
    std::memcpy(ds[i], &dsi, sizeof(dsi));
    if (i < group) {
      std::memcpy(ds_all[r], &dsi, sizeof(dsi));
      std::memcpy(p_all[r], &prob[i], sizeof(prob[i]));
      if (dweights) store_part(dweights + r * len_k, dp[i], len_k);
      if (dmask) store_part(dmask + r * len_k, dsi, len_k);
    }
  }
  // dQ_i = scale·Σ_j dS_ij·K_j
  group_query_grads<T, kGroup>(ds, kp, len_k, dim_qk, scale, group, dq + r0 * dim_qk);
}

template <typename T>
ATTNLAB_INLINE void small_attention_backward_impl(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q, int64_t ldq,
    const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask, int64_t mask_ld,
    int64_t visible_base, T scale, const T* dout, int64_t ld_dout, const T* lse, const T* delta,
    const T* probs, T* dq, T* dk, T* dv, T* dmask, T* dweights) {
  constexpr int64_t L = kLanes<T>;
  const int64_t qk_vectors = (dim_qk + L - 1) / L;
  alignas(64) Vec<T> kt[kSmallAttentionMaxDim];  // Kᵀ, to recompute the scores
  alignas(64) Vec<T> vt[kSmallAttentionMaxDim];  // Vᵀ: dP_i = Σ_c dO[i, c]·vt[c]
  alignas(64) Vec<T> kp[kSmallAttentionMaxDim];  // K's rows as vectors: dQ_i = Σ_j dS_ij·K_j
  // dS and P of every row, for dK and dV after the row loop.
  alignas(64) T ds_all[kSmallBackwardMaxRows][L];
  alignas(64) T p_all[kSmallBackwardMaxRows][L];
  if (!probs) transpose_rows(k, ldk, len_k, dim_qk, kt);
  transpose_rows(v, ldv, len_k, dim_v, vt);
  for (int64_t j = 0; j < len_k; ++j) row_vectors(k + j * ldk, dim_qk, kp + j * qk_vectors);

  // Rows in groups of eight independent chains (four for a last group of at most four rows,
  // whose padding would otherwise cost as much as the rows), as in the forward.
  const SmallBackwardRows<T> st{len_q, len_k, dim_qk, dim_v, q, ldq, mask, mask_ld,
                                visible_base, scale, dout, ld_dout, lse, delta, probs,
                                dq, dmask, dweights, kt, vt, kp, ds_all, p_all};
  for (int64_t r0 = 0; r0 < len_q; r0 += len_q - r0 > 4 ? 8 : 4) {
    if (len_q - r0 > 4) {
      small_backward_row_group<T, 8>(st, r0);
    } else {
      small_backward_row_group<T, 4>(st, r0);
    }
  }
  // dK_j = scale·Σ_i dS_ij·Q_i and dV_j = Σ_i P_ij·dO_i.
  small_key_sums<T>(ds_all, len_q, len_k, q, ldq, dim_qk, scale, dk);
  small_key_sums<T>(p_all, len_q, len_k, dout, ld_dout, dim_v, T(1), dv);
}

}  // namespace

ATTNLAB_ISA_CLONES void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk,
                                             int64_t dim_v, const float* q, int64_t ldq,
                                             const float* k, int64_t ldk, const float* v,
                                             int64_t ldv, const float* mask, int64_t mask_ld,
                                             int64_t visible_base, float scale, float* out,
                                             float* lse, float* weights, int64_t ld_weights) {
  small_attention_rows_impl(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, mask_ld,
                            visible_base, scale, out, lse, weights, ld_weights);
}

ATTNLAB_ISA_CLONES void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk,
                                             int64_t dim_v, const double* q, int64_t ldq,
                                             const double* k, int64_t ldk, const double* v,
                                             int64_t ldv, const double* mask, int64_t mask_ld,
                                             int64_t visible_base, double scale, double* out,
                                             double* lse, double* weights, int64_t ld_weights) {
  small_attention_rows_impl(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, mask_ld,
                            visible_base, scale, out, lse, weights, ld_weights);
}

ATTNLAB_ISA_CLONES void small_attention_backward(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const float* q, int64_t ldq,
    const float* k, int64_t ldk, const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
    int64_t visible_base, float scale, const float* dout, int64_t ld_dout, const float* lse,
    const float* delta, const float* probs, float* dq, float* dk, float* dv, float* dmask, float* dweights) {
  small_attention_backward_impl(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,
                                mask_ld, visible_base, scale, dout, ld_dout, lse, delta, probs,
                                dq, dk, dv, dmask, dweights);
}

ATTNLAB_ISA_CLONES void small_attention_backward(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const double* q, int64_t ldq,
    const double* k, int64_t ldk, const double* v, int64_t ldv, const double* mask, int64_t mask_ld,
    int64_t visible_base, double scale, const double* dout, int64_t ld_dout, const double* lse,
    const double* delta, const double* probs, double* dq, double* dk, double* dv, double* dmask, double* dweights) {
  small_attention_backward_impl(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,
                                mask_ld, visible_base, scale, dout, ld_dout, lse, delta, probs,
                                dq, dk, dv, dmask, dweights);
}

}  // namespace attnlab::cpu
