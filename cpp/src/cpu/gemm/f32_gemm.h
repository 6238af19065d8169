#pragma once
// Row-major float32 GEMM on AVX-512 FMA, of attnlab's own: op(B) packed in column panels per
// call (in chunks of 256 steps of the sum, which stay in the L1 cache), op(A) broadcast from
// memory, an 8-row register block, beta = 0 without reading C. At the
// attention's and the encoder's block sizes it costs less than a sequential BLAS call, whose
// packing copies and C scaling weigh on products this small (see cpu/gemm/gemm.cpp for the
// figures). Kernels reach it through cpu/gemm/gemm.h: gemm() takes it where it pays, and the
// packed and in-place products below are for the attention kernels' fused row passes.

#include <cstdint>
#include <limits>

namespace attnlab::cpu {

// The product of an empty sum (k = 0), as BLAS has it: C[m×n] = beta·D (D's rows ldd apart; D
// may be C), zeros when beta = 0 whatever D holds. Every route of gemm ends this way.
template <typename T>
inline void empty_sum_product(int64_t m, int64_t n, T beta, const T* d, int64_t ldd, T* c,
                              int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * d[i * ldd + j];
  }
}

// Whether this CPU runs f32_gemm's AVX-512 kernel (AVX-512 F/BW/VL/DQ), checked once.
bool f32_gemm_available();

// C[m×n] = alpha·op(A)·op(B) + beta·C with the contract of gemm (row-major, leading dimensions
// lda, ldb, ldc, op(X) = Xᵀ when trans_x, beta = 0 ignores C's previous contents, NaN
// included). Only where f32_gemm_available() (gemm(), cpu/gemm/gemm.h, is the route for any
// CPU).
void f32_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);

// C[m×n] = alpha·op(A)·op(B) + beta·D: f32_gemm with the addend read from D, whose rows are
// ldd apart (ldd = 0: one row added to every row of C, such as a bias), as the product stores
// C. Filling C with D first and reading it back (beta = 1) cost a pass over C. D may be C with
// ldd = ldc (f32_gemm); otherwise it must not overlap C. beta = 0 ignores D.
void f32_gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  const float* d, int64_t ldd, float* c, int64_t ldc);

// op(B) packed once and reused by several products (the attention forward packs a head's K
// and V once for all of its query blocks, where f32_gemm would pack them again for each: at
// 64×512×64, one Intel Xeon thread, 130 GFLOP/s with the packing, 154 without).
// The layout: column panels of kF32PackedPanel columns, panel q (columns from q·kF32PackedPanel)
// at packed + q·k·kF32PackedPanel, its k rows round_up(width, 16) floats apart.
constexpr int64_t kF32PackedPanel = 32;
// The floats f32_pack_b writes for an op(B) of k rows and n columns.
constexpr int64_t f32_packed_size(int64_t n, int64_t k) {
  return (n + kF32PackedPanel - 1) / kF32PackedPanel * kF32PackedPanel * k;
}
// Packs op(B) [k×n] (B row-major with leading dimension ldb, op(B) = Bᵀ when trans_b).
// Only where f32_gemm_available().
void f32_pack_b(bool trans_b, int64_t n, int64_t k, const float* b, int64_t ldb, float* packed);
// C[m×n] = alpha·op(A)·P + beta·C (f32_gemm's contract), where P is rows [row0, row0 + k) and
// columns [0, n) of an op(B) of packed_k rows and packed_n columns packed by f32_pack_b, with
// n <= packed_n and row0 + k <= packed_k. Only where f32_gemm_available(); k >= 1.
// row_max (or null; only with beta = 0, checked): also receives, for each row i of C, the
// largest of its columns [0, clamp(visible + i, 0, n)) as the product stores them (NaN skipped;
// −inf for none), found in registers instead of by another pass over C (the attention's scores
// and their row max). skip_hidden (with row_max and k <= 256 only; ignored otherwise): row i of
// C is wanted only in its columns [0, visible + i), so each block of 8 rows computes only the
// 32-column panels that its last row sees and leaves C's later columns in those rows
// unwritten (the causal mask's scores, whose hidden part the softmax never reads).
void f32_gemm_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* packed, int64_t packed_n, int64_t packed_k,
                     int64_t row0, float beta, float* c, int64_t ldc, float* row_max = nullptr,
                     int64_t visible = std::numeric_limits<int64_t>::max() / 4,
                     bool skip_hidden = false);

// C[m×n] = alpha·op(A)·B + beta·C (f32_gemm's contract, B never transposed) with B's rows read
// where they are, unpacked: for a B that f32_pack_b would only copy and a product reads once
// or twice (a head's V in the forward's P·V products; dO, Q and K in the backward's dV, dK and
// dQ). n a multiple of 16 (checked), so that no vector load passes a row's end. Only where
// f32_gemm_available().
// nonzero_k: row i of op(A) is zero in its columns from nonzero_k + i on (the causal mask's
// probabilities, zeros past each row's last visible key), so in the 64-column blocks each
// block of rows sums only the steps that its last row needs. The terms skipped are 0·B, so
// C only differs where such a B element is infinite or NaN (0·inf is NaN).
void f32_gemm_rows(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                   int64_t nonzero_k = std::numeric_limits<int64_t>::max() / 4);

// Zeros that this thread owes memory but nothing reads before the calling operator returns (the
// causal weights beyond the keys a query block sees): f32_defer_zeros records them, and this
// thread's float32 products then write them with non-temporal stores, a 64-byte line every other
// step of their sums, so that the writes overlap the arithmetic instead of following it.
// f32_flush_zeros writes whatever is left (copies included) and fences; call it before the
// memory is read or freed (the thread's share of the operator's work done, exceptions
// included). The zeros: `count` floats at dst + r·ld for each r < rows; dst 64-byte aligned,
// count and ld multiples of 16. f32_defer_zeros only where f32_gemm_available();
// f32_flush_zeros anywhere (a no-op where nothing can be owed).
void f32_defer_zeros(float* dst, int64_t count, int64_t rows = 1, int64_t ld = 0);
void f32_flush_zeros();
// Rows (rows of row_bytes bytes, ld_bytes apart) that this thread reads soon: this thread's
// next scores' products (f32_gemm_packed with row_max) prefetch them into L2, a few lines after
// each panel of 32 columns. Replaces what earlier calls queued, or with append queues these after
// them (up to four regions). Only a hint: no result depends on it.
void f32_prefetch_rows(const void* first, int64_t rows, int64_t row_bytes, int64_t ld_bytes,
                       bool append = false);

// The same for scaled copies (the normalized attention weights, streamed out of a query
// block's buffer while its P·V product runs): dst[r·ld + c] = src[r·lds + c]·factors[r] for
// r < rows and c < count, with the same non-temporal stores. Copies are written before any
// owed zeros. src and factors must stay unchanged until f32_flush_scaled_rows (the copies
// only) or f32_flush_zeros (everything) returns. dst and src 64-byte aligned; count, ld and
// lds multiples of 16. f32_defer_scaled_rows only where f32_gemm_available().
void f32_defer_scaled_rows(const float* src, int64_t lds, const float* factors, float* dst,
                           int64_t ld, int64_t count, int64_t rows);
void f32_flush_scaled_rows();

// dst[r·cols + c] = float(src[r·ld + c]) for rows × cols float16 (bfloat16 when `bf16`) values
// given as their bits. Only where f32_gemm_available().
void f32_widen_rows(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, bool bf16,
                    float* dst);

// The reverse: dst[r·ld + c] = src[r·cols + c] rounded to float16 (bfloat16 when `bf16`),
// nearest with ties to even, NaN kept, as torch's conversion does. Only where
// f32_gemm_available().
void f32_narrow_rows(const float* src, int64_t rows, int64_t cols, bool bf16, uint16_t* dst,
                     int64_t ld);

}  // namespace attnlab::cpu
