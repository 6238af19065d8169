#include "cpu/attention/dropout.h"

#include "cpu/isa/isa.h"

namespace attnlab::cpu {
namespace {

// One function for the three element types: the hash loop vectorizes in every clone.
template <typename T, typename Apply>
ATTNLAB_INLINE void dropout_rows_impl(const Dropout& d, int64_t row0, int64_t col0, T* x,
                                      int64_t rows, int64_t cols, int64_t ld, Apply apply) {
  const uint32_t threshold = d.threshold();
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t key = dropout_row_key(d.seed, row0 + r);
    T* xr = x + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      xr[c] = apply(xr[c], dropout_hash(key, col0 + c) >= threshold);
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
