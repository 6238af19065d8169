#pragma once
// The small attention kernels' bodies (cpu/attention/small_attention.h), included by small_attention.cpp
// (64-byte vectors, compiled per instruction set) and small_attention_avx2.cpp (32-byte vectors,
// for AVX2 CPUs without AVX-512). Everything here is inlined into those files' entry points.
//
// A group of rows is one vector's lanes (L = kLanes<T>: 16 or 8 floats); the keys, up to
// K = kSmallKeys<T> (16 floats), are one vector each, so with 32-byte vectors K = 2·L and the
// transposes between keys and rows go a square block of L keys at a time.

// The helpers (vec_lanes.h) pass vectors by value; they are all inlined into the per-ISA
// entry points, so the note that such an ABI differs between instruction sets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/isa/isa.h"
#include "cpu/attention/dropout.h"
#include "cpu/attention/small_attention.h"
#include "cpu/isa/vec_lanes.h"
#include "cpu/isa/vec_math.h"

namespace attnlab::cpu {
namespace {

// Both directions hold a group of up to L query rows in the lanes of a vector: one vector per
// key carries that key's score (probability, gradient) for every row of the group. The softmax
// over the keys is then a run of whole-vector operations with no reductions across lanes (the
// earlier row-per-vector layout needed two lane-tree reductions per row, for the maxima and the
// sums), and the group's log-sum-exps and deltas are one vector each. Products take Qᵀ or dOᵀ
// (in-register transposes of the group's rows) against K's or V's elements broadcast straight
// from memory. O = P·V and dQ = dS·K are accumulated as rows, with P's (dS's) elements
// broadcast from the stored vectors against V's (K's) rows; the optional weights, dS and dP
// come back to rows through in-register transposes. One thread, (16 rows, 16 keys, 32
// features): forward 0.58 µs against 0.72, backward 1.15 µs against 1.25 in the row-per-vector
// layout (benchmarks/small_kernel_cpu.sh --len 16 --dim 32).

// st[g][j0 + t] = Σ_e k[j0 + t, e]·qt[g][e] for the NK keys from j0 and G groups of rows
// (keys past `last` repeat it: finite padding whose scores are not read), one accumulator
// chain per key and group: each Qᵀ vector loaded serves NK keys, each key element broadcast
// from memory serves the G groups.
template <typename T, int NK, int G = 1>
ATTNLAB_INLINE void key_scores_pass(const Vec<T>* const (&qt)[G], int64_t dim_qk, const T* k,
                                    int64_t ldk, int64_t j0, int64_t last,
                                    Vec<T>* const (&st)[G]) {
  const T* key[NK];
  for (int t = 0; t < NK; ++t) key[t] = k + std::min<int64_t>(j0 + t, last) * ldk;
  Vec<T> acc[G][NK];
  for (int g = 0; g < G; ++g) {
    for (int t = 0; t < NK; ++t) acc[g][t] = Vec<T>{};
  }
  for (int64_t e = 0; e < dim_qk; ++e) {
    Vec<T> qe[G];
    for (int g = 0; g < G; ++g) qe[g] = qt[g][e];
    for (int t = 0; t < NK; ++t) {
      const T w = key[t][e];
      for (int g = 0; g < G; ++g) acc[g][t] += w * qe[g];
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int t = 0; t < NK; ++t) st[g][j0 + t] = acc[g][t];
  }
}

// key_scores_pass with two accumulator chains per key (even and odd features), added at the
// end: 2·NK chains, for passes whose NK keys alone are too few chains to hide the
// multiply-add's latency.
template <typename T, int NK>
ATTNLAB_INLINE void key_scores_pass_split(const Vec<T>* qt, int64_t dim_qk, const T* k,
                                          int64_t ldk, int64_t j0, int64_t last, Vec<T>* st) {
  const T* key[NK];
  for (int t = 0; t < NK; ++t) key[t] = k + std::min<int64_t>(j0 + t, last) * ldk;
  Vec<T> acc[2][NK];
  for (int t = 0; t < NK; ++t) acc[0][t] = acc[1][t] = Vec<T>{};
  int64_t e = 0;
  for (; e + 2 <= dim_qk; e += 2) {
    const Vec<T> q0 = qt[e], q1 = qt[e + 1];
    for (int t = 0; t < NK; ++t) {
      acc[0][t] += key[t][e] * q0;
      acc[1][t] += key[t][e + 1] * q1;
    }
  }
  if (e < dim_qk) {
    for (int t = 0; t < NK; ++t) acc[0][t] += key[t][e] * qt[e];
  }
  for (int t = 0; t < NK; ++t) st[j0 + t] = acc[0][t] + acc[1][t];
}

// st[j] = Σ_e k[j, e]·qt[e] for every key j < len_k: passes of eight keys (four for a last
// pass of at most four); st has room for kSmallKeys<T> vectors. In 32-byte vectors, up to 12
// keys take split passes of six (and four): 12 chains, where eight and four left a pass of at
// most four keys latency-bound. At (8 rows, 10 keys, 64 features) the AVX2 forward is 13 %
// faster; at 16 keys the split passes (6 + 6 + 4) were 1 % slower than 8 + 8, and in 64-byte
// vectors one pass of 12 (10 keys) or 16 keys was no faster or 5 % slower.
template <typename T>
ATTNLAB_INLINE void key_scores(const Vec<T>* qt, int64_t dim, const T* k, int64_t ldk,
                               int64_t len_k, Vec<T>* st) {
  if (ATTNLAB_VECTOR_BYTES == 32 && len_k <= 12) {
    int64_t j0 = 0;
    for (; len_k - j0 > 4; j0 += 6) {
      key_scores_pass_split<T, 6>(qt, dim, k, ldk, j0, len_k - 1, st);
    }
    if (j0 < len_k) key_scores_pass_split<T, 4>(qt, dim, k, ldk, j0, len_k - 1, st);
    return;
  }
  for (int64_t j0 = 0; j0 < len_k; j0 += len_k - j0 > 4 ? 8 : 4) {
    if (len_k - j0 > 4) {
      key_scores_pass<T, 8>({qt}, dim, k, ldk, j0, len_k - 1, {st});
    } else {
      key_scores_pass<T, 4>({qt}, dim, k, ldk, j0, len_k - 1, {st});
    }
  }
}

// The scores of two groups of rows at once (st0 from qt0, st1 from qt1), in passes of six
// keys (four for the last) of key_scores_pass over both groups: 12 accumulator chains. The
// 32-byte forward takes it for more than 12 keys, where a group's rows are half a head of 16:
// at (16 rows, 16 keys, 32 features) 5 % faster than each group's own passes of 8 + 8 keys.
template <typename T>
ATTNLAB_INLINE void key_scores_pair(const Vec<T>* qt0, const Vec<T>* qt1, int64_t dim,
                                    const T* k, int64_t ldk, int64_t len_k, Vec<T>* st0,
                                    Vec<T>* st1) {
  int64_t j0 = 0;
  for (; len_k - j0 > 4; j0 += 6) {
    key_scores_pass<T, 6, 2>({qt0, qt1}, dim, k, ldk, j0, len_k - 1, {st0, st1});
  }
  if (j0 < len_k) key_scores_pass<T, 4, 2>({qt0, qt1}, dim, k, ldk, j0, len_k - 1, {st0, st1});
}

// out[i, :] = Σ_j pt[j][i]·v[j, :] for the first `group` rows (ld_out apart): straight into
// rows, P's elements broadcast from pt against V's row vectors, eight rows and two vectors of
// columns at a time (small_key_sums with rows in place of keys). Accumulating Oᵀ instead (rows
// in lanes, V's elements broadcast) needed a transpose back to rows: 2 % slower forward.
template <typename T>
ATTNLAB_INLINE void weighted_rows(const Vec<T>* pt, int64_t len_k, const T* v, int64_t ldv,
                                  int64_t dim_v, int64_t group, T* out, int64_t ld_out) {
  small_key_sums<T>(reinterpret_cast<const T*>(pt), len_k, group, v, ldv, dim_v, T(1), out,
                    ld_out);
}

// The first `group` rows of the kSmallKeys<T> vectors x (one per key, rows in lanes) as rows
// of len_k values (stride ld): the transposes back of the weights, dS and dP, a square block
// of L keys at a time.
template <typename T>
ATTNLAB_INLINE void store_key_vectors_as_rows(const Vec<T>* x, int64_t len_k, int64_t group,
                                              T* dst, int64_t ld) {
  constexpr int64_t L = kLanes<T>;
  static_assert(kSmallKeys<T> % L == 0);
  for (int64_t j0 = 0; j0 < len_k; j0 += L) {
    alignas(64) Vec<T> block[L];
    std::memcpy(block, x + j0, sizeof(block));
    transpose_block<T>(block);
    const int64_t n = std::min(L, len_k - j0);
    for (int64_t i = 0; i < group; ++i) store_part(dst + i * ld + j0, block[i], n);
  }
}

// dt[j] for j < len_k: lane i holds D of row row0 + i and key j, 0 where dropout drops the
// weight and 1/(1 − p) where it keeps it (dropout.h).
template <typename T>
ATTNLAB_INLINE void dropout_vectors(const Dropout& d, int64_t row0, int64_t len_k, Vec<T>* dt) {
  constexpr int64_t L = kLanes<T>;
  uint32_t keys[L];
  for (int64_t i = 0; i < L; ++i) keys[i] = dropout_row_key(d.seed, row0 + i);
  const uint32_t threshold = d.threshold();
  const T kept = static_cast<T>(d.kept_scale());
  for (int64_t j = 0; j < len_k; j += 2) {  // one hash per lane for keys j and j + 1
    alignas(64) T low[L], high[L];
#pragma omp simd
    for (int64_t i = 0; i < L; ++i) {
      const uint32_t h = dropout_hash(keys[i], j >> 1);
      low[i] = (h & 0xFFFFu) >= threshold ? kept : T(0);
      high[i] = (h >> 16) >= threshold ? kept : T(0);
    }
    std::memcpy(&dt[j], low, sizeof(low));
    if (j + 1 < len_k) std::memcpy(&dt[j + 1], high, sizeof(high));
  }
}

// Lane i of a group from row r0 sees the keys j < result[i], for a causal limit
// clamp(visible_base + r0 + i, 0, len_k) (clamped loosely: only j < len_k are compared).
template <typename T>
ATTNLAB_INLINE Vec<T> visible_keys(int64_t visible_base, int64_t r0, int64_t len_k) {
  constexpr int64_t L = kLanes<T>;
  return lane_index<T>() + static_cast<T>(std::clamp<int64_t>(visible_base + r0, -L, len_k));
}

template <typename T>
ATTNLAB_INLINE void small_attention_rows_impl(int64_t rows, int64_t len_k, int64_t dim_qk,
                                              int64_t dim_v, const T* q, int64_t ldq,
                                              const T* k, int64_t ldk, const T* v, int64_t ldv,
                                              const T* mask, int64_t mask_ld,
                                              int64_t visible_base, T scale, T* out,
                                              int64_t ld_out, T* lse, T* weights,
                                              int64_t ld_weights,
                                              const Dropout* dropout, int64_t dropout_row0) {
  constexpr int64_t L = kLanes<T>;
  constexpr int64_t K = kSmallKeys<T>;
  static_assert(K % 8 == 0);  // key_scores' passes of eight
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  const Vec<T> lane = lane_index<T>();
  const auto max_op = [](Vec<T> a, Vec<T> b) { return a > b ? a : b; };

  alignas(64) Vec<T> st_buf[2][K];
  bool next_ready = false;  // st_buf[1] holds this group's scores
  for (int64_t r0 = 0; r0 < rows; r0 += L) {
    const int64_t group = std::min(L, rows - r0);
    Vec<T>* st = st_buf[next_ready ? 1 : 0];
    if (next_ready) {
      next_ready = false;
    } else {
      // qt[e]: feature e of the group's rows, one row per lane (zeros past the group).
      alignas(64) Vec<T> qt[kSmallAttentionMaxDim];
      transpose_rows(q + r0 * ldq, ldq, group, dim_qk, qt);
      if (ATTNLAB_VECTOR_BYTES == 32 && len_k > 12 && r0 + L < rows) {
        alignas(64) Vec<T> qt1[kSmallAttentionMaxDim];
        transpose_rows(q + (r0 + L) * ldq, ldq, std::min(L, rows - r0 - L), dim_qk, qt1);
        key_scores_pair(qt, qt1, dim_qk, k, ldk, len_k, st, st_buf[1]);
        next_ready = true;
      } else {
        key_scores(qt, dim_qk, k, ldk, len_k, st);
      }
    }
    // The mask as Qᵀ: mt[j] holds key j's mask entry of every row.
    alignas(64) Vec<T> mt[K];
    if (mask) transpose_rows(mask + r0 * mask_ld, mask_ld, group, len_k, mt);
    const Vec<T> visible = visible_keys<T>(visible_base, r0, len_k);
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
    alignas(64) Vec<T> pt[K];
    for (int64_t j = 0; j < K; ++j) pt[j] = j < len_k ? st[j] * inv_sums : Vec<T>{};
    const bool undropped = dropout && dropout->weights_undropped;
    if (weights && undropped) {
      store_key_vectors_as_rows(pt, len_k, group, weights + r0 * ld_weights, ld_weights);
    }
    if (dropout) {  // P ⊙ D, the weights P·V takes and returns
      alignas(64) Vec<T> dt[K];
      dropout_vectors<T>(*dropout, dropout_row0 + r0, len_k, dt);
      for (int64_t j = 0; j < len_k; ++j) pt[j] *= dt[j];
    }
    weighted_rows(pt, len_k, v, ldv, dim_v, group, out + r0 * ld_out, ld_out);
    if (weights && !undropped) {
      store_key_vectors_as_rows(pt, len_k, group, weights + r0 * ld_weights, ld_weights);
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
      std::fill(out + r * ld_out, out + r * ld_out + dim_v, has_nan ? kNaN : T(0));
      lse[r] = has_nan ? kNaN : kNegInf;
      if (weights) {
        T* wr = weights + r * ld_weights;
        std::fill(wr, wr + len_k, T(0));
        if (has_nan) std::fill(wr, wr + n_visible, kNaN);
      }
    }
  }
}

// The backward in the forward's layout: per group of up to L query rows (one per lane), one
// vector per key of Pᵀ (recomputed as exp(scale·Qᵀ·K + mask − lse), or the forward's weights
// transposed), dPᵀ = dOᵀ·V, delta = Σ_j Pᵀ[j] ⊙ dPᵀ[j], dSᵀ = Pᵀ ⊙ (dPᵀ − delta) and dQ = dS·K
// through its transpose; dK and dV sum over every row at the end from the stored Pᵀ and
// scale·dSᵀ. delta is the row term dO_i·O_i of the softmax gradient, taken here as Σ_j P_ij·dP_ij
// (the same sum, as O_i = Σ_j P_ij·V_j): whole vectors already in registers, where dO·O needed
// a separate pass over the rows with a reduction across lanes for each.
template <typename T>
ATTNLAB_INLINE void small_attention_backward_impl(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q, int64_t ldq,
    const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask, int64_t mask_ld,
    int64_t visible_base, T scale, const T* dout, int64_t ld_dout, const T* lse, const T* probs,
    T* dq, int64_t ld_dq, T* dk, int64_t ld_dk, T* dv, int64_t ld_dv, T* dmask, T* dweights,
    const Dropout* dropout, int64_t dropout_row0) {
  constexpr int64_t L = kLanes<T>;
  constexpr int64_t K = kSmallKeys<T>;
  constexpr int64_t kRows = kSmallBackwardMaxRows;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  // pt_all[j][i] = P[i, j] and ds_all[j][i] = scale·dS[i, j] of every row, for dV and dK.
  alignas(64) T pt_all[K][kRows];
  alignas(64) T ds_all[K][kRows];
  for (int64_t r0 = 0; r0 < len_q; r0 += L) {
    const int64_t group = std::min(L, len_q - r0);
    alignas(64) Vec<T> pt[K];
    if (probs) {
      transpose_rows(probs + r0 * len_k, len_k, group, len_k, pt);
    } else {
      alignas(64) Vec<T> qt[kSmallAttentionMaxDim];
      transpose_rows(q + r0 * ldq, ldq, group, dim_qk, qt);
      key_scores(qt, dim_qk, k, ldk, len_k, pt);
      alignas(64) Vec<T> mt[K];
      if (mask) transpose_rows(mask + r0 * mask_ld, mask_ld, group, len_k, mt);
      const Vec<T> l = load_part(lse + r0, group);
      // A row that saw no key (lse −inf) has P = 0 throughout.
      const Vec<T> visible = l == kNegInf ? T(0) : visible_keys<T>(visible_base, r0, len_k);
      for (int64_t j = 0; j < len_k; ++j) {
        Vec<T> s = pt[j] * scale;
        if (mask) s = mt[j] == kNegInf ? kNegInf : s + mt[j];
        pt[j] = static_cast<T>(j) < visible ? exp_nonpositive_vec(s - l) : T(0);
      }
    }
    // dPᵀ[j] = Σ_c v[j, c]·dOᵀ[c], then dSᵀ = Pᵀ ⊙ (dPᵀ − delta).
    alignas(64) Vec<T> dpt[K];
    {
      alignas(64) Vec<T> dot[kSmallAttentionMaxDim];
      transpose_rows(dout + r0 * ld_dout, ld_dout, group, dim_v, dot);
      key_scores(dot, dim_v, v, ldv, len_k, dpt);
    }
    if (dweights) store_key_vectors_as_rows(dpt, len_k, group, dweights + r0 * len_k, len_k);
    // With dropout dPᵀ is the gradient at the weights used, P ⊙ D: D ⊙ dPᵀ is P's, and dV
    // takes P ⊙ D (the delta below stays Σ_j P·D·dP = dO·O).
    alignas(64) Vec<T> dt[K];
    if (dropout) {
      dropout_vectors<T>(*dropout, dropout_row0 + r0, len_k, dt);
      for (int64_t j = 0; j < len_k; ++j) dpt[j] *= dt[j];
    }
    Vec<T> d = {};
    for (int64_t j = 0; j < len_k; ++j) d += pt[j] * dpt[j];
    alignas(64) Vec<T> dst[K];
    for (int64_t j = 0; j < K; ++j) dst[j] = j < len_k ? pt[j] * (dpt[j] - d) : Vec<T>{};
    if (dmask) store_key_vectors_as_rows(dst, len_k, group, dmask + r0 * len_k, len_k);
    for (int64_t j = 0; j < K; ++j) {
      if (j >= len_k) pt[j] = Vec<T>{};
      if (dropout && j < len_k) pt[j] *= dt[j];
      dst[j] *= scale;
      std::memcpy(pt_all[j] + r0, &pt[j], sizeof(pt[j]));
      std::memcpy(ds_all[j] + r0, &dst[j], sizeof(dst[j]));
    }
    // dQ = scale·dS·K.
    weighted_rows(dst, len_k, k, ldk, dim_qk, group, dq + r0 * ld_dq, ld_dq);
  }
  // dK_j = scale·Σ_i dS_ij·Q_i and dV_j = Σ_i P_ij·dO_i.
  small_key_sums<T, 1, kRows, K>(ds_all[0], len_q, len_k, q, ldq, dim_qk, T(1), dk, ld_dk);
  small_key_sums<T, 1, kRows, K>(pt_all[0], len_q, len_k, dout, ld_dout, dim_v, T(1), dv, ld_dv);
}

// The head sizes of the tutorials' models (32 and 64, equal for queries and values) as
// compile-time constants: every helper is inlined, so each call below is its own copy of the
// kernel in which the loops over the features have constant counts (unrolled, no remainder
// vectors) and the rows' strides fold into the addresses. Other sizes take the general copy.
template <typename T>
ATTNLAB_INLINE void small_attention_rows_sized(int64_t rows, int64_t len_k, int64_t dim_qk,
                                               int64_t dim_v, const T* q, int64_t ldq,
                                               const T* k, int64_t ldk, const T* v, int64_t ldv,
                                               const T* mask, int64_t mask_ld,
                                               int64_t visible_base, T scale, T* out,
                                               int64_t ld_out, T* lse, T* weights,
                                               int64_t ld_weights,
                                               const Dropout* dropout, int64_t dropout_row0) {
  if (dim_qk == 32 && dim_v == 32) {
    small_attention_rows_impl<T>(rows, len_k, 32, 32, q, ldq, k, ldk, v, ldv, mask, mask_ld,
                                 visible_base, scale, out, ld_out, lse, weights, ld_weights,
                                 dropout, dropout_row0);
  } else if (dim_qk == 64 && dim_v == 64) {
    small_attention_rows_impl<T>(rows, len_k, 64, 64, q, ldq, k, ldk, v, ldv, mask, mask_ld,
                                 visible_base, scale, out, ld_out, lse, weights, ld_weights,
                                 dropout, dropout_row0);
  } else {
    small_attention_rows_impl<T>(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,
                                 mask_ld, visible_base, scale, out, ld_out, lse, weights,
                                 ld_weights, dropout, dropout_row0);
  }
}

template <typename T>
ATTNLAB_INLINE void small_attention_backward_sized(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q, int64_t ldq,
    const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask, int64_t mask_ld,
    int64_t visible_base, T scale, const T* dout, int64_t ld_dout, const T* lse, const T* probs,
    T* dq, int64_t ld_dq, T* dk, int64_t ld_dk, T* dv, int64_t ld_dv, T* dmask, T* dweights,
    const Dropout* dropout, int64_t dropout_row0) {
  if (dim_qk == 32 && dim_v == 32) {
    small_attention_backward_impl<T>(len_q, len_k, 32, 32, q, ldq, k, ldk, v, ldv, mask,
                                     mask_ld, visible_base, scale, dout, ld_dout, lse, probs,
                                     dq, ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights,
                                     dropout, dropout_row0);
  } else if (dim_qk == 64 && dim_v == 64) {
    small_attention_backward_impl<T>(len_q, len_k, 64, 64, q, ldq, k, ldk, v, ldv, mask,
                                     mask_ld, visible_base, scale, dout, ld_dout, lse, probs,
                                     dq, ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights,
                                     dropout, dropout_row0);
  } else {
    small_attention_backward_impl<T>(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,
                                     mask_ld, visible_base, scale, dout, ld_dout, lse, probs,
                                     dq, ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights,
                                     dropout, dropout_row0);
  }
}

}  // namespace
}  // namespace attnlab::cpu

// The float entry points ROWS and BACKWARD (small_attention_rows' and
// small_attention_backward's parameters) with attribute ATTR: the kernels above, inlined into
// each, for the instruction sets the including file compiles them for.
#define ATTNLAB_SMALL_ATTENTION_FLOAT_KERNELS(ATTR, ROWS, BACKWARD)                            \
  ATTR void ROWS(int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v, const float* q,   \
                 int64_t ldq, const float* k, int64_t ldk, const float* v, int64_t ldv,        \
                 const float* mask, int64_t mask_ld, int64_t visible_base, float scale,        \
                 float* out, int64_t ld_out, float* lse, float* weights, int64_t ld_weights,   \
                 const Dropout* dropout, int64_t dropout_row0) {                               \
    small_attention_rows_sized(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,       \
                               mask_ld, visible_base, scale, out, ld_out, lse, weights,        \
                               ld_weights, dropout, dropout_row0);                             \
  }                                                                                            \
  ATTR void BACKWARD(int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,              \
                     const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v, \
                     int64_t ldv, const float* mask, int64_t mask_ld, int64_t visible_base,    \
                     float scale, const float* dout, int64_t ld_dout, const float* lse,        \
                     const float* probs, float* dq, int64_t ld_dq, float* dk, int64_t ld_dk,   \
                     float* dv, int64_t ld_dv, float* dmask, float* dweights,                  \
                     const Dropout* dropout, int64_t dropout_row0) {                           \
    small_attention_backward_sized(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,  \
                                   mask_ld, visible_base, scale, dout, ld_dout, lse, probs, dq,\
                                   ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights, dropout,      \
                                   dropout_row0);                                              \
  }
