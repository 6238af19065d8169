#include "cpu/softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/isa.h"
#include "cpu/vec_math.h"

namespace attnlab::cpu {
namespace {

ATTNLAB_INLINE int64_t visible_cols(int64_t visible_base, int64_t r, int64_t cols) {
  return std::clamp<int64_t>(visible_base + r, 0, cols);
}

// Elements per 64-byte vector: the row loops run in whole chunks of this many.
template <typename T>
constexpr int64_t kChunk = kLanes<T>;

// x[j] = exp(x[j] − shift) over one chunk, adding each result to its lane's running sum.
template <typename T>
ATTNLAB_INLINE void exp_shift_chunk(T* x, T shift, T* lane_sums) {
  for (int64_t j = 0; j < kChunk<T>; ++j) {
    const T e = exp_nonpositive(x[j] - shift);
    x[j] = e;
    lane_sums[j] += e;
  }
}

// The row loops run over whole chunks: GCC's loop remainders are scalar (and its max-reduction
// remainder stalls on store forwarding), while short rows (L = 10, 16, causal rows) are mostly
// remainder. A row's visible part is therefore padded with −inf up to a whole chunk when the
// row owns the room (`capacity` elements); otherwise the last chunk goes through a copy.
// Returns the length to process: a multiple of the chunk, or n itself without room.
template <typename T>
ATTNLAB_INLINE int64_t pad_to_chunks(T* x, int64_t n, int64_t capacity) {
  const int64_t padded = (n + kChunk<T> - 1) / kChunk<T> * kChunk<T>;
  if (padded > capacity) return n;
  for (int64_t c = n; c < padded; ++c) x[c] = -std::numeric_limits<T>::infinity();
  return padded;
}

// Applies `chunk_fn` to every whole chunk of x[0, n); a last partial chunk goes through a
// −inf-padded copy whose first n % chunk entries are copied back.
template <typename T, typename ChunkFn>
ATTNLAB_INLINE void for_each_chunk(T* x, int64_t n, ChunkFn&& chunk_fn) {
  constexpr int64_t L = kChunk<T>;
  int64_t c = 0;
  for (; c + L <= n; c += L) chunk_fn(x + c);
  if (c == n) return;
  T tail[L];
  for (int64_t j = 0; j < L; ++j) tail[j] = c + j < n ? x[c + j] : -std::numeric_limits<T>::infinity();
  chunk_fn(tail);
  for (int64_t j = 0; j < n - c; ++j) x[c + j] = tail[j];
}

template <typename T>
ATTNLAB_INLINE T max_of(T* x, int64_t n) {
  Vec<T> lanes = {};
  lanes -= std::numeric_limits<T>::infinity();
  for_each_chunk(x, n, [&](const T* chunk) {
    Vec<T> v;
    std::memcpy(&v, chunk, sizeof(v));
    lanes = v > lanes ? v : lanes;
  });
  T result = lanes[0];
  for (int64_t j = 1; j < kChunk<T>; ++j) result = lanes[j] > result ? lanes[j] : result;
  return result;
}

// x[c] = exp(x[c] − shift) for c < n; returns the sum (lanes summed once, at the end).
template <typename T>
ATTNLAB_INLINE T exp_shift_sum(T* x, int64_t n, T shift) {
  T lane_sums[kChunk<T>] = {};
  for_each_chunk(x, n, [&](T* chunk) { exp_shift_chunk(chunk, shift, lane_sums); });
  T sum = 0;
  for (int64_t j = 0; j < kChunk<T>; ++j) sum += lane_sums[j];
  return sum;
}

template <typename T>
ATTNLAB_INLINE void zero_from(T* x, int64_t from, int64_t to) {
  for (int64_t c = from; c < to; ++c) x[c] = T(0);
}

// A -inf mask entry hides the key whatever its score: a NaN or inf score there stays out of
// the row instead of turning it into NaN (-inf + NaN would be NaN).
template <typename T>
ATTNLAB_INLINE void add_mask_row(T* x, const T* mask, int64_t n) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) x[c] = mask[c] == kNegInf ? kNegInf : x[c] + mask[c];
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
    if (mask) add_mask_row(x, mask + r * mask_ld, visible);
    const int64_t width = pad_to_chunks(x, visible, ld);
    const T old_max = row_max[r];
    const T block_max = max_of(x, width);
    const T new_max = block_max > old_max ? block_max : old_max;
    if (new_max == kNegInf) {
      // Nothing visible yet. The max skips NaN, so look for one: NaN must not turn into zeros.
      bool has_nan = false;
      for (int64_t c = 0; c < visible; ++c) has_nan |= std::isnan(x[c]);
      std::fill(x, x + std::max(width, cols), has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      if (has_nan) row_sum[r] = std::numeric_limits<T>::quiet_NaN();
      correction[r] = T(1);
      continue;
    }
    const T sum = exp_shift_sum(x, width, new_max);
    zero_from(x, width, cols);
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
    if (mask) add_mask_row(x, mask + r * mask_ld, visible);
    const int64_t width = pad_to_chunks(x, visible, ld);
    exp_shift_sum(x, width, l);
    zero_from(x, width, cols);
  }
}

template <typename T>
ATTNLAB_INLINE void softmax_grad_block_impl(const T* p, int64_t ldp, T* dp, int64_t lddp,
                                            int64_t rows, int64_t cols, const T* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * ldp;
    T* dr = dp + r * lddp;
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
  ATTNLAB_ISA_CLONES void softmax_grad_block(const T* p, int64_t ldp, T* dp, int64_t lddp,   \
                                             int64_t rows, int64_t cols, const T* delta) {     \
    softmax_grad_block_impl(p, ldp, dp, lddp, rows, cols, delta);                              \
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
