#pragma once
// The CPU kernels' one entrance to matrix products: this header, which also brings the products
// with packed or in-place operands of f32_gemm.h and bf16_gemm.h that the attention kernels fuse
// with their row passes. gemm() and gemm_bf16_operands() pick the route for any CPU; the
// routes themselves (f32_gemm, bf16_gemm, the BLAS) never call back here.
//
// Row-major GEMM on raw pointers for the attention kernels. Small products run in a
// register-blocked kernel of our own (a BLAS call costs more than the arithmetic there);
// larger ones go to the Fortran BLAS that torch links (MKL in the x86-64 wheels) or the
// system BLAS.

#include <algorithm>
#include <cstdint>

#include "cpu/gemm/bf16_gemm.h"
#include "cpu/gemm/f32_gemm.h"

namespace attnlab::cpu {

// C[m×n] = alpha·op(A)·op(B) + beta·C, all row-major with leading dimensions lda, ldb, ldc;
// op(X) = Xᵀ when trans_x. beta = 0 ignores C's previous contents (NaN included).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// C[m×n] = alpha·op(A)·op(B) + beta·D: gemm with the addend read from D, whose rows are ldd
// apart (ldd = 0: one row added to every row of C, such as a bias). Where f32_gemm takes the
// product, D is read as C is stored; elsewhere C is filled from D first. D may be C with
// ldd = ldc (gemm); otherwise it must not overlap C. beta = 0 ignores D.
void gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
              const float* d, int64_t ldd, float* c, int64_t ldc);
void gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
              const double* d, int64_t ldd, double* c, int64_t ldc);

// gemm for float32 operands that hold bfloat16 values: on the CPU's bfloat16 dot products
// (bf16_gemm) where it has them, else gemm. No size threshold: on an AVX-512 AMD EPYC core
// bf16_gemm, packing included, beat the float32 gemm at every size measured, from 4×20×8
// (1.8×) and 17×17×16 (1.1×) to 256×512×64 (1.85×).
void gemm_bf16_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float beta, float* c, int64_t ldc);

// gemm_add's route where the product does not read D itself: C filled from D (when beta reads
// it and D is not C), after which gemm's beta·C adds it.
template <typename T>
void fill_addend(int64_t m, int64_t n, T beta, const T* d, int64_t ldd, T* c, int64_t ldc) {
  if (beta == T(0) || (d == c && ldd == ldc)) return;
  for (int64_t i = 0; i < m; ++i) std::copy(d + i * ldd, d + i * ldd + n, c + i * ldc);
}

// float32 products whose sums are longer than this go to the BLAS even where f32_gemm runs
// (gemm.cpp has the measurements); up to it, each element of C rounds the same whatever the
// product's other sizes.
inline constexpr int64_t kF32GemmMaxK = 4096;

// The BLAS call behind gemm (the Fortran sgemm_ that torch links), whatever the size: f32_gemm's
// fallback, and the baseline it is measured against.
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

// Within its scope this thread's BLAS calls run sequentially: the kernels call BLAS on small
// blocks from inside at::parallel_for, where a threaded BLAS would only add fork/join overhead.
class SequentialBlasScope {
 public:
  SequentialBlasScope();
  ~SequentialBlasScope();
  SequentialBlasScope(const SequentialBlasScope&) = delete;
  SequentialBlasScope& operator=(const SequentialBlasScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace attnlab::cpu
