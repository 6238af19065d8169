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

// The forward holds a group of up to L query rows in the lanes of a vector: one vector per key
// carries that key's score for every row of the group. The softmax over the keys is then a run
// of whole-vector operations with no reductions across lanes (the row-per-vector layout needed
// two lane-tree reductions per row, the maxima and the sums, which cost as much as a third of
// the multiply-adds). The scores come from Qᵀ (in-register transposes) against K's elements,
// the log-sum-exps of the group are one vector, and P·V broadcasts each P[i, j] from the stored
// Pᵀ, so only the weights (when asked for) are transposed back to rows.

// st[t] = Σ_e ks[j0 + t][e]·qt[e] for the NK keys from j0 of the stack copy ks (zero rows past
// the last key), one accumulator chain per key: each Qᵀ vector loaded serves NK keys, and the
// key elements are broadcast from memory at constant offsets of one base register.
template <typename T, int NK>
ATTNLAB_INLINE void key_scores_pass(const Vec<T>* qt, int64_t dim_qk, const T* k, int64_t ldk,
                                    int64_t j0, int64_t last, Vec<T>* st) {
  const T* key[NK];
  for (int t = 0; t < NK; ++t) key[t] = k + std::min<int64_t>(j0 + t, last) * ldk;
  Vec<T> acc[NK];
  for (int t = 0; t < NK; ++t) acc[t] = Vec<T>{};
  for (int64_t e = 0; e < dim_qk; ++e) {
    const Vec<T> qe = qt[e];
    for (int t = 0; t < NK; ++t) acc[t] += key[t][e] * qe;
  }
  for (int t = 0; t < NK; ++t) st[j0 + t] = acc[t];
}

// ot[c + t] = Σ_j v[j, c + t]·pt[j] for the NC value columns from c: column c + t of the
// group's output rows, one row per lane, with V's elements broadcast from memory.
template <typename T, int NC>
ATTNLAB_INLINE void values_pass(const Vec<T>* pt, int64_t len_k, const T* v, int64_t ldv,
                                int64_t c, Vec<T>* ot) {
  Vec<T> acc[NC];
  for (int t = 0; t < NC; ++t) acc[t] = Vec<T>{};  // (`= {}` became a `rep stos`)
  for (int64_t j = 0; j < len_k; ++j) {
    const Vec<T> p = pt[j];
    const T* row = v + j * ldv + c;
    for (int t = 0; t < NC; ++t) acc[t] += row[t] * p;
  }
  for (int t = 0; t < NC; ++t) ot[c + t] = acc[t];
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
  // Keys in passes of eight (four for a last pass of at most four keys), padded up to
  // padded_keys with zero rows whose scores are never read.
  int64_t padded_keys = 0;
  while (padded_keys < len_k) padded_keys += len_k - padded_keys > 4 ? 8 : 4;
  Vec<T> lane = {};
  for (int64_t j = 0; j < L; ++j) lane[j] = static_cast<T>(j);
  const auto max_op = [](Vec<T> a, Vec<T> b) { return a > b ? a : b; };

  for (int64_t r0 = 0; r0 < rows; r0 += L) {
    const int64_t group = std::min(L, rows - r0);
    // qt[e]: feature e of the group's rows, one row per lane (zeros past the group).
    alignas(64) Vec<T> qt[kSmallAttentionMaxDim];
    transpose_rows(q + r0 * ldq, ldq, group, dim_qk, qt);
    alignas(64) Vec<T> st[L];
    for (int64_t j0 = 0; j0 < padded_keys; j0 += padded_keys - j0 > 4 ? 8 : 4) {
      if (padded_keys - j0 > 4) {
        key_scores_pass<T, 8>(qt, dim_qk, k, ldk, j0, len_k - 1, st);
      } else {
        key_scores_pass<T, 4>(qt, dim_qk, k, ldk, j0, len_k - 1, st);
      }
    }
    // The mask as Qᵀ: mt[j] holds key j's mask entry of every row.
    alignas(64) Vec<T> mt[L];
    if (mask) transpose_rows(mask + r0 * mask_ld, mask_ld, group, len_k, mt);
    // Lane i sees keys j < visible[i] (clamped: only j < len_k are ever compared).
    const Vec<T> visible =
        lane + static_cast<T>(std::clamp<int64_t>(visible_base + r0, -L, len_k));
    Vec<T> maxima = Vec<T>{} + kNegInf;
    for (int64_t j = 0; j < len_k; ++j) {
      Vec<T> s = st[j] * scale;
      // A −inf mask entry hides the key whatever its score (NaN included).
      if (mask) s = mt[j] == kNegInf ? kNegInf : s + mt[j];
      s = static_cast<T>(j) < visible ? s : kNegInf;
      st[j] = s;
      // The max skips NaN; a NaN score still reaches the sum below and makes the row NaN.
      maxima = s > maxima ? s : maxima;
    }
    // Rows that see no key (max −inf) are finished apart below; 0 keeps their arithmetic quiet.
    const Vec<T> shift = maxima == kNegInf ? T(0) : maxima;
    Vec<T> sums = {};
    for (int64_t j = 0; j < len_k; ++j) {
      st[j] = exp_nonpositive_vec(st[j] - shift);
      sums += st[j];
    }
    const Vec<T> inv_sums = T(1) / sums;
    store_part(lse + r0, maxima + log_positive_vec(sums), group);
    // pt[j] = P[:, j] (keys past len_k zero, for the transpose of the weights).
    alignas(64) Vec<T> pt[L];
    for (int64_t j = 0; j < L; ++j) pt[j] = j < len_k ? st[j] * inv_sums : Vec<T>{};
    // Oᵀ in passes of 16 columns (then 8, 4 and 1), transposed back to rows L columns at a time.
    alignas(64) Vec<T> ot[kSmallAttentionMaxDim];
    int64_t c = 0;
    for (; c + 16 <= dim_v; c += 16) values_pass<T, 16>(pt, len_k, v, ldv, c, ot);
    for (; c + 8 <= dim_v; c += 8) values_pass<T, 8>(pt, len_k, v, ldv, c, ot);
    for (; c + 4 <= dim_v; c += 4) values_pass<T, 4>(pt, len_k, v, ldv, c, ot);
    for (; c < dim_v; ++c) values_pass<T, 1>(pt, len_k, v, ldv, c, ot);
    for (int64_t c0 = 0; c0 < dim_v; c0 += L) {
      Vec<T>* block = ot + c0;
      transpose_block<T>(block);
      const int64_t n = std::min(L, dim_v - c0);
      for (int64_t i = 0; i < group; ++i) store_part(out + (r0 + i) * dim_v + c0, block[i], n);
    }
    if (weights) {
      transpose_block<T>(pt);
      for (int64_t i = 0; i < group; ++i) {
        store_part(weights + (r0 + i) * ld_weights, pt[i], len_k);
      }
    }
    // A row that sees no key gets zeros and lse −inf, or NaN when one of its scores was NaN
    // (its sum is then NaN, and 0 otherwise).
    const Vec<T> unseen = (maxima == kNegInf) & (lane < static_cast<T>(group)) ? T(1) : T(0);
    if (reduce_lanes<T>(unseen, max_op) == T(0)) continue;
    for (int64_t i = 0; i < group; ++i) {
      if (unseen[i] == T(0)) continue;
      const int64_t r = r0 + i;
      const int64_t n_visible = std::clamp<int64_t>(visible_base + r, 0, len_k);
      const bool has_nan = sums[i] != sums[i];
      std::fill(out + r * dim_v, out + (r + 1) * dim_v, has_nan ? kNaN : T(0));
      lse[r] = has_nan ? kNaN : kNegInf;
      if (weights) {
        T* wr = weights + r * ld_weights;
        std::fill(wr, wr + len_k, T(0));
        if (has_nan) std::fill(wr, wr + n_visible, kNaN);
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
