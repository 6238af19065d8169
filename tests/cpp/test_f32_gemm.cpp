// The float32 GEMM of attnlab's own (cpu/gemm/f32_gemm.h), and gemm's float path that routes to it,
// against a float64 product written here: every transpose combination, ragged sizes around the
// register block (8 rows) and panel widths (16, 32, 48 columns), alpha/beta (beta = 0 over NaN),
// padded leading dimensions with C's padding left untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include "gemm_contract.h"

#include "cpu/gemm/gemm.h"
#include "cpu/gemm/f32_gemm.h"
#include "cpu/isa/isa.h"

namespace {

using attnlab::cpu::f32_gemm;
using attnlab::cpu::f32_gemm_available;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.0f;  // fills the padding beyond n in every row of C

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
  int64_t pad;  // added to every leading dimension
};

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);

void routed_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  attnlab::cpu::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Runs one case on random normal operands; returns the number of wrong elements (reported).
int run_case(GemmFn fn, const Case& t, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const int64_t lda = (t.trans_a ? t.m : t.k) + t.pad, ldb = (t.trans_b ? t.k : t.n) + t.pad;
  const int64_t ldc = t.n + t.pad;
  std::vector<float> a((t.trans_a ? t.k : t.m) * lda), b((t.trans_b ? t.n : t.k) * ldb);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  std::vector<float> c0(t.m * ldc, kSentinel);
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) c0[i * ldc + j] = t.beta == 0.0f ? kNaN : normal(rng);
  }
  std::vector<float> c = c0;
  fn(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a.data(), lda, b.data(), ldb, t.beta,
     c.data(), ldc);
  int wrong = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= t.n) {  // beyond the product: untouched
        if (got != kSentinel) ++wrong;
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < t.k; ++p) {
        const double x = t.trans_a ? a[p * lda + i] : a[i * lda + p];
        const double y = t.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      const double old = t.beta == 0.0f ? 0.0 : static_cast<double>(c0[i * ldc + j]);
      const double expected = t.alpha * sum + t.beta * old;
      // float32 sums of k products: about one rounding (6e-8 relative) per term at worst.
      const double scale = std::fabs(t.alpha) * magnitude + std::fabs(t.beta * old);
      const double bound = 2e-7 * static_cast<double>(t.k + 2) * scale + 1e-30;
      if (!(std::fabs(got - expected) <= bound)) {
        if (wrong < 3) {
          ADD_FAILURE() << "trans_a " << t.trans_a << " trans_b " << t.trans_b << " m " << t.m
                        << " n " << t.n << " k " << t.k << " alpha " << t.alpha << " beta "
                        << t.beta << " pad " << t.pad << " at (" << i << ", " << j
                        << "): " << got << " vs " << expected;
        }
        ++wrong;
      }
    }
  }
  return wrong;
}

TEST(F32Gemm, RaggedShapesAllTransposesMatchFloat64) {
  // The AVX-512 kernel where the CPU has it; elsewhere gemm's routing (the BLAS fallback),
  // which is what runs there: right either way.
  const GemmFn product = f32_gemm_available() ? GemmFn(&f32_gemm) : GemmFn(&routed_gemm);
  std::mt19937 rng(7);
  int cases = 0, wrong = 0;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const int64_t m : {1, 7, 8, 15, 17, 33, 100}) {
        for (const int64_t n : {1, 7, 15, 17, 33, 48, 64, 100}) {
          for (const int64_t k : {1, 7, 15, 17, 33, 100}) {
            const int64_t pad = (m + n + k) % 3 == 0 ? 0 : 5;
            wrong += run_case(product, {trans_a, trans_b, m, n, k, 1.0f, 0.0f, pad}, rng);
            wrong += run_case(product, {trans_a, trans_b, m, n, k, 0.75f, -1.5f, pad + 3}, rng);
            cases += 2;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "over " << cases << " cases";
}

// f32_gemm_packed on op(B) placed inside a larger packed operand: from row kRow0 of op(B') (37
// rows before it) and its first n of n + 19 columns, packed by f32_pack_b with B' stored as
// asked (trans_b: B'ᵀ row-major), so that both packings and the sub-ranges the attention
// kernels take (key blocks, a causal block's first columns) are checked.
constexpr int64_t kRow0 = 37, kExtraCols = 19;
void packed_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t big_k = kRow0 + k + 5, big_n = n + kExtraCols;
  // op(B') [big_k × big_n]: op(B) at rows kRow0.., columns 0..n; everything else 1e6 (a
  // product that read it would be far off).
  std::vector<float> big(big_k * big_n, 1e6f);
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < n; ++j) {
      const float x = tb ? b[j * ldb + p] : b[p * ldb + j];
      if (tb) {
        big[j * big_k + kRow0 + p] = x;  // B'ᵀ stored row-major: [big_n × big_k]
      } else {
        big[(kRow0 + p) * big_n + j] = x;
      }
    }
  }
  std::vector<float> packed(attnlab::cpu::f32_packed_size(big_n, big_k));
  attnlab::cpu::f32_pack_b(tb, big_n, big_k, big.data(), tb ? big_k : big_n, packed.data());
  attnlab::cpu::f32_gemm_packed(ta, m, n, k, alpha, a, lda, packed.data(), big_n, big_k, kRow0,
                                beta, c, ldc);
}

TEST(F32Gemm, PackedOperandsAndSumsLongerThanAChunk) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_packed needs AVX-512";
  std::mt19937 rng(13);
  int cases = 0, wrong = 0;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const int64_t m : {1, 9, 70}) {
        for (const int64_t n : {1, 17, 40, 64}) {
          // k across the 256-step chunks of the sum (kChunk in f32_gemm.cpp).
          for (const int64_t k : {1, 31, 255, 256, 257, 600}) {
            for (const GemmFn fn : {&packed_gemm, &f32_gemm}) {
              wrong += run_case(fn, {trans_a, trans_b, m, n, k, 1.0f, 0.0f, 3}, rng);
              wrong += run_case(fn, {trans_a, trans_b, m, n, k, 0.75f, -1.5f, 0}, rng);
              cases += 2;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "over " << cases << " cases";
}

// f32_gemm_rows (B's rows read in place, op(A) either way) through run_case's float64 check.
void rows_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ASSERT_FALSE(tb);
  attnlab::cpu::f32_gemm_rows(ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// m around the 6-row blocks and the 8-row ones, n around the 64-column blocks with 16, 32 and
// 48 columns left for the 8×2 panels, k from 0 (C = beta·C) across the 128-step chunks,
// padded leading dimensions (the padding of C untouched), beta 0 over NaN.
TEST(F32Gemm, RowsOfBInPlaceMatchFloat64) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_rows needs AVX-512";
  std::mt19937 rng(19);
  int cases = 0, wrong = 0;
  for (const int64_t m : {1, 5, 7, 12, 17, 64}) {
    for (const int64_t n : {16, 48, 64, 80, 128}) {
      for (const int64_t k : {0, 1, 7, 128, 129, 257}) {
        for (const bool trans_a : {false, true}) {
          wrong += run_case(&rows_gemm, {trans_a, false, m, n, k, 1.0f, 0.0f, 3}, rng);
          wrong += run_case(&rows_gemm, {trans_a, false, m, n, k, 0.5f, 1.0f, 0}, rng);
          wrong += run_case(&rows_gemm, {trans_a, false, m, n, k, -1.25f, 0.75f, 17}, rng);
          cases += 3;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "over " << cases << " cases";
  float c = 1.0f;
  EXPECT_THROW(attnlab::cpu::f32_gemm_rows(false, 1, 20, 1, 1.0f, &c, 1, &c, 20, 0.0f, &c, 20),
               c10::Error);  // n not a multiple of 16
}

// row_max: each row's largest visible value of C as stored, against a scan of C written here,
// and C itself bitwise the product without row_max. The causal-style offsets (rows seeing a
// growing prefix, none, or all of the columns), panel tails, sums longer than a chunk, op(A)
// both ways and NaN in A (a NaN row of C reports the max of nothing: −inf, as max_of16 skips
// NaN). beta != 0 with row_max is refused.
TEST(F32Gemm, PackedRowMaxIsTheMaxOfEachRowsVisibleColumns) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_packed needs AVX-512";
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  int cases = 0, wrong = 0, changed = 0;
  for (const bool trans_a : {false, true}) {
    for (const int64_t m : {1, 7, 16, 19}) {
      for (const int64_t n : {1, 16, 33, 64, 100}) {
        for (const int64_t k : {3, 64, 300}) {
          for (const int64_t visible : {int64_t(-3), int64_t(0), int64_t(5), int64_t(40),
                                        std::numeric_limits<int64_t>::max() / 4}) {
            std::vector<float> a(m * k), b(k * n), c(m * n), plain(m * n),
                packed(attnlab::cpu::f32_packed_size(n, k)), row_max(m, 42.0f);
            for (float& x : a) x = normal(rng);
            for (float& x : b) x = normal(rng);
            if (m > 2) {  // row 2 of C all NaN
              for (int64_t p = 0; p < k; ++p) a[trans_a ? p * m + 2 : 2 * k + p] = kNaN;
            }
            const int64_t lda = trans_a ? m : k;
            attnlab::cpu::f32_pack_b(false, n, k, b.data(), n, packed.data());
            attnlab::cpu::f32_gemm_packed(trans_a, m, n, k, 0.5f, a.data(), lda, packed.data(),
                                          n, k, 0, 0.0f, c.data(), n, row_max.data(), visible);
            attnlab::cpu::f32_gemm_packed(trans_a, m, n, k, 0.5f, a.data(), lda, packed.data(),
                                          n, k, 0, 0.0f, plain.data(), n);
            for (int64_t i = 0; i < m * n; ++i) {
              changed += std::memcmp(&c[i], &plain[i], sizeof(float)) != 0;
            }
            for (int64_t i = 0; i < m; ++i) {
              const int64_t seen = std::clamp<int64_t>(visible + i, 0, n);
              float expected = -std::numeric_limits<float>::infinity();
              for (int64_t j = 0; j < seen; ++j) {
                if (!std::isnan(c[i * n + j])) expected = std::max(expected, c[i * n + j]);
              }
              wrong += !(row_max[i] == expected);
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "rows over " << cases << " cases";
  EXPECT_EQ(changed, 0) << "elements of C that differ from the product without row_max";
  std::vector<float> a(4, 1.0f), packed(attnlab::cpu::f32_packed_size(2, 2)), c(4), row_max(2);
  attnlab::cpu::f32_pack_b(false, 2, 2, a.data(), 2, packed.data());
  EXPECT_THROW(attnlab::cpu::f32_gemm_packed(false, 2, 2, 2, 1.0f, a.data(), 2, packed.data(), 2,
                                             2, 0, 0.5f, c.data(), 2, row_max.data()),
               c10::Error);
}

// skip_hidden: every visible element of C and every row max as without it (bitwise), and the
// elements past what each block of 8 rows sees never written (they keep a sentinel); whole
// panels skipped in the causal-style cases that allow it.
TEST(F32Gemm, PackedSkipHiddenWritesEveryVisibleScoreAndOnlyThose) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_packed needs AVX-512";
  std::mt19937 rng(29);
  std::normal_distribution<float> normal;
  int cases = 0, wrong = 0, written_beyond = 0, skipped = 0;
  for (const int64_t m : {1, 8, 19, 64}) {
    for (const int64_t n : {16, 33, 64, 100, 512}) {
      for (const int64_t k : {24, 64}) {
        for (const int64_t visible : {int64_t(-9), int64_t(1), int64_t(17), int64_t(64)}) {
          std::vector<float> a(m * k), b(n * k), packed(attnlab::cpu::f32_packed_size(n, k));
          for (float& x : a) x = normal(rng);
          for (float& x : b) x = normal(rng);
          attnlab::cpu::f32_pack_b(true, n, k, b.data(), k, packed.data());
          std::vector<float> c(m * n, kSentinel), full(m * n), max_c(m), max_full(m);
          attnlab::cpu::f32_gemm_packed(false, m, n, k, 0.25f, a.data(), k, packed.data(), n, k,
                                        0, 0.0f, c.data(), n, max_c.data(), visible, true);
          attnlab::cpu::f32_gemm_packed(false, m, n, k, 0.25f, a.data(), k, packed.data(), n, k,
                                        0, 0.0f, full.data(), n, max_full.data(), visible);
          for (int64_t i = 0; i < m; ++i) {
            const int64_t seen = std::clamp<int64_t>(visible + i, 0, n);
            // The block's last row sees this many; its panels (32 columns) are computed.
            const int64_t last = std::min<int64_t>(i / 8 * 8 + 7, m - 1);
            const int64_t block_cols =
                std::min<int64_t>((std::clamp<int64_t>(visible + last, 0, n) + 31) / 32 * 32, n);
            for (int64_t j = 0; j < n; ++j) {
              const float x = c[i * n + j];
              if (j < seen) wrong += std::memcmp(&x, &full[i * n + j], sizeof(float)) != 0;
              if (j >= block_cols) {
                written_beyond += x != kSentinel;
                skipped += x == kSentinel;
              }
            }
            wrong += std::memcmp(&max_c[i], &max_full[i], sizeof(float)) != 0;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "visible elements or maxima over " << cases << " cases";
  EXPECT_EQ(written_beyond, 0);
  EXPECT_GT(skipped, 0);
}

// nonzero_k: with op(A)'s row i zero from column nonzero_k + i on, the rows product gives what
// it gives over the whole sum (0·b adds nothing for finite b), across the 64-column blocks and
// their narrower tail, chunks of the sum, row-block tails and beta.
TEST(F32Gemm, RowsProductSkipsOnlyZeroTerms) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_rows needs AVX-512";
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  int cases = 0, wrong = 0;
  for (const int64_t m : {1, 6, 17, 64}) {
    for (const int64_t n : {16, 64, 96, 160}) {
      for (const int64_t k : {5, 64, 300}) {
        for (const int64_t nonzero_k : {int64_t(1), int64_t(40), int64_t(130)}) {
          for (const float beta : {0.0f, 1.0f}) {
            std::vector<float> a(m * k), b(k * n);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t p = 0; p < k; ++p) a[i * k + p] = p < nonzero_k + i ? normal(rng) : 0.0f;
            }
            for (float& x : b) x = normal(rng);
            std::vector<float> c(m * n), full(m * n);
            for (int64_t i = 0; i < m * n; ++i) c[i] = full[i] = beta == 0.0f ? kNaN : normal(rng);
            attnlab::cpu::f32_gemm_rows(false, m, n, k, 1.0f, a.data(), k, b.data(), n, beta,
                                        c.data(), n, nonzero_k);
            attnlab::cpu::f32_gemm_rows(false, m, n, k, 1.0f, a.data(), k, b.data(), n, beta,
                                        full.data(), n);
            for (int64_t i = 0; i < m * n; ++i) wrong += !(c[i] == full[i]);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "elements over " << cases << " cases";
}

// Rows queued for prefetch (f32_prefetch_rows) are only hints: the products with row_max that
// issue them give the same bits as without a queue, whatever the regions (ragged, misaligned,
// strided, more than the queue holds, empty, or replaced by a null region).
TEST(F32Gemm, PrefetchedRowsChangeNoResult) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm_packed needs AVX-512";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  constexpr int64_t m = 19, n = 300, k = 64;
  std::vector<float> a(m * k), b(k * n), packed(attnlab::cpu::f32_packed_size(n, k));
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  attnlab::cpu::f32_pack_b(true, n, k, b.data(), k, packed.data());
  const auto product = [&](std::vector<float>& c, std::vector<float>& row_max) {
    c.assign(m * n, 0.0f);
    row_max.assign(m, 0.0f);
    attnlab::cpu::f32_gemm_packed(false, m, n, k, 0.125f, a.data(), k, packed.data(), n, k, 0,
                                  0.0f, c.data(), n, row_max.data(), 7);
  };
  std::vector<float> c0, max0, c, row_max;
  product(c0, max0);
  std::vector<float> source(4096 + 3);
  int differing = 0;
  const auto check = [&] {
    product(c, row_max);
    product(c, row_max);  // the rest of a queue longer than one product issues
    differing += std::memcmp(c.data(), c0.data(), c.size() * sizeof(float)) != 0;
    differing += std::memcmp(row_max.data(), max0.data(), m * sizeof(float)) != 0;
  };
  attnlab::cpu::f32_prefetch_rows(source.data() + 3, 1, 4000 * 4, 4000 * 4);
  check();
  attnlab::cpu::f32_prefetch_rows(source.data() + 1, 17, 100, 236);
  for (int i = 0; i < 6; ++i) {  // beyond the queue's regions
    attnlab::cpu::f32_prefetch_rows(source.data() + 5 * i, 9, 60, 60, true);
  }
  check();
  attnlab::cpu::f32_prefetch_rows(source.data(), 0, 64, 64);
  check();
  attnlab::cpu::f32_prefetch_rows(source.data(), 8, 256, 256);
  attnlab::cpu::f32_prefetch_rows(nullptr, 0, 0, 0);
  check();
  EXPECT_EQ(differing, 0);
}

// Deferred zeros (f32_defer_zeros): regions of rows written by the products that run while they
// are owed (part of them) and by f32_flush_zeros (the rest), exactly there and nowhere else; the
// products' results bitwise those of the same products without zeros owed; misaligned or ragged
// regions refused.
TEST(F32Gemm, DeferredZerosAreWrittenExactlyWhereOwed) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_defer_zeros needs AVX-512";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  constexpr int64_t kLd = 96, kRows = 40;
  // (first column, floats per row, rows) of two regions in one 64-byte-aligned buffer.
  struct Region { int64_t col, count, rows; };
  // f32_gemm, and f32_gemm_rows (whose 64-column blocks leave owed lines to its 8×2 panels).
  for (const bool rows_in_place : {false, true}) {
    const auto product = [&](int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                             float* c) {
      if (rows_in_place) {
        attnlab::cpu::f32_gemm_rows(false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
      } else {
        f32_gemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
      }
    };
    // k: few steps (most zeros left to the flush) to many
    for (const int64_t k : {2, 64, 300, 2000}) {
      attnlab::cpu::AlignedVector<float> memory(kLd * kRows, kNaN);
      const Region regions[] = {{16, 80, 20}, {48, 32, 15}};
      int64_t r0 = 0;
      for (const Region& z : regions) {  // the second region starts below the first
        attnlab::cpu::f32_defer_zeros(memory.data() + r0 * kLd + z.col, z.count, z.rows, kLd);
        r0 += z.rows + 2;
      }
      const int64_t m = 19, n = 64;
      std::vector<float> a(m * k), b(k * n), c(m * n), plain(m * n);
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      product(m, n, k, a.data(), b.data(), c.data());
      int64_t written = 0;  // zeros the product wrote
      for (float x : memory) written += x == 0.0f;
      attnlab::cpu::f32_flush_zeros();
      attnlab::cpu::f32_flush_zeros();  // nothing left: a second flush writes nothing
      product(m, n, k, a.data(), b.data(), plain.data());
      EXPECT_EQ(std::memcmp(c.data(), plain.data(), c.size() * sizeof(float)), 0)
          << "k " << k << " rows_in_place " << rows_in_place;
      int64_t owed = 0, misplaced = 0;
      r0 = 0;
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t col = 0; col < kLd; ++col) {
          bool zero = false;
          int64_t start = 0;
          for (const Region& z : regions) {
            zero = zero || (r >= start && r < start + z.rows && col >= z.col &&
                            col < z.col + z.count);
            start += z.rows + 2;
          }
          owed += zero;
          const float x = memory[r * kLd + col];
          misplaced += zero ? !(x == 0.0f) : !std::isnan(x);
        }
      }
      EXPECT_EQ(misplaced, 0) << "k " << k << " rows_in_place " << rows_in_place;
      // Each step of a sum over k writes at most one line in every block of 8 rows by 32 columns
      // (3 of them per 32 columns here, 2 column panels).
      EXPECT_LE(written, (k / 2) * 3 * 2 * 16) << "k " << k << " rows_in_place " << rows_in_place;
      if (k >= 300) {  // enough steps: none left to the flush
        EXPECT_EQ(written, owed) << "k " << k << " rows_in_place " << rows_in_place;
      }
      if (k == 2) EXPECT_LT(written, owed);
    }
  }
  alignas(64) float line[48];
  EXPECT_THROW(attnlab::cpu::f32_defer_zeros(line + 1, 16), c10::Error);
  EXPECT_THROW(attnlab::cpu::f32_defer_zeros(line, 8), c10::Error);
  EXPECT_THROW(attnlab::cpu::f32_defer_zeros(line, 16, 2, 8), c10::Error);
}

// Deferred scaled copies (f32_defer_scaled_rows) owed together with zeros: each destination
// row receives its source row times its factor, bitwise as a scalar multiply gives it, and
// nothing else is touched; the copies are written before the zeros (a product too short to
// write everything leaves only zeros owed); f32_flush_scaled_rows writes the copies and leaves
// the zeros to f32_flush_zeros; the products' results are unchanged; bad regions refused.
TEST(F32Gemm, DeferredScaledCopiesAreWrittenBeforeZerosAndExactlyWhereOwed) {
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_defer_scaled_rows needs AVX-512";
  std::mt19937 rng(29);
  std::normal_distribution<float> normal;
  constexpr int64_t kLd = 96, kLds = 64, kRows = 24, kCopyRows = 12, kCopyCols = 48;
  constexpr int64_t kZeroRow = 14, kZeroCol = 32, kZeroCount = 64, kZeroRows = 10;
  for (const int64_t k : {2, 24, 64, 2000}) {
    attnlab::cpu::AlignedVector<float> memory(kLd * kRows, kNaN), src(kLds * kCopyRows);
    for (float& x : src) x = normal(rng);
    std::vector<float> factors(kCopyRows);
    for (float& f : factors) f = std::abs(normal(rng)) + 0.1f;
    // The zeros are owed first, the copies after: the copies are still written first.
    attnlab::cpu::f32_defer_zeros(memory.data() + kZeroRow * kLd + kZeroCol, kZeroCount,
                                  kZeroRows, kLd);
    attnlab::cpu::f32_defer_scaled_rows(src.data(), kLds, factors.data(), memory.data(), kLd,
                                        kCopyCols, kCopyRows);
    const int64_t m = 19, n = 64;
    std::vector<float> a(m * k), b(k * n), c(m * n), plain(m * n);
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    f32_gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    const auto expected = [&](int64_t r, int64_t col) {
      if (r < kCopyRows && col < kCopyCols) return src[r * kLds + col] * factors[r];
      const bool zero = r >= kZeroRow && r < kZeroRow + kZeroRows && col >= kZeroCol &&
                        col < kZeroCol + kZeroCount;
      return zero ? 0.0f : kNaN;
    };
    // The lines written so far: copies (right value) and zeros (0).
    int64_t copied = 0, zeroed = 0, wrong = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t col = 0; col < kLd; ++col) {
        const float x = memory[r * kLd + col], want = expected(r, col);
        if (std::isnan(x)) continue;  // not written (yet)
        if (r < kCopyRows && col < kCopyCols) {
          copied += x == want;
          wrong += x != want;
        } else {
          zeroed += want == 0.0f && x == 0.0f;
          wrong += !(want == 0.0f && x == 0.0f);
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "k " << k;
    if (zeroed > 0) EXPECT_EQ(copied, kCopyRows * kCopyCols) << "k " << k;  // copies first
    if (k == 2) EXPECT_LT(copied, kCopyRows * kCopyCols);
    if (k == 2000) EXPECT_EQ(zeroed, kZeroRows * kZeroCount);
    attnlab::cpu::f32_flush_scaled_rows();
    int64_t copies_missing = 0;
    for (int64_t r = 0; r < kCopyRows; ++r) {
      for (int64_t col = 0; col < kCopyCols; ++col) {
        copies_missing += memory[r * kLd + col] != expected(r, col);
      }
    }
    EXPECT_EQ(copies_missing, 0) << "k " << k;
    if (k == 2) {  // the zeros are still owed, not written by the copies' flush
      EXPECT_TRUE(std::isnan(memory[(kZeroRow + kZeroRows - 1) * kLd + kZeroCol]));
    }
    attnlab::cpu::f32_flush_zeros();
    int64_t misplaced = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t col = 0; col < kLd; ++col) {
        const float x = memory[r * kLd + col], want = expected(r, col);
        misplaced += std::isnan(want) ? !std::isnan(x) : x != want;
      }
    }
    EXPECT_EQ(misplaced, 0) << "k " << k;
    f32_gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, plain.data(), n);
    EXPECT_EQ(std::memcmp(c.data(), plain.data(), c.size() * sizeof(float)), 0) << "k " << k;
  }
  alignas(64) float line[64];
  const float one = 1.0f;
  EXPECT_THROW(attnlab::cpu::f32_defer_scaled_rows(line + 1, 16, &one, line + 32, 16, 16, 1),
               c10::Error);  // misaligned source
  EXPECT_THROW(attnlab::cpu::f32_defer_scaled_rows(line, 16, &one, line + 33, 16, 16, 1),
               c10::Error);  // misaligned destination
  EXPECT_THROW(attnlab::cpu::f32_defer_scaled_rows(line, 16, &one, line + 32, 16, 8, 1),
               c10::Error);  // a partial line
  EXPECT_THROW(attnlab::cpu::f32_defer_scaled_rows(line, 16, &one, line + 32, 16, 32, 2),
               c10::Error);  // rows overlapping
}

// gemm_add (and f32_gemm_add under it): C = alpha·op(A)·op(B) + beta·D with D apart from C
// (rows ldd apart, or one bias row for all with ldd = 0) is, to the bit, gemm on a C filled
// with D first: sums of one chunk and of several (k > 256, where the later chunks must add to
// C and not to D again), all transposes, in float (attnlab's kernel) and double (the BLAS); D
// is left unchanged; beta = 0 ignores a NaN D.
template <typename T>
void expect_gemm_add_is_gemm_on_filled_c(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                         int64_t ldd, std::mt19937& rng) {
  std::normal_distribution<T> normal;
  const int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n + 3;
  std::vector<T> a(m * k), b(k * n), d(ldd == 0 ? n : m * ldd);
  for (std::vector<T>* v : {&a, &b, &d}) {
    for (T& x : *v) x = normal(rng);
  }
  const std::vector<T> d_before = d;
  std::vector<T> c(m * ldc, std::numeric_limits<T>::quiet_NaN()), filled = c;
  for (int64_t i = 0; i < m; ++i) {
    std::copy(d.data() + i * ldd, d.data() + i * ldd + n, filled.data() + i * ldc);
  }
  attnlab::cpu::gemm_add(ta, tb, m, n, k, T(0.5), a.data(), lda, b.data(), ldb, T(1.5),
                         d.data(), ldd, c.data(), ldc);
  attnlab::cpu::gemm(ta, tb, m, n, k, T(0.5), a.data(), lda, b.data(), ldb, T(1.5),
                     filled.data(), ldc);
  int64_t differ = 0;
  for (int64_t i = 0; i < m; ++i) {
    differ += std::memcmp(c.data() + i * ldc, filled.data() + i * ldc, n * sizeof(T)) != 0;
  }
  EXPECT_EQ(differ, 0) << sizeof(T) << "-byte, k " << k << " ta " << ta << " tb " << tb
                       << " ldd " << ldd;
  EXPECT_EQ(d, d_before);
}

TEST(F32Gemm, GemmAddIsGemmOnCFilledFromD) {
  std::mt19937 rng(31);
  for (const int64_t k : {7, 256, 600}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const int64_t ldd : {int64_t(0), int64_t(45 + 5)}) {
          expect_gemm_add_is_gemm_on_filled_c<float>(ta, tb, 21, 45, k, ldd, rng);
          expect_gemm_add_is_gemm_on_filled_c<double>(ta, tb, 21, 45, k, ldd, rng);
        }
      }
    }
  }
  // beta = 0: D not read (NaN there), C is the product alone.
  const float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, nan_row[2] = {kNaN, kNaN};
  float c[4];
  attnlab::cpu::gemm_add(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, nan_row, 0, c, 2);
  EXPECT_EQ(std::vector<float>(c, c + 4), std::vector<float>(a, a + 4));
}

TEST(F32Gemm, AttentionAndEncoderShapesMatchFloat64) {
  std::mt19937 rng(11);
  // The blocked attention's products (Q·Kᵀ, P·V, Pᵀ·dO, dS·K) and the encoder layer's
  // (X·Wᵀ, dYᵀ·X, dY·W), through f32_gemm and through gemm's routing.
  const Case cases[] = {
      {false, true, 64, 512, 64, 0.125f, 0.0f, 0}, {false, false, 64, 64, 512, 1.0f, 1.0f, 0},
      {true, false, 128, 64, 64, 1.0f, 1.0f, 0},   {false, false, 64, 64, 128, 0.125f, 1.0f, 0},
      {false, true, 320, 768, 256, 1.0f, 0.0f, 0}, {true, false, 256, 256, 320, 1.0f, 1.0f, 0},
      {false, false, 320, 256, 512, 1.0f, 0.0f, 3}, {true, false, 44, 64, 300, 1.0f, 0.0f, 64},
      {false, true, 300, 44, 63, 1.0f, 0.0f, 1},
  };
  for (const Case& t : cases) {
    if (f32_gemm_available()) EXPECT_EQ(run_case(f32_gemm, t, rng), 0);
    EXPECT_EQ(run_case(routed_gemm, t, rng), 0);
  }
}

TEST(F32Gemm, GemmRoutingKeepsTheContractAroundItsThresholds) {
  // Sizes on both sides of gemm's small-kernel and f32_gemm thresholds, beta = 0 over NaN.
  std::mt19937 rng(5);
  int wrong = 0;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const int64_t m : {63, 64, 65, 200}) {
        for (const int64_t n : {31, 64, 65, 520}) {
          wrong += run_case(routed_gemm, {trans_a, trans_b, m, n, 64, 1.0f, 0.0f, 2}, rng);
          wrong += run_case(routed_gemm, {trans_a, trans_b, m, n, 65, 0.5f, 2.0f, 0}, rng);
        }
      }
    }
  }
  // Either side of the longest sum gemm gives f32_gemm (4096; longer ones go to BLAS).
  for (const int64_t k : {4096, 4097}) {
    wrong += run_case(routed_gemm, {true, false, 9, 37, k, 1.0f, 0.0f, 1}, rng);
    wrong += run_case(routed_gemm, {false, true, 17, 5, k, -1.0f, 0.5f, 0}, rng);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(F32Gemm, EmptyProductsFollowGemm) {
  // k = 0: C = beta·C (cleared when beta = 0); m = 0 or n = 0: nothing written.
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm needs AVX-512 (gemm routes elsewhere)";
  attnlab_test::expect_empty_products_follow_gemm(f32_gemm);
}

TEST(F32Gemm, BetaZeroIgnoresInfAndNaNInC) {
  // beta = 0 must not read C: 0·Inf and 0·NaN would otherwise poison the result.
  const float a[2] = {1.0f, 2.0f}, b[2] = {3.0f, 4.0f};
  float c[2] = {std::numeric_limits<float>::infinity(), kNaN};
  if (!f32_gemm_available()) GTEST_SKIP() << "f32_gemm needs AVX-512 (gemm routes elsewhere)";
  f32_gemm(false, true, 1, 1, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 11.0f);
  EXPECT_TRUE(std::isnan(c[1]));  // beyond n = 1: untouched
}

TEST(F32Gemm, ReportsWhetherTheKernelRuns) {
  // On x86-64 with AVX-512 F/BW/VL/DQ the kernel must be chosen; elsewhere, under
  // ATTNLAB_CPU_ISA=avx2 and in the AVX2-only build, the BLAS fallback.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  const bool expected = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        !attnlab::cpu::cpu_isa_capped_at_avx2();
#else
  const bool expected = false;
#endif
  EXPECT_EQ(f32_gemm_available(), expected);
}

}  // namespace
