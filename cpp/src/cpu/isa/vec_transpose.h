#pragma once
// In-register transpose of a square block of vectors, for code compiled inside
// ATTNLAB_ISA_CLONES functions (GCC lowers the shuffles to what each instruction set has).

#include <utility>

#include "cpu/isa/isa.h"

namespace attnlab::cpu {

// The transpose of a square block of vectors (kLanes<T> rows of kLanes<T> elements):
// log2(lanes) stages, each swapping the off-diagonal sub-blocks of one size between pairs of
// rows with two-source shuffles (one vpermt2ps each with AVX-512).
template <typename T, int B>
constexpr int low_half(int c) {
  return (c & B) ? static_cast<int>(kLanes<T>) + c - B : c;
}
template <typename T, int B>
constexpr int high_half(int c) {
  return (c & B) ? static_cast<int>(kLanes<T>) + c : c + B;
}
template <typename T, int B, int... I>
ATTNLAB_INLINE void transpose_stage(Vec<T>* r, std::integer_sequence<int, I...>) {
  for (int i = 0; i < kLanes<T>; ++i) {
    if (i & B) continue;
    const Vec<T> a = r[i], b = r[i + B];
    r[i] = __builtin_shufflevector(a, b, low_half<T, B>(I)...);
    r[i + B] = __builtin_shufflevector(a, b, high_half<T, B>(I)...);
  }
}
template <typename T>
ATTNLAB_INLINE void transpose_block(Vec<T>* r) {
  constexpr auto lanes = std::make_integer_sequence<int, kLanes<T>>{};
  if constexpr (kLanes<T> >= 16) transpose_stage<T, 8>(r, lanes);
  transpose_stage<T, 4>(r, lanes);
  transpose_stage<T, 2>(r, lanes);
  transpose_stage<T, 1>(r, lanes);
}

}  // namespace attnlab::cpu
