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
// torch's oneDNN brgemm, a transposed A turned into rows first: Intel Xeon since Sapphire Rapids; off with
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
// of the rounded values are exact in float32 and summed in float32. Only where
// bf16_gemm_available() (gemm_bf16_operands, cpu/gemm/gemm.h, is the route for any CPU).
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

// Products against a B packed once and used by many products (the attention's K and V, packed
// once per head): whether this CPU takes them, checked once: where bf16_products() is "amx" or
// "onednn_brgemm" (through oneDNN's brgemm), or where bfloat16 products pay (bf16_products_pay:
// attnlab's vdpbf16ps blocks on the same layouts).
bool bf16_prepacked_route();
// op(B) [k×n] (op(B) = Bᵀ when trans_b; B row-major with leading dimension ldb) rounded to
// bfloat16 and packed in oneDNN's layout for bfloat16 B ("VNNI": rows 2p and 2p + 1 of op(B)
// interleaved column by column, an odd k padded with a zero row), with leading dimension
// bf16_packed_ld(n) (a multiple of 16), into bf16_packed_pairs(k, n) 32-bit words.
int64_t bf16_packed_ld(int64_t n);
int64_t bf16_packed_pairs(int64_t k, int64_t n);
void bf16_pack_b(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
                 uint32_t* packed);
// C[m×n] = alpha·A·op(B)[k0 : k0 + k, n0 : n0 + n], plus C when accumulate (then alpha must be
// 1); A row-major [m×k] float, rounded to bfloat16; `packed` made by bf16_pack_b with leading
// dimension ldo; k0 even; any k (op(B)'s row k0 + k is not read).
void bf16_gemm_prepacked(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const uint32_t* packed, int64_t ldo, int64_t k0, int64_t n0,
                         bool accumulate, float* c, int64_t ldc);
// The same for operands already in bfloat16 (their bits; nothing is rounded), which the
// forward takes from bfloat16 inputs without widening them to float32:
// bf16_pack_b of a bfloat16 B;
void bf16_pack_b(bool trans_b, int64_t k, int64_t n, const uint16_t* b, int64_t ldb,
                   uint32_t* packed);
// whether alpha is a power of two (then alpha·x rounds as x does, but for overflow and
// subnormal results), which bf16_pack_rows16 takes into A;
bool bf16_exact_scale(float alpha);
// bf16_pack_rows16 copies A [m×k] (row stride lda) to out (row stride ldo >= k rounded up to
// even) times alpha (1 or a power of two), an odd k's last column followed by a 0;
void bf16_pack_rows16(int64_t m, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                      uint16_t* out, int64_t ldo);
// bf16_gemm_prepacked16 is bf16_gemm_prepacked with A [m×k] in bfloat16 rows (lda apart), and
// any k: an odd k's last term is added on its own (A's column k and op(B)'s row k0 + k are
// never read).
void bf16_gemm_prepacked16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                           int64_t lda, const uint32_t* packed, int64_t ldo, int64_t k0,
                           int64_t n0, bool accumulate, float* c, int64_t ldc);
// bf16_gemm_prepacked leaves the AMX tiles configured from one product to the next (releasing
// and configuring them again for every product of a causal forward cost more than its products);
// a thread calls this when its run of products is over.
void bf16_prepacked_release();

}  // namespace attnlab::cpu
