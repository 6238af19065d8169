#pragma once
// Elementwise math written so that GCC vectorizes it inside ATTNLAB_ISA_CLONES functions.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/isa/isa.h"

namespace attnlab::cpu {

// The polynomial cores of exp_nonpositive and log_positive below, shared with their whole-vector
// versions (vec_lanes.h): F is float or a vector of floats, so both compute the same formulas.
//
// exp(xc) without the 2^n scale: xc = n·ln2 + r with |r| <= ln2/2, exp(r) from a degree-7
// polynomial (Cephes' expf coefficients). shifted receives xc/ln2 + 1.5·2^23, whose low mantissa
// bits hold the integer n: adding 1.5·2^23 rounds to the nearest integer (std::floor would not
// vectorize inside target_clones functions).
template <typename F>
ATTNLAB_INLINE F exp_reduced(F xc, F& shifted) {
  constexpr float kRound = 12582912.0f;
  shifted = xc * 1.44269504088896341f + kRound;
  const F n = shifted - kRound;
  F r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  // The polynomial in Estrin's scheme (pairs of terms combined with r² and r⁴): four dependent
  // operations after r where Horner's rule took eight. Worst relative error over [−87, 0]
  // 1.2e-7 (Horner's: 8.3e-8); the AVX2 small forward at (16 rows, 16 keys, 32 features)
  // 2.5 % faster, the AVX-512 one 1–2 %.
  const F r2 = r * r;
  const F a = r * 1.6666665459e-1f + 5.0000001201e-1f;
  const F b = r * 8.3334519073e-3f + 4.1665795894e-2f;
  const F c = r * 1.9875691500e-4f + 1.3981999507e-3f;
  const F p = (c * r2 + b) * r2 + a;
  return p * r2 + (r + 1.0f);
}

// log(m·2^e) for m in [√½, √2): log(1 + f) for f = m − 1 from a degree-9 polynomial (Cephes'
// logf coefficients), e·ln2 added in two parts.
template <typename F>
ATTNLAB_INLINE F log_from_parts(F m, F e) {
  const F f = m - 1.0f;
  const F z = f * f;
  F p = f * 7.0376836292e-2f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const F y = f * z * p + e * -2.12194440e-4f - 0.5f * z;
  return f + y + e * 0.693359375f;
}

// exp(x) for x <= 0 in float, branch-free so that it vectorizes: x = n·ln2 + r with |r| <= ln2/2,
// exp(r) from a degree-7 polynomial (Cephes' expf coefficients), 2^n from the exponent bits.
// Relative error about 2e-7. Results below the normal range (x < -87.3, -inf included) are 0:
// their exponent bits clamp to 0. NaN stays NaN.
ATTNLAB_INLINE float exp_nonpositive(float x) {
  const float xc = std::max(x, -100.0f);  // keeps n small; NaN passes through
  constexpr int32_t kRoundBits = 0x4B400000;  // the bits of kRound (exp_reduced)
  float shifted;
  const float y = exp_reduced(xc, shifted);
  int32_t n_bits;
  std::memcpy(&n_bits, &shifted, sizeof(n_bits));
  const int32_t bits = std::max(n_bits - kRoundBits + 127, 0) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return y * two_n;
}
ATTNLAB_INLINE double exp_nonpositive(double x) { return std::exp(x); }

// log(x) for positive normal x in float, branch-free so that it vectorizes: x = m·2^e with m in
// [√½, √2), log(1 + f) for f = m − 1 from a degree-9 polynomial (Cephes' logf coefficients), e·ln2
// added in two parts. Relative error about 1e-7. +inf and NaN are returned as they are; zero,
// negative and subnormal x are outside its domain (the softmax sums it takes are >= 1).
ATTNLAB_INLINE float log_positive(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const int32_t mantissa_bits = (bits & 0x007fffff) | 0x3f800000;
  float m;
  std::memcpy(&m, &mantissa_bits, sizeof(m));  // in [1, 2)
  const bool upper = m > 1.41421356237f;
  m = upper ? 0.5f * m : m;
  const float e = static_cast<float>((bits >> 23) - 127 + (upper ? 1 : 0));
  const float y = log_from_parts(m, e);
  return x == x && x < std::numeric_limits<float>::infinity() ? y : x;
}
ATTNLAB_INLINE double log_positive(double x) { return std::log(x); }

// tanh(x) = sign(x)·(1 − e)/(1 + e) with e = exp(−2|x|) ∈ (0, 1]: branch-free, exact in its
// limits (±1 for large |x|). Absolute error about 1e-7 (relative error grows as |x| → 0,
// where 1 − e cancels; the additive scores sum many such terms, so absolute error is what
// matters).
ATTNLAB_INLINE float tanh_vectorizable(float x) {
  const float e = exp_nonpositive(-2.0f * std::fabs(x));
  return std::copysign((1.0f - e) / (1.0f + e), x);
}
ATTNLAB_INLINE double tanh_vectorizable(double x) { return std::tanh(x); }

}  // namespace attnlab::cpu
