#pragma once
// Row-major GEMM with bfloat16 products and float32 sums, on AVX512-BF16 (vdpbf16ps). The
// attention kernels use it for bfloat16 inputs, which they widen to float32 (rounding those
// operands back to bfloat16 is exact), on CPUs where it is faster than the float32 products:
// one vdpbf16ps does twice the multiply-adds of a float32 FMA, which makes it about twice as
// fast on an AMD Zen 4 core, but an Intel Xeon (Emerald Rapids) issues two float32 FMAs per
// cycle and vdpbf16ps at half that rate, so there it is about twice as slow
// (bf16_products_pay).

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

// Multiply-adds per unit of time of vdpbf16ps over those of float32 FMAs on this CPU, measured
// once by a register-only probe of about a millisecond (0 without AVX512-BF16).
double bf16_product_speedup();
// bf16_products_pay() holds where the speedup is at least this: the packing that bf16_gemm
// adds to the products is then paid for.
constexpr double kBf16ProductsMinSpeedup = 1.3;

// Whether bfloat16 attention runs its blocked products through bf16_gemm (on bfloat16
// operands) rather than the float32 gemm, decided once: ATTNLAB_CPU_BF16_PRODUCTS=1 or 0
// decides; otherwise yes where bf16_products() is "amx" or "onednn_brgemm", else where
// bf16_product_speedup() >= kBf16ProductsMinSpeedup (AMD Zen 4: about 2; Intel Emerald
// Rapids: about 0.5). Never without AVX512-BF16.
bool bf16_products_pay();

// C[m×n] = alpha·op(A)·op(B) + beta·C with the contract of gemm (row-major, leading dimensions
// lda, ldb, ldc, op(X) = Xᵀ when trans_x, beta = 0 ignores C's previous contents, NaN included),
// except that A and B are first rounded to bfloat16 (to nearest, ties to even); the products
// of the rounded values are exact in float32 and summed in float32. Where bf16_gemm_available()
// is false it is the float32 gemm, without the rounding.
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace attnlab::cpu
