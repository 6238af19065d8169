#pragma once
// Whole-vector helpers of the register-resident small kernels (small_attention.cpp,
// small_sparse_attention.cpp), for code compiled inside ATTNLAB_ISA_CLONES functions. They pass
// 64-byte vectors by value; all are inlined into the per-ISA clones (the including files turn
// off GCC's note that such an ABI differs between instruction sets).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/isa.h"
#include "cpu/vec_transpose.h"

namespace attnlab::cpu {
// Internal linkage: the helpers exist only inlined, and GCC notes an ABI change for 64-byte
// vector parameters of functions that could be called from elsewhere.
namespace {

// a rotated down by S lanes.
template <typename T, int S, int... I>
ATTNLAB_INLINE Vec<T> rotate(Vec<T> a, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, a, ((I + S) % static_cast<int>(kLanes<T>))...);
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

// Kᵀ (or Vᵀ) of up to one vector of rows: out[e] holds feature e of every row, one row per lane.
template <typename T>
ATTNLAB_INLINE void transpose_rows(const T* x, int64_t ld, int64_t n_rows, int64_t dim,
                                   Vec<T>* out) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t e0 = 0; e0 < dim; e0 += L) {
    const int64_t cols = std::min(L, dim - e0);
    Vec<T> block[L];
    for (int64_t j = 0; j < L; ++j) {
      block[j] = j < n_rows ? load_part(x + j * ld + e0, cols) : Vec<T>{};
    }
    transpose_block<T>(block);
    for (int64_t c = 0; c < cols; ++c) out[e0 + c] = block[c];
  }
}

// Row r of x as whole vectors, zero-padded: out[c] = x[r, c·L : (c + 1)·L].
template <typename T>
ATTNLAB_INLINE void row_vectors(const T* row, int64_t dim, Vec<T>* out) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t c = 0; c * L < dim; ++c) out[c] = load_part(row + c * L, std::min(L, dim - c * L));
}

// dst_j = factor·Σ_i coeff[i][j]·x_i for the keys j < len_k (rows of `dim` values, ld `ldx`):
// the small backwards' dK (coeff = dS, x = Q) and dV (coeff = P, x = dO). Four keys at a time,
// accumulated in registers over the len_q rows, so each row vector loaded serves four keys.
template <typename T>
ATTNLAB_INLINE void small_key_sums(const T (*coeff)[kLanes<T>], int64_t len_q, int64_t len_k,
                                   const T* x, int64_t ldx, int64_t dim, T factor, T* dst) {
  constexpr int64_t L = kLanes<T>;
  constexpr int64_t kKeys = 4;
  for (int64_t j0 = 0; j0 < len_k; j0 += kKeys) {
    const int64_t keys = std::min(kKeys, len_k - j0);
    for (int64_t c = 0; c * L < dim; ++c) {
      const int64_t n = std::min(L, dim - c * L);
      Vec<T> acc[kKeys] = {};
      for (int64_t i = 0; i < len_q; ++i) {
        const Vec<T> row = load_part(x + i * ldx + c * L, n);
        for (int64_t t = 0; t < kKeys; ++t) acc[t] += coeff[i][(j0 + t) % L] * row;
      }
      for (int64_t t = 0; t < keys; ++t) store_part(dst + (j0 + t) * dim + c * L, acc[t] * factor, n);
    }
  }
}

}  // namespace
}  // namespace attnlab::cpu
