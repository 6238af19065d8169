#pragma once
// Row-wise pieces of blocked attention: the online-softmax update in the forward, the
// probabilities from the stored log-sum-exp and the softmax gradient in the backward.
// Each works on a block of `rows` rows with `cols` columns at leading dimension `ld`.
//
// Causal masking is a per-row count of visible leading columns: row r sees the first
// clamp(visible_base + r, 0, cols) columns; pass kAllVisible when there is no causal mask.
// `mask` (nullable) is an additive mask block with leading dimension mask_ld (0 = the same row
// for every query).

#include <cstdint>
#include <limits>

namespace attnlab::cpu {

constexpr int64_t kAllVisible = std::numeric_limits<int64_t>::max() / 4;

// Scores → unnormalised probabilities exp(s − new max), in place; columns a row may not see
// become 0. Updates row_max and row_sum and writes correction[r] = exp(old max − new max), the
// factor by which the caller rescales what it accumulated from earlier blocks.
// A row with nothing visible so far keeps max −inf and sum 0 (NaN scores make it NaN).
// known_max (nullable): per row, the largest of the scores the row sees in this block where the
// caller already has it (f32_gemm_packed's row_max), or NaN: the row is then not searched.
// row_dot (nullable): per row, Σ_c e_c·(s_c − new max) over this block's exps e (0 for a row
// with nothing visible), from which a whole row's entropy is log(sum) − row_dot / sum.
void online_softmax_block(float* s, int64_t rows, int64_t cols, int64_t ld, const float* mask,
                          int64_t mask_ld, int64_t visible_base, float* row_max, float* row_sum,
                          float* correction, const float* known_max = nullptr,
                          float* row_dot = nullptr);
void online_softmax_block(double* s, int64_t rows, int64_t cols, int64_t ld, const double* mask,
                          int64_t mask_ld, int64_t visible_base, double* row_max,
                          double* row_sum, double* correction,
                          const double* known_max = nullptr, double* row_dot = nullptr);

// online_softmax_block (float) with the probabilities written to probs16 instead (rows ld16 >= ld
// apart), rounded to bfloat16 (to nearest even; bits): columns a row may not see are 0 up to
// cols, and s is left with the masked scores. The exp is a cheaper one (relative error 2.7e-6,
// plus the rounding of the row max times log2(e): about 5e-6 while |max| < 64, 4e-5 at 1000;
// P's own rounding is up to 2^-8); the sums are of its unrounded values. Only on
// CPUs with AVX512-BF16 (bf16_gemm_available()).
void online_softmax_block_bf16(float* s, int64_t rows, int64_t cols, int64_t ld,
                               const float* mask, int64_t mask_ld, int64_t visible_base,
                               float* row_max, float* row_sum, float* correction,
                               uint16_t* probs16, int64_t ld16);

// Scores → probabilities exp(s + mask − lse), in place; invisible columns and rows with
// lse = −inf (every key masked) become 0.
void probs_from_lse(float* s, int64_t rows, int64_t cols, int64_t ld, const float* mask,
                    int64_t mask_ld, int64_t visible_base, const float* lse);
void probs_from_lse(double* s, int64_t rows, int64_t cols, int64_t ld, const double* mask,
                    int64_t mask_ld, int64_t visible_base, const double* lse);

// dP → dS = P ⊙ (dP − delta[r]), in place in dp.
void softmax_grad_block(const float* p, int64_t ldp, float* dp, int64_t lddp, int64_t rows,
                        int64_t cols, const float* delta);
void softmax_grad_block(const double* p, int64_t ldp, double* dp, int64_t lddp, int64_t rows,
                        int64_t cols, const double* delta);

// Per row, after the online softmax: inv_sum = 1 / sum (0 for a row that saw nothing, whose
// sum is 0; NaN stays NaN) and lse = max + log(sum) (−inf for such a row).
void row_normalizers(int64_t rows, const float* row_max, const float* row_sum, float* inv_sum,
                     float* lse);
void row_normalizers(int64_t rows, const double* row_max, const double* row_sum,
                     double* inv_sum, double* lse);

// Multiplies each row r by factor[r].
void scale_rows(float* x, int64_t rows, int64_t cols, int64_t ld, const float* factor);
void scale_rows(double* x, int64_t rows, int64_t cols, int64_t ld, const double* factor);

// Whether stream_scaled_rows runs here (an AVX-512 CPU and a build with its code).
bool can_stream_rows();

// dst[r, c] = src[r, c]·factor[r] for c < cols and 0 for cols <= c < width, written with
// non-temporal stores (no read of dst's lines first, none kept in cache): for results that
// nothing reads back soon, such as the attention weights. Only where can_stream_rows().
void stream_scaled_rows(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                        int64_t cols, int64_t width, const float* factor);

// out[r] = Σ_c a[r, c]·b[r, c].
void row_dots(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows,
              int64_t cols, float* out);
void row_dots(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t rows,
              int64_t cols, double* out);

}  // namespace attnlab::cpu
