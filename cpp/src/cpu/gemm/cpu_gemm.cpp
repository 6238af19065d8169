#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <ATen/Parallel.h>

#include "attnlab/cpu_gemm.h"
#include "cpu/gemm/gemm.h"

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

namespace {

// Multiply-adds per second of twelve independent FMA chains on registers of one width (enough
// to cover the FMA latency of two pipes), run for about `seconds`; one copy per instruction set.
#define ATTNLAB_FMA_RATE(NAME, TARGET, VEC, LANES, SET1, FMA)                               \
  __attribute__((target(TARGET))) double NAME(double seconds) {                            \
    VEC acc[12];                                                                            \
    for (int i = 0; i < 12; ++i) acc[i] = SET1(1.0f + 1e-7f * static_cast<float>(i));        \
    VEC a = SET1(0.999999f), b = SET1(1e-9f);                                               \
    using clock = std::chrono::steady_clock;                                                \
    const auto start = clock::now();                                                        \
    int64_t steps = 0;                                                                      \
    double elapsed = 0.0;                                                                   \
    do {                                                                                    \
      for (int s = 0; s < 4096; ++s) {                                                      \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = FMA(acc[i], a, b);   \
        __asm__ volatile("" : "+v"(a), "+v"(b));                                            \
      }                                                                                     \
      steps += 4096;                                                                        \
      elapsed = std::chrono::duration<double>(clock::now() - start).count();                \
    } while (elapsed < seconds);                                                            \
    for (int i = 1; i < 12; ++i) acc[0] = FMA(acc[0], acc[i], b);                           \
    __asm__ volatile("" : : "v"(acc[0]));                                                   \
    return 12.0 * (LANES) * static_cast<double>(steps) / elapsed;                           \
  }

ATTNLAB_FMA_RATE(fma_rate_avx512, "avx512f", __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps)
ATTNLAB_FMA_RATE(fma_rate_avx2, "avx2,fma", __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps)
#undef ATTNLAB_FMA_RATE

}  // namespace

double cpu_float32_fma_peak(double seconds) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0.0;
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rates[t] = avx512 ? fma_rate_avx512(seconds) : fma_rate_avx2(seconds);
    }
  });
  double total = 0.0;
  for (double r : rates) total += r;
  return 2.0 * total / 1e9;
}

}  // namespace attnlab
