#pragma once
// Whole-vector helpers of the register-resident small kernels (small_attention.cpp,
// small_sparse_attention.cpp), for code compiled inside ATTNLAB_ISA_CLONES functions. They pass
// 64-byte vectors by value; all are inlined into the per-ISA clones (the including files turn
// off GCC's note that such an ABI differs between instruction sets).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/isa/isa.h"
#include "cpu/isa/vec_math.h"
#include "cpu/isa/vec_transpose.h"

namespace attnlab::cpu {
// Internal linkage: the helpers exist only inlined, and GCC notes an ABI change for 64-byte
// vector parameters of functions that could be called from elsewhere.
namespace {

// a rotated down by S lanes.
template <typename T, int S, int... I>
ATTNLAB_INLINE Vec<T> rotate(Vec<T> a, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, a, ((I + S) % static_cast<int>(kLanes<T>))...);
}

// 0, 1, …, lanes − 1.
template <typename T>
ATTNLAB_INLINE Vec<T> lane_index() {
  Vec<T> lane = {};
  for (int64_t j = 0; j < kLanes<T>; ++j) lane[j] = static_cast<T>(j);
  return lane;
}

// op over all lanes, as a tree of rotations (every lane ends with the result).
template <typename T, typename Op>
ATTNLAB_INLINE T reduce_lanes(Vec<T> a, Op op) {
  constexpr auto lanes = std::make_integer_sequence<int, kLanes<T>>{};
  if constexpr (kLanes<T> >= 16) a = op(a, rotate<T, 8>(a, lanes));
  a = op(a, rotate<T, 4>(a, lanes));
  a = op(a, rotate<T, 2>(a, lanes));
  a = op(a, rotate<T, 1>(a, lanes));
  return a[0];
}

// exp_nonpositive and log_positive (vec_math.h) of a whole vector, written with vector
// operations so that they compile to vector instructions whatever the optimiser does with a
// loop over the lanes. The float versions are the scalar ones' formulas, lane by lane; the
// double ones call the scalar functions per lane.
typedef int32_t Int32Vec __attribute__((vector_size(ATTNLAB_VECTOR_BYTES)));

ATTNLAB_INLINE Vec<float> exp_nonpositive_vec(Vec<float> x) {
  const Vec<float> xc = x < -100.0f ? -100.0f : x;  // NaN passes through, as std::max
  constexpr int32_t kRoundBits = 0x4B400000;  // see exp_nonpositive
  Vec<float> shifted;
  const Vec<float> y = exp_reduced(xc, shifted);
  Int32Vec bits = reinterpret_cast<Int32Vec>(shifted) - (kRoundBits - 127);
  bits = bits > 0 ? bits : 0;
  return y * reinterpret_cast<Vec<float>>(bits << 23);
}
ATTNLAB_INLINE Vec<double> exp_nonpositive_vec(Vec<double> x) {
  for (int64_t j = 0; j < kLanes<double>; ++j) x[j] = exp_nonpositive(x[j]);
  return x;
}

ATTNLAB_INLINE Vec<float> log_positive_vec(Vec<float> x) {
  const Int32Vec bits = reinterpret_cast<Int32Vec>(x);
  Vec<float> m = reinterpret_cast<Vec<float>>((bits & 0x007fffff) | 0x3f800000);  // in [1, 2)
  const Int32Vec upper = m > 1.41421356237f;  // −1 where true
  m = upper ? 0.5f * m : m;
  const Vec<float> e = __builtin_convertvector((bits >> 23) - 127 - upper, Vec<float>);
  const Vec<float> y = log_from_parts(m, e);
  return (x == x) & (x < std::numeric_limits<float>::infinity()) ? y : x;
}
ATTNLAB_INLINE Vec<double> log_positive_vec(Vec<double> x) {
  for (int64_t j = 0; j < kLanes<double>; ++j) x[j] = log_positive(x[j]);
  return x;
}

// n <= lanes elements into a zeroed vector.
template <typename T>
ATTNLAB_INLINE Vec<T> load_part(const T* src, int64_t n) {
  Vec<T> v = {};
  if (n == kLanes<T>) {
    std::memcpy(&v, src, sizeof(v));
  } else {
    for (int64_t j = 0; j < kLanes<T>; ++j) {  // masked, as in store_part below
      if (j < n) v[j] = src[j];
    }
  }
  return v;
}

// The first n <= lanes elements of v: one vector store when whole, else a masked store (a
// memcpy of variable length became a `rep movs`, whose start-up cost more than the kernels'
// arithmetic at these sizes).
template <typename T>
ATTNLAB_INLINE void store_part(T* dst, const Vec<T>& v, int64_t n) {
  if (n == kLanes<T>) {
    std::memcpy(dst, &v, sizeof(v));
    return;
  }
  for (int64_t j = 0; j < kLanes<T>; ++j) {
    if (j < n) dst[j] = v[j];
  }
}

// Products of a group of G rows with vectors by feature: out[i] = Σ_c rows[i][c]·vecs[c] (the
// scores against Kᵀ, or dP = dO·Vᵀ against Vᵀ, one key per lane).
template <typename T, int64_t G>
ATTNLAB_INLINE void group_row_products(const T* const* rows, const Vec<T>* vecs, int64_t n,
                                       Vec<T>* out) {
  for (int64_t i = 0; i < G; ++i) out[i] = Vec<T>{};
  for (int64_t c = 0; c < n; ++c) {
    const Vec<T> v = vecs[c];
    for (int64_t i = 0; i < G; ++i) out[i] += rows[i][c] * v;
  }
}

// dQ of the first `group` rows of a group of G: row i of dq_rows (dim_qk apart) gets
// scale·Σ_j d[i][j]·K_j, with kp K's rows as whole vectors (zero-padded).
template <typename T, int64_t G>
ATTNLAB_INLINE void group_query_grads(const T (*d)[kLanes<T>], const Vec<T>* kp, int64_t len_k,
                                      int64_t dim_qk, T scale, int64_t group, T* dq_rows) {
  constexpr int64_t L = kLanes<T>;
  const int64_t qk_vectors = (dim_qk + L - 1) / L;
  for (int64_t c = 0; c < qk_vectors; ++c) {
    Vec<T> acc[G] = {};
    for (int64_t j = 0; j < len_k; ++j) {
      const Vec<T> key = kp[j * qk_vectors + c];
      for (int64_t i = 0; i < G; ++i) acc[i] += d[i][j] * key;
    }
    const int64_t n = std::min(L, dim_qk - c * L);
    for (int64_t i = 0; i < group; ++i) store_part(dq_rows + i * dim_qk + c * L, acc[i] * scale, n);
  }
}

// Kᵀ (or Vᵀ) of up to one vector of rows: out[e] holds feature e of every row, one row per lane.
template <typename T>
ATTNLAB_INLINE void transpose_rows(const T* x, int64_t ld, int64_t n_rows, int64_t dim,
                                   Vec<T>* out) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t e0 = 0; e0 < dim; e0 += L) {
    const int64_t cols = std::min(L, dim - e0);
    // A whole block is transposed in place in out; a partial one through a local block (out
    // has room for dim vectors only). Copying a whole block out of a local one took a
    // `rep movs`, whose start-up cost as much as the transpose.
    Vec<T> partial[L];
    Vec<T>* block = cols == L ? out + e0 : partial;
    for (int64_t j = 0; j < L; ++j) {
      block[j] = j < n_rows ? load_part(x + j * ld + e0, cols) : Vec<T>{};
    }
    transpose_block<T>(block);
    if (cols < L) {
      for (int64_t c = 0; c < cols; ++c) out[e0 + c] = partial[c];
    }
  }
}

// Row r of x as whole vectors, zero-padded: out[c] = x[r, c·L : (c + 1)·L].
template <typename T>
ATTNLAB_INLINE void row_vectors(const T* row, int64_t dim, Vec<T>* out) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t c = 0; c * L < dim; ++c) out[c] = load_part(row + c * L, std::min(L, dim - c * L));
}

// One pass of small_key_sums below: keys j0 .. j0 + KJ (the first `keys` stored) over the
// value vectors c .. c + NC, KJ·NC accumulators in registers. coeff(i, j) = coeff[i·SI + j·SJ]
// (constant strides: one base register addresses every key's coefficient) for j < NJ; a pass's
// keys past the last read the coefficients of key j mod NJ, finite values never stored. The loops over the
// constant KJ and NC are unrolled by pragma: left to GCC, the guarded store loop kept the
// accumulators in a stack array, zeroed before and spilled after the row loop, and a pass at
// (16 rows, 16 keys, 32 features) took 680 cycles for its 512 multiply-adds instead of 565.
template <typename T, int64_t SI, int64_t SJ, int64_t NJ, int KJ, int NC>
ATTNLAB_INLINE void small_key_sums_pass(const T* coeff, int64_t len_q, int64_t j0,
                                        int64_t keys, const T* x, int64_t ldx, int64_t dim,
                                        int64_t c, T factor, T* dst, int64_t ld_dst) {
  constexpr int64_t L = kLanes<T>;
  int64_t n[NC];
  ATTNLAB_UNROLL for (int u = 0; u < NC; ++u) n[u] = std::min(L, dim - (c + u) * L);
  Vec<T> acc[KJ][NC];
  ATTNLAB_UNROLL for (int t = 0; t < KJ; ++t) {
    ATTNLAB_UNROLL for (int u = 0; u < NC; ++u) acc[t][u] = Vec<T>{};
  }
  for (int64_t i = 0; i < len_q; ++i) {
    Vec<T> row[NC];
    ATTNLAB_UNROLL for (int u = 0; u < NC; ++u) {
      row[u] = load_part(x + i * ldx + (c + u) * L, n[u]);
    }
    ATTNLAB_UNROLL for (int t = 0; t < KJ; ++t) {
      const T w = coeff[i * SI + ((j0 + t) % NJ) * SJ];
      ATTNLAB_UNROLL for (int u = 0; u < NC; ++u) acc[t][u] += w * row[u];
    }
  }
  ATTNLAB_UNROLL for (int t = 0; t < KJ; ++t) {
    if (t >= keys) break;
    ATTNLAB_UNROLL for (int u = 0; u < NC; ++u) {
      store_part(dst + (j0 + t) * ld_dst + (c + u) * L, acc[t][u] * factor, n[u]);
    }
  }
}

template <typename T, int64_t SI, int64_t SJ, int64_t NJ, int KJ>
ATTNLAB_INLINE void small_key_sums_keys(const T* coeff, int64_t len_q, int64_t j0,
                                        int64_t keys, const T* x, int64_t ldx, int64_t dim,
                                        T factor, T* dst, int64_t ld_dst) {
  constexpr int64_t L = kLanes<T>;
  const int64_t vectors = (dim + L - 1) / L;
  int64_t c = 0;
  for (; c + 2 <= vectors; c += 2) {
    small_key_sums_pass<T, SI, SJ, NJ, KJ, 2>(coeff, len_q, j0, keys, x, ldx, dim, c, factor, dst,
                                                  ld_dst);
  }
  if (c < vectors) {
    small_key_sums_pass<T, SI, SJ, NJ, KJ, 1>(coeff, len_q, j0, keys, x, ldx, dim, c, factor, dst,
                                                  ld_dst);
  }
}

// dst_j = factor·Σ_i coeff(i, j)·x_i for the keys j < len_k <= NJ (rows of `dim` values, ld
// `ldx`; dst's rows ld_dst apart):
// the small backwards' dK (coeff = dS, x = Q) and dV (coeff = P, x = dO). Eight keys (four for
// a last group of at most four) and two vectors of x at a time, accumulated in registers over
// the len_q rows, so each row vector loaded serves eight keys. With 32-byte vectors (16 ymm
// registers) four keys at a time: eight keys' 16 accumulators and the two row vectors would
// not fit.
template <typename T, int64_t SI = kLanes<T>, int64_t SJ = 1, int64_t NJ = kLanes<T>>
ATTNLAB_INLINE void small_key_sums(const T* coeff, int64_t len_q, int64_t len_k,
                                   const T* x, int64_t ldx, int64_t dim, T factor, T* dst,
                                   int64_t ld_dst) {
  constexpr int64_t kKeys = ATTNLAB_VECTOR_BYTES == 64 ? 8 : 4;
  for (int64_t j0 = 0; j0 < len_k; j0 += kKeys) {
    const int64_t keys = std::min<int64_t>(kKeys, len_k - j0);
    if (keys > 4) {
      small_key_sums_keys<T, SI, SJ, NJ, kKeys>(coeff, len_q, j0, keys, x, ldx, dim, factor,
                                                dst, ld_dst);
    } else {
      small_key_sums_keys<T, SI, SJ, NJ, 4>(coeff, len_q, j0, keys, x, ldx, dim, factor, dst,
                                            ld_dst);
    }
  }
}

}  // namespace
}  // namespace attnlab::cpu
