#include "cpu/attention/dropout.h"

#include "cpu/isa/isa.h"

namespace attnlab::cpu {
namespace {

// One function for the three element types. Keys go in pairs, one hash each, so that the
// loop vectorizes in every clone; an odd first or last key is decided alone.
template <typename T, typename Apply>
ATTNLAB_INLINE void dropout_rows_impl(const Dropout& d, int64_t row0, int64_t col0, T* x,
                                      int64_t rows, int64_t cols, int64_t ld, Apply apply) {
  const uint32_t threshold = d.threshold();
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t key = dropout_row_key(d.seed, row0 + r);
    T* xr = x + r * ld;
    int64_t c = 0;
    if ((col0 & 1) != 0 && cols > 0) {
      xr[0] = apply(xr[0], dropout_keeps(key, col0, threshold));
      c = 1;
    }
    const int64_t pairs = (cols - c) / 2, pair0 = (col0 + c) >> 1;
    T* xp = xr + c;
#pragma omp simd
    for (int64_t m = 0; m < pairs; ++m) {
      const uint32_t h = dropout_hash(key, pair0 + m);
      xp[2 * m] = apply(xp[2 * m], (h & 0xFFFFu) >= threshold);
      xp[2 * m + 1] = apply(xp[2 * m + 1], (h >> 16) >= threshold);
    }
    if (c + 2 * pairs < cols) {
      const int64_t last = cols - 1;
      xr[last] = apply(xr[last], dropout_keeps(key, col0 + last, threshold));
    }
  }
}

}  // namespace

ATTNLAB_ISA_CLONES void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, float* x,
                                     int64_t rows, int64_t cols, int64_t ld, float kept) {
  dropout_rows_impl(d, row0, col0, x, rows, cols, ld,
                    [kept](float v, bool keep) { return keep ? v * kept : 0.0f; });
}

ATTNLAB_ISA_CLONES void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, double* x,
                                     int64_t rows, int64_t cols, int64_t ld, double kept) {
  dropout_rows_impl(d, row0, col0, x, rows, cols, ld,
                    [kept](double v, bool keep) { return keep ? v * kept : 0.0; });
}

ATTNLAB_ISA_CLONES void dropout_rows(const Dropout& d, int64_t row0, int64_t col0, uint16_t* x,
                                     int64_t rows, int64_t cols, int64_t ld) {
  dropout_rows_impl(d, row0, col0, x, rows, cols, ld,
                    [](uint16_t v, bool keep) { return keep ? v : uint16_t(0); });
}

}  // namespace attnlab::cpu
