#include "cpu/softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// Each entry point is compiled once per instruction set and picked at load time (GCC function
// multi-versioning), so the loops below vectorize with AVX-512 or AVX2 where the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNLAB_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATTNLAB_ISA_CLONES
#endif
#define ATTNLAB_INLINE inline __attribute__((always_inline))

namespace attnlab::cpu {
namespace {

// exp(x) for x <= 0 in float, branch-free so that it vectorizes: x = n·ln2 + r with |r| <= ln2/2,
// exp(r) from a degree-7 polynomial (Cephes' expf coefficients), 2^n from the exponent bits.
// Relative error about 2e-7. Results below the normal range (x < -87.3, -inf included) are 0:
// their exponent bits clamp to 0. NaN stays NaN.
ATTNLAB_INLINE float exp_nonpositive(float x) {
  const float xc = std::max(x, -100.0f);  // keeps n small; NaN passes through
  // Adding 1.5·2^23 rounds to the nearest integer and leaves it in the low mantissa bits
  // (std::floor would not vectorize inside target_clones functions).
  constexpr float kRound = 12582912.0f;
  constexpr int32_t kRoundBits = 0x4B400000;
  const float shifted = xc * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  int32_t n_bits;
  std::memcpy(&n_bits, &shifted, sizeof(n_bits));
  const int32_t bits = std::max(n_bits - kRoundBits + 127, 0) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return y * two_n;
}
ATTNLAB_INLINE double exp_nonpositive(double x) { return std::exp(x); }

ATTNLAB_INLINE int64_t visible_cols(int64_t visible_base, int64_t r, int64_t cols) {
  return std::clamp<int64_t>(visible_base + r, 0, cols);
}

template <typename T>
ATTNLAB_INLINE void online_softmax_block_impl(T* s, int64_t rows, int64_t cols, int64_t ld,
                                              const T* mask, int64_t mask_ld,
                                              int64_t visible_base, T* row_max, T* row_sum,
                                              T* correction) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* x = s + r * ld;
    const int64_t visible = visible_cols(visible_base, r, cols);
    if (mask) {
      const T* m = mask + r * mask_ld;
#pragma omp simd
      for (int64_t c = 0; c < visible; ++c) x[c] += m[c];
    }
    T block_max = kNegInf;
#pragma omp simd reduction(max : block_max)
    for (int64_t c = 0; c < visible; ++c) block_max = x[c] > block_max ? x[c] : block_max;
    const T old_max = row_max[r];
    const T new_max = block_max > old_max ? block_max : old_max;
    if (new_max == kNegInf) {
      // Nothing visible yet. The max skips NaN, so look for one: NaN must not turn into zeros.
      bool has_nan = false;
      for (int64_t c = 0; c < visible; ++c) has_nan |= std::isnan(x[c]);
      std::fill(x, x + cols, has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      if (has_nan) row_sum[r] = std::numeric_limits<T>::quiet_NaN();
      correction[r] = T(1);
      continue;
    }
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < visible; ++c) {
      const T e = exp_nonpositive(x[c] - new_max);
      x[c] = e;
      sum += e;
    }
    std::fill(x + visible, x + cols, T(0));
    const T alpha = exp_nonpositive(old_max - new_max);
    correction[r] = alpha;
    row_sum[r] = row_sum[r] * alpha + sum;
    row_max[r] = new_max;
  }
}

template <typename T>
ATTNLAB_INLINE void probs_from_lse_impl(T* s, int64_t rows, int64_t cols, int64_t ld,
                                        const T* mask, int64_t mask_ld, int64_t visible_base,
                                        const T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* x = s + r * ld;
    const T l = lse[r];
    const int64_t visible = l == -std::numeric_limits<T>::infinity()
                                ? 0
                                : visible_cols(visible_base, r, cols);
    if (mask) {
      const T* m = mask + r * mask_ld;
#pragma omp simd
      for (int64_t c = 0; c < visible; ++c) x[c] = exp_nonpositive(x[c] + m[c] - l);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < visible; ++c) x[c] = exp_nonpositive(x[c] - l);
    }
    std::fill(x + visible, x + cols, T(0));
  }
}

template <typename T>
ATTNLAB_INLINE void softmax_grad_block_impl(const T* p, T* dp, int64_t rows, int64_t cols,
                                            int64_t ld, const T* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * ld;
    T* dr = dp + r * ld;
    const T d = delta[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dr[c] = pr[c] * (dr[c] - d);
  }
}

template <typename T>
ATTNLAB_INLINE void scale_rows_impl(T* x, int64_t rows, int64_t cols, int64_t ld,
                                    const T* factor) {
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * ld;
    const T f = factor[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) xr[c] *= f;
  }
}

template <typename T>
ATTNLAB_INLINE void row_dots_impl(const T* a, int64_t lda, const T* b, int64_t ldb,
                                  int64_t rows, int64_t cols, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * lda;
    const T* br = b + r * ldb;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += ar[c] * br[c];
    out[r] = sum;
  }
}

}  // namespace

#define ATTNLAB_FOR_FLOAT_TYPES(X) X(float) X(double)

#define ATTNLAB_DEFINE_ROW_OPS(T)                                                              \
  ATTNLAB_ISA_CLONES void online_softmax_block(T* s, int64_t rows, int64_t cols, int64_t ld,   \
                                               const T* mask, int64_t mask_ld,                 \
                                               int64_t visible_base, T* row_max, T* row_sum,   \
                                               T* correction) {                                \
    online_softmax_block_impl(s, rows, cols, ld, mask, mask_ld, visible_base, row_max,         \
                              row_sum, correction);                                            \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void probs_from_lse(T* s, int64_t rows, int64_t cols, int64_t ld,         \
                                         const T* mask, int64_t mask_ld, int64_t visible_base, \
                                         const T* lse) {                                       \
    probs_from_lse_impl(s, rows, cols, ld, mask, mask_ld, visible_base, lse);                  \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void softmax_grad_block(const T* p, T* dp, int64_t rows, int64_t cols,    \
                                             int64_t ld, const T* delta) {                     \
    softmax_grad_block_impl(p, dp, rows, cols, ld, delta);                                     \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void scale_rows(T* x, int64_t rows, int64_t cols, int64_t ld,             \
                                     const T* factor) {                                        \
    scale_rows_impl(x, rows, cols, ld, factor);                                                \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void row_dots(const T* a, int64_t lda, const T* b, int64_t ldb,           \
                                   int64_t rows, int64_t cols, T* out) {                       \
    row_dots_impl(a, lda, b, ldb, rows, cols, out);                                            \
  }

ATTNLAB_FOR_FLOAT_TYPES(ATTNLAB_DEFINE_ROW_OPS)

}  // namespace attnlab::cpu
