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

template <typename T>
ATTNLAB_INLINE void small_attention_rows_impl(int64_t rows, int64_t len_k, int64_t dim_qk,
                                              int64_t dim_v, const T* q, int64_t ldq,
                                              const T* k, int64_t ldk, const T* v, int64_t ldv,
                                              const T* mask, int64_t mask_ld,
                                              int64_t visible_base, T scale, T* out, T* lse,
                                              T* weights, int64_t ld_weights) {
  constexpr int64_t L = kLanes<T>;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  // kt[e]: feature e of every key, one key per lane (Kᵀ by in-register transposes).
  alignas(64) Vec<T> kt[kSmallAttentionMaxDim];
  for (int64_t e0 = 0; e0 < dim_qk; e0 += L) {
    const int64_t cols = std::min(L, dim_qk - e0);
    Vec<T> block[L];
    for (int64_t j = 0; j < L; ++j) block[j] = j < len_k ? load_part(k + j * ldk + e0, cols) : Vec<T>{};
    transpose_block<T>(block);
    for (int64_t c = 0; c < cols; ++c) kt[e0 + c] = block[c];
  }
  // vp[j·value_vectors + c]: value row j in whole vectors, zero-padded.
  const int64_t value_vectors = (dim_v + L - 1) / L;
  alignas(64) Vec<T> vp[kSmallAttentionMaxDim];  // len_k·value_vectors <= L·(256 / L)
  for (int64_t j = 0; j < len_k; ++j) {
    for (int64_t c = 0; c < value_vectors; ++c) {
      vp[j * value_vectors + c] = load_part(v + j * ldv + c * L, std::min(L, dim_v - c * L));
    }
  }
  Vec<T> lane = {};
  for (int64_t j = 0; j < L; ++j) lane[j] = static_cast<T>(j);
  const auto max_op = [](Vec<T> a, Vec<T> b) { return a > b ? a : b; };
  const auto sum_op = [](Vec<T> a, Vec<T> b) { return a + b; };

  // Rows go four at a time: four independent multiply-add chains hide the FMA latency that a
  // single row's chain (one accumulator over the features) would wait on, and each key and
  // value vector loaded serves four rows.
  constexpr int64_t kGroup = 4;
  for (int64_t r0 = 0; r0 < rows; r0 += kGroup) {
    const int64_t group = std::min(kGroup, rows - r0);
    const T* qr[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) qr[i] = q + std::min(r0 + i, rows - 1) * ldq;
    Vec<T> s[kGroup] = {};
    for (int64_t e = 0; e < dim_qk; ++e) {
      const Vec<T> key = kt[e];
      for (int64_t i = 0; i < kGroup; ++i) s[i] += qr[i][e] * key;
    }
    alignas(64) T p[kGroup][L];
    bool row_live[kGroup];
    // The rows' maxima and sums; their logs are taken together after the group, in one vector.
    T row_maxima[kGroup] = {}, sums[kGroup] = {T(1), T(1), T(1), T(1)};
    for (int64_t i = 0; i < group; ++i) {
      const int64_t r = r0 + i;
      Vec<T> si = s[i] * scale;
      if (mask) {
        // A −inf mask entry hides the key whatever its score (NaN included).
        const Vec<T> m = load_part(mask + r * mask_ld, len_k);
        si = m == kNegInf ? kNegInf : si + m;
      }
      const int64_t visible = std::clamp<int64_t>(visible_base + r, 0, len_k);
      si = lane < static_cast<T>(visible) ? si : kNegInf;
      // The max skips NaN; a NaN score still reaches the sum below and makes the row NaN.
      const T row_max = reduce_lanes<T>(si == si ? si : kNegInf, max_op);
      T* w = weights ? weights + r * ld_weights : nullptr;
      row_live[i] = row_max != kNegInf;
      if (!row_live[i]) {
        const bool has_nan = reduce_lanes<T>(si != si ? Vec<T>{} + 1 : Vec<T>{}, max_op) > 0;
        std::fill(out + r * dim_v, out + (r + 1) * dim_v, has_nan ? kNaN : T(0));
        lse[r] = has_nan ? kNaN : kNegInf;
        if (w) {
          std::fill(w, w + len_k, T(0));
          if (has_nan) std::fill(w, w + visible, kNaN);
        }
        std::fill(p[i], p[i] + L, T(0));
        continue;
      }
      std::memcpy(p[i], &si, sizeof(si));
      for (int64_t j = 0; j < L; ++j) p[i][j] = exp_nonpositive(p[i][j] - row_max);
      Vec<T> e;
      std::memcpy(&e, p[i], sizeof(e));
      const T sum = reduce_lanes<T>(e, sum_op);
      row_maxima[i] = row_max;
      sums[i] = sum;
      e *= T(1) / sum;
      std::memcpy(p[i], &e, sizeof(e));
      if (w) std::memcpy(w, p[i], len_k * sizeof(T));
    }
    T logs[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) logs[i] = log_positive(sums[i]);
    for (int64_t i = 0; i < group; ++i) {
      if (row_live[i]) lse[r0 + i] = row_maxima[i] + logs[i];
    }
    for (int64_t c = 0; c < value_vectors; ++c) {
      Vec<T> acc[kGroup] = {};
      for (int64_t j = 0; j < len_k; ++j) {
        const Vec<T> value = vp[j * value_vectors + c];
        for (int64_t i = 0; i < kGroup; ++i) acc[i] += p[i][j] * value;
      }
      const int64_t n = std::min(L, dim_v - c * L);
      for (int64_t i = 0; i < group; ++i) {
        if (row_live[i]) std::memcpy(out + (r0 + i) * dim_v + c * L, &acc[i], n * sizeof(T));
      }
    }
  }
}

template <typename T>
ATTNLAB_INLINE void small_attention_backward_impl(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q, int64_t ldq,
    const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask, int64_t mask_ld,
    int64_t visible_base, T scale, const T* dout, int64_t ld_dout, const T* lse, const T* delta,
    const T* probs, T* dq, T* dk, T* dv, T* dmask, T* dweights) {
  constexpr int64_t L = kLanes<T>;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
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
  Vec<T> lane = {};
  for (int64_t j = 0; j < L; ++j) lane[j] = static_cast<T>(j);

  constexpr int64_t kGroup = 4;  // independent chains, as in the forward
  for (int64_t r0 = 0; r0 < len_q; r0 += kGroup) {
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
      Vec<T> s[kGroup] = {};
      for (int64_t e = 0; e < dim_qk; ++e) {
        const Vec<T> key = kt[e];
        for (int64_t i = 0; i < kGroup; ++i) s[i] += qr[i][e] * key;
      }
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
        alignas(64) T e[L];
        std::memcpy(e, &si, sizeof(e));
        for (int64_t j = 0; j < L; ++j) e[j] = exp_nonpositive(e[j] - l);
        std::memcpy(&prob[i], e, sizeof(e));
        prob[i] = lane < static_cast<T>(visible) ? prob[i] : T(0);
      }
    }
    // dP_i = dO_i·Vᵀ over the keys, then dS_i = P_i ⊙ (dP_i − delta_i).
    Vec<T> dp[kGroup] = {};
    for (int64_t c = 0; c < dim_v; ++c) {
      const Vec<T> value = vt[c];
      for (int64_t i = 0; i < kGroup; ++i) dp[i] += dor[i][c] * value;
    }
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
    for (int64_t c = 0; c < qk_vectors; ++c) {
      Vec<T> acc[kGroup] = {};
      for (int64_t j = 0; j < len_k; ++j) {
        const Vec<T> key = kp[j * qk_vectors + c];
        for (int64_t i = 0; i < kGroup; ++i) acc[i] += ds[i][j] * key;
      }
      const int64_t n = std::min(L, dim_qk - c * L);
      for (int64_t i = 0; i < group; ++i) store_part(dq + (r0 + i) * dim_qk + c * L, acc[i] * scale, n);
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
