#include <algorithm>

#include <ATen/Parallel.h>

#include "attnlab/cpu_gemm.h"
#include "cpu/blas.h"

namespace attnlab {

void cpu_float32_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  // Slices of 16 columns (one vector) or 6 rows (one register block of f32_gemm's kernel), so
  // that no thread's slice ends inside another's vector or block.
  const bool by_columns = n >= m;
  const int64_t unit = by_columns ? 16 : 6;
  const int64_t units = ((by_columns ? n : m) + unit - 1) / unit;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    cpu::SequentialBlasScope sequential;
    const int64_t lo = begin * unit;
    if (by_columns) {
      const int64_t hi = std::min(n, end * unit);
      cpu::gemm(trans_a, trans_b, m, hi - lo, k, 1.0f, a, lda,
                b + (trans_b ? lo * ldb : lo), ldb, 0.0f, c + lo, ldc);
    } else {
      const int64_t hi = std::min(m, end * unit);
      cpu::gemm(trans_a, trans_b, hi - lo, n, k, 1.0f, a + (trans_a ? lo : lo * lda), lda, b,
                ldb, 0.0f, c + lo * ldc, ldc);
    }
  });
}

}  // namespace attnlab
