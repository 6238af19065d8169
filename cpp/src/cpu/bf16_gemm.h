#pragma once
// Row-major GEMM with bfloat16 products and float32 sums, on AVX512-BF16 (vdpbf16ps). The
// attention kernels use it for bfloat16 inputs, which they widen to float32: rounding those
// operands back to bfloat16 is exact, and one vdpbf16ps does twice the multiply-adds of a float32
// FMA, so the products run at about twice sgemm's rate on CPUs that have it (AMD Zen 4, Intel
// Xeon since Cooper Lake).

#include <cstdint>

namespace attnlab::cpu {

// Whether this CPU runs bf16_gemm (AVX512-BF16 with AVX512-BW/VL), checked once.
bool bf16_gemm_available();

// Where bf16_gemm runs its products, decided at the first call: "amx" (AMX-BF16 tiles through
// torch's oneDNN brgemm, for non-transposed A: Intel Xeon since Sapphire Rapids; off with
// ATTNLAB_CPU_BRGEMM=0), "onednn_brgemm" (the same route without AMX, taken only with
// ATTNLAB_CPU_BRGEMM=1), "avx512_bf16" (attnlab's vdpbf16ps blocks) or "float32" (the float32
// gemm, unrounded).
const char* bf16_products();

// C[m×n] = alpha·op(A)·op(B) + beta·C with the contract of gemm (row-major, leading dimensions
// lda, ldb, ldc, op(X) = Xᵀ when trans_x, beta = 0 ignores C's previous contents, NaN included),
// except that A and B are first rounded to bfloat16 (to nearest, ties to even); the products
// of the rounded values are exact in float32 and summed in float32. Where bf16_gemm_available()
// is false it is the float32 gemm, without the rounding.
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace attnlab::cpu
