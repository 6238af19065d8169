#pragma once
// Row-major float32 GEMM on AVX-512 FMA, of attnlab's own: op(B) packed in column panels per
// call, op(A) broadcast from memory, an 8-row register block, beta = 0 without reading C. At the
// attention's and the encoder's block sizes it costs less than a sequential BLAS call, whose
// packing copies and C scaling weigh on products this small (see cpu/blas.cpp for the figures).

#include <cstdint>

namespace attnlab::cpu {

// Whether this CPU runs f32_gemm's AVX-512 kernel (AVX-512 F/BW/VL/DQ), checked once.
bool f32_gemm_available();

// C[m×n] = alpha·op(A)·op(B) + beta·C with the contract of gemm (row-major, leading dimensions
// lda, ldb, ldc, op(X) = Xᵀ when trans_x, beta = 0 ignores C's previous contents, NaN
// included). Where f32_gemm_available() is false, or for an empty product, it is blas_gemm
// (cpu/blas.h).
void f32_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);

}  // namespace attnlab::cpu
