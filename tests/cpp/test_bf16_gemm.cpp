// The bfloat16 GEMM (cpu/gemm/bf16_gemm.h) against a float64 product of the operands rounded to
// bfloat16 here, independently: every transpose combination, ragged sizes around the register
// block and vector widths, odd k, alpha/beta (beta = 0 over NaN), padded leading dimensions.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "gemm_contract.h"

#include "cpu/gemm/gemm.h"

namespace {

using attnlab::cpu::bf16_gemm;
using attnlab::cpu::bf16_gemm_available;
using attnlab::cpu::bf16_products;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.0f;  // fills the padding beyond n in every row of C

// x rounded to the nearest bfloat16 (ties to even), for finite x.
double to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t lower = bits & 0xFFFFu, keep = bits >> 16;
  uint32_t rounded = keep;
  if (lower > 0x8000u || (lower == 0x8000u && (keep & 1u))) rounded += 1;
  bits = rounded << 16;
  float y;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

#define SKIP_WITHOUT_BF16()                                                                 \
  if (!bf16_gemm_available()) {                                                             \
    GTEST_SKIP() << "this CPU lacks AVX512-BF16: gemm_bf16_operands runs the float32 gemm "  \
                    "(BF16Gemm.WithoutAvx512Bf16IsTheFloatGemm covers that)";               \
  }

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
  int64_t pad;  // added to every leading dimension
};

// Runs one case on random normal operands; returns the number of wrong elements (reported).
int run_case(const Case& t, bool rounded, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const int64_t lda = (t.trans_a ? t.m : t.k) + t.pad, ldb = (t.trans_b ? t.k : t.n) + t.pad;
  const int64_t ldc = t.n + t.pad;
  std::vector<float> a((t.trans_a ? t.k : t.m) * lda), b((t.trans_b ? t.n : t.k) * ldb);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  std::vector<float> c(t.m * ldc, kSentinel), c0(t.m * ldc, kSentinel);
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) c0[i * ldc + j] = t.beta == 0.0f ? kNaN : normal(rng);
  }
  c = c0;
  // The route kernels take: bf16_gemm where the CPU has AVX512-BF16, else the float32 gemm.
  attnlab::cpu::gemm_bf16_operands(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a.data(), lda,
                                   b.data(), ldb, t.beta, c.data(), ldc);
  const auto round = [&](float x) { return rounded ? to_bf16(x) : static_cast<double>(x); };
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
        const double x = round(t.trans_a ? a[p * lda + i] : a[i * lda + p]);
        const double y = round(t.trans_b ? b[j * ldb + p] : b[p * ldb + j]);
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      const double old = t.beta == 0.0f ? 0.0 : static_cast<double>(c0[i * ldc + j]);
      const double expected = t.alpha * sum + t.beta * old;
      // float32 sums of exact products: a few ulps per term at worst
      const double scale = std::fabs(t.alpha) * magnitude + std::fabs(t.beta * old);
      const double bound = 2e-7 * static_cast<double>(t.k + 2) * scale + 1e-30;
      if (!(std::fabs(got - expected) <= bound)) {
        if (wrong < 3) {
          ADD_FAILURE() << "trans_a " << t.trans_a << " trans_b " << t.trans_b << " m " << t.m
                        << " n " << t.n << " k " << t.k << " beta " << t.beta << " at (" << i
                        << ", " << j << "): " << got << " vs " << expected;
        }
        ++wrong;
      }
    }
  }
  return wrong;
}

TEST(BF16Gemm, RaggedShapesAllTransposesMatchRoundedFloat64) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(7);
  int cases = 0, wrong = 0;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const int64_t m : {1, 7, 8, 15, 17, 33}) {
        for (const int64_t n : {1, 15, 16, 17, 33, 64}) {
          for (const int64_t k : {1, 2, 15, 17, 33, 64}) {
            const int64_t pad = (m + n + k) % 3 == 0 ? 0 : 5;
            wrong += run_case({trans_a, trans_b, m, n, k, 1.0f, 0.0f, pad}, true, rng);
            wrong += run_case({trans_a, trans_b, m, n, k, 0.75f, -1.5f, pad + 3}, true, rng);
            cases += 2;
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "over " << cases << " cases";
}

TEST(BF16Gemm, AttentionBlockShapesMatchRoundedFloat64) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(11);
  // The blocked attention kernel's products: Q·Kᵀ, P·V, Pᵀ·dO, dSᵀ·Q, dS·K, and a ragged tail.
  EXPECT_EQ(run_case({false, true, 256, 512, 64, 0.125f, 0.0f, 0}, true, rng), 0);
  EXPECT_EQ(run_case({false, false, 256, 64, 512, 1.0f, 1.0f, 0}, true, rng), 0);
  EXPECT_EQ(run_case({true, false, 128, 64, 64, 1.0f, 1.0f, 0}, true, rng), 0);
  EXPECT_EQ(run_case({false, false, 64, 64, 128, 0.125f, 1.0f, 0}, true, rng), 0);
  EXPECT_EQ(run_case({true, false, 44, 64, 300, 1.0f, 0.0f, 64}, true, rng), 0);
  EXPECT_EQ(run_case({false, true, 300, 44, 63, 1.0f, 0.0f, 1}, true, rng), 0);
}

TEST(BF16Gemm, RoundsOperandsToNearestEven) {
  SKIP_WITHOUT_BF16();
  // bfloat16 keeps 8 significant bits: in [1, 2) its spacing is 2⁻⁷.
  const float h = std::ldexp(1.0f, -8);  // half the spacing: a tie
  const float cases[][2] = {
      {1.0f + h, 1.0f},                                   // tie, even below
      {1.0f + 3 * h, 1.0f + 4 * h},                       // tie, even above
      {1.0f + h + std::ldexp(1.0f, -20), 1.0f + 2 * h},   // just above the tie
      {-(1.0f + h), -1.0f},                               // sign kept
      {1.0f + h - std::ldexp(1.0f, -20), 1.0f},           // just below the tie
  };
  for (const auto& [x, rounded] : cases) {
    const float one = 1.0f;
    float c = kNaN;
    bf16_gemm(false, false, 1, 1, 1, 1.0f, &x, 1, &one, 1, 0.0f, &c, 1);  // A rounded
    EXPECT_EQ(c, rounded) << x;
    c = kNaN;
    bf16_gemm(true, true, 1, 1, 1, 1.0f, &one, 1, &x, 1, 0.0f, &c, 1);  // B rounded
    EXPECT_EQ(c, rounded) << x;
  }
}

TEST(BF16Gemm, EmptyProductsFollowGemm) {
  // k = 0: C = beta·C (cleared when beta = 0); m = 0 or n = 0: nothing written.
  SKIP_WITHOUT_BF16();
  attnlab_test::expect_empty_products_follow_gemm(bf16_gemm);
}

// ctest runs this suite twice: as is, and with ATTNLAB_CPU_BRGEMM=1 (BF16Gemm.ThroughOneDnnBrgemm),
// where the products go through torch's oneDNN brgemm on attnlab's packed operands, the route
// CPUs with AMX take by default. Then the route must really be taken: its start-up check against
// the register blocks would otherwise have turned it off.
TEST(BF16Gemm, TakesTheRouteAskedFor) {
  SKIP_WITHOUT_BF16();
  const char* env = std::getenv("ATTNLAB_CPU_BRGEMM");
  const std::string route = bf16_products();
  if (env != nullptr && std::string(env) == "1") {
    EXPECT_TRUE(route == "onednn_brgemm" || route == "amx") << route;
  } else if (env != nullptr && std::string(env) == "0") {
    EXPECT_EQ(route, "avx512_bf16");
  } else {
    EXPECT_TRUE(route == "avx512_bf16" || route == "amx") << route;
  }
}

TEST(BF16Gemm, WithoutAvx512Bf16IsTheFloatGemm) {
  if (bf16_gemm_available()) {
    GTEST_SKIP() << "this CPU has AVX512-BF16: the rounding tests above cover bf16_gemm";
  }
  std::mt19937 rng(3);
  int wrong = 0;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      wrong += run_case({trans_a, trans_b, 33, 17, 15, 1.0f, 0.0f, 2}, false, rng);
      wrong += run_case({trans_a, trans_b, 70, 130, 64, 0.5f, 2.0f, 0}, false, rng);
    }
  }
  EXPECT_EQ(wrong, 0);
}

}  // namespace

// bf16_gemm_prepacked (the attention forward's products against K and V packed once per head)
// against the same float64 product of rounded operands: sub-blocks of the packed B at column
// offsets n0 and even row offsets k0, odd k ending on the packed end (its zero padding), a
// power-of-two alpha (folded into A) and another (applied to C), accumulation, and C's columns
// beyond n untouched.
TEST(BF16Gemm, PrepackedSubBlocksMatchRoundedFloat64) {
  using attnlab::cpu::bf16_gemm_prepacked;
  using attnlab::cpu::bf16_pack_b;
  using attnlab::cpu::bf16_packed_ld;
  using attnlab::cpu::bf16_packed_pairs;
  if (!attnlab::cpu::bf16_prepacked_route()) {
    GTEST_SKIP() << "this CPU runs no bfloat16 products (" << bf16_products()
                 << "): the attention widens to float32 there";
  }
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  struct Sub {
    bool trans_b;
    int64_t full_k, full_n, m, k0, k, n0, n;
    float alpha;
    bool accumulate;
  };
  const Sub subs[] = {
      {true, 64, 512, 64, 0, 64, 0, 512, 0.125f, false},    // Q·Kᵀ, one key block
      {true, 64, 300, 16, 0, 64, 37, 200, 0.125f, false},   // a causal group's keys
      {true, 33, 70, 5, 0, 33, 16, 54, 0.17f, false},       // odd head size, other scale
      {false, 512, 64, 64, 0, 512, 0, 64, 1.0f, false},     // P·V
      {false, 300, 64, 16, 128, 172, 0, 64, 1.0f, true},    // a later key block, accumulated
      {false, 301, 48, 9, 100, 201, 0, 48, 1.0f, true},     // odd k ending on the packed end
      {false, 301, 48, 9, 100, 200, 8, 40, 1.0f, false},    // even k inside, column offset
  };
  for (const Sub& t : subs) {
    SCOPED_TRACE("trans_b " + std::to_string(t.trans_b) + ", B " + std::to_string(t.full_k) +
                 "x" + std::to_string(t.full_n) + ", k0 " + std::to_string(t.k0) + ", k " +
                 std::to_string(t.k) + ", n0 " + std::to_string(t.n0) + ", n " +
                 std::to_string(t.n) + ", alpha " + std::to_string(t.alpha));
    const int64_t ldb = t.trans_b ? t.full_k : t.full_n;  // B as stored: Kᵀ's rows are K's
    std::vector<float> b((t.trans_b ? t.full_n : t.full_k) * ldb);
    for (float& x : b) x = normal(rng);
    std::vector<uint32_t> packed(bf16_packed_pairs(t.full_k, t.full_n));
    bf16_pack_b(t.trans_b, t.full_k, t.full_n, b.data(), ldb, packed.data());
    const int64_t lda = t.k + 3, ldc = t.n + 5;
    std::vector<float> a(t.m * lda), c(t.m * ldc, kSentinel);
    for (float& x : a) x = normal(rng);
    std::vector<double> old(t.m * t.n, 0.0);
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        c[i * ldc + j] = t.accumulate ? normal(rng) : kNaN;
        old[i * t.n + j] = t.accumulate ? c[i * ldc + j] : 0.0;
      }
    }
    bf16_gemm_prepacked(t.m, t.n, t.k, t.alpha, a.data(), lda, packed.data(),
                        bf16_packed_ld(t.full_n), t.k0, t.n0, t.accumulate, c.data(), ldc);
    int wrong = 0;
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = c[i * ldc + j];
        if (j >= t.n) {
          if (got != kSentinel) ++wrong;
          continue;
        }
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < t.k; ++p) {
          const int64_t row = t.k0 + p, col = t.n0 + j;  // of op(B)
          const double x = to_bf16(a[i * lda + p]);
          const double y = to_bf16(t.trans_b ? b[col * ldb + row] : b[row * ldb + col]);
          sum += x * y;
          magnitude += std::fabs(x * y);
        }
        const double expected = t.alpha * sum + old[i * t.n + j];
        const double bound = 2e-7 * static_cast<double>(t.k + 2) *
                                 (std::fabs(t.alpha) * magnitude + std::fabs(old[i * t.n + j])) +
                             1e-30;
        if (!(std::fabs(got - expected) <= bound)) {
          if (wrong < 3) ADD_FAILURE() << "at (" << i << ", " << j << "): " << got << " vs " << expected;
          ++wrong;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

namespace {

uint16_t bf16_bits(double rounded) {  // the bits of a value already rounded by to_bf16
  const float f = static_cast<float>(rounded);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

double from_bits(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

// bf16_pack_b of bfloat16 rows (packed as they are) lays out the same words as bf16_pack_b of
// the same values in float32, for K (transposed) and V, odd k and n included.
TEST(BF16Gemm, PackFromBfloat16MatchesPackFromFloat) {
  using attnlab::cpu::bf16_pack_b;
  using attnlab::cpu::bf16_packed_pairs;
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  for (const bool trans_b : {false, true}) {
    for (const auto& [k, n] : {std::pair<int64_t, int64_t>{64, 512}, {33, 70}, {301, 48}, {1, 5}}) {
      SCOPED_TRACE("trans_b " + std::to_string(trans_b) + ", k " + std::to_string(k) + ", n " +
                   std::to_string(n));
      const int64_t rows = trans_b ? n : k, cols = trans_b ? k : n, ld = cols + 3;
      std::vector<float> wide(rows * ld);
      std::vector<uint16_t> bits(rows * ld);
      for (int64_t i = 0; i < rows * ld; ++i) {
        const double x = to_bf16(normal(rng));
        wide[i] = static_cast<float>(x);
        bits[i] = bf16_bits(x);
      }
      std::vector<uint32_t> from_float(bf16_packed_pairs(k, n), 7u), from_bits(from_float);
      bf16_pack_b(trans_b, k, n, wide.data(), ld, from_float.data());
      bf16_pack_b(trans_b, k, n, bits.data(), ld, from_bits.data());
      int wrong = 0;
      for (size_t i = 0; i < from_float.size(); ++i) wrong += from_float[i] != from_bits[i];
      EXPECT_EQ(wrong, 0);
    }
  }
}

// bf16_pack_rows16 with a power-of-two alpha: each value times alpha, exactly; an odd k's last
// pair padded with 0; other alphas refused.
TEST(BF16Gemm, PackRows16ScalesByPowersOfTwoExactly) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(22);
  std::normal_distribution<float> normal;
  const int64_t m = 5, k = 37, lda = 40, ldo = 38;
  std::vector<uint16_t> a(m * lda);
  for (auto& h : a) h = bf16_bits(to_bf16(normal(rng)));
  std::vector<uint16_t> out(m * ldo, 0xFFFF);
  attnlab::cpu::bf16_pack_rows16(m, k, 0.125f, a.data(), lda, out.data(), ldo);
  int wrong = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < k; ++c) wrong += from_bits(out[i * ldo + c]) != 0.125 * from_bits(a[i * lda + c]);
    wrong += out[i * ldo + k] != 0;  // the padding of the odd k
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_THROW(attnlab::cpu::bf16_pack_rows16(m, k, 0.3f, a.data(), lda, out.data(), ldo),
               c10::Error);
}

// bf16_gemm_prepacked16 on bfloat16 A rows: every k, odd ones inside the packed B too, where
// the pair's other row holds inf and NaN that must not reach C (its term is added on its own),
// alpha applied after, accumulation; against float64.
TEST(BF16Gemm, Prepacked16AnyKLeavesTheNextRowUnread) {
  using attnlab::cpu::bf16_gemm_prepacked16;
  using attnlab::cpu::bf16_pack_b;
  using attnlab::cpu::bf16_packed_ld;
  using attnlab::cpu::bf16_packed_pairs;
  if (!attnlab::cpu::bf16_prepacked_route()) {
    GTEST_SKIP() << "this CPU runs no bfloat16 products (" << bf16_products() << ")";
  }
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  const int64_t full_k = 64, n = 48, ldb = n, ldo = bf16_packed_ld(n);
  std::vector<float> b(full_k * ldb);
  for (float& x : b) x = static_cast<float>(to_bf16(normal(rng)));
  struct Sub {
    int64_t m, k0, k;
    float alpha;
    bool accumulate;
  };
  const Sub subs[] = {{16, 0, 1, 1.0f, false}, {16, 2, 17, 1.0f, true}, {7, 10, 31, 0.3f, false},
                      {64, 0, 64, 1.0f, false}, {3, 40, 24, 1.0f, true}, {9, 4, 1, 1.0f, true}};
  for (const Sub& t : subs) {
    SCOPED_TRACE("m " + std::to_string(t.m) + ", k0 " + std::to_string(t.k0) + ", k " +
                 std::to_string(t.k) + ", alpha " + std::to_string(t.alpha));
    std::vector<float> poisoned = b;
    if (t.k0 + t.k < full_k) {  // the row after the product's last: never to be multiplied
      for (int64_t j = 0; j < n; ++j) poisoned[(t.k0 + t.k) * ldb + j] = j % 2 ? kNaN : INFINITY;
    }
    std::vector<uint32_t> packed(bf16_packed_pairs(full_k, n));
    bf16_pack_b(false, full_k, n, poisoned.data(), ldb, packed.data());
    const int64_t lda = t.k + 5, ldc = n + 2;
    std::vector<uint16_t> a(t.m * lda);
    for (auto& h : a) h = bf16_bits(to_bf16(normal(rng)));
    std::vector<float> c(t.m * ldc, kSentinel);
    std::vector<double> old(t.m * n, 0.0);
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        c[i * ldc + j] = t.accumulate ? normal(rng) : kNaN;
        old[i * n + j] = t.accumulate ? c[i * ldc + j] : 0.0;
      }
    }
    bf16_gemm_prepacked16(t.m, n, t.k, t.alpha, a.data(), lda, packed.data(), ldo, t.k0, 0,
                          t.accumulate, c.data(), ldc);
    int wrong = 0;
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = c[i * ldc + j];
        if (j >= n) {
          wrong += got != kSentinel;
          continue;
        }
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < t.k; ++p) {
          const double x = from_bits(a[i * lda + p]) * b[(t.k0 + p) * ldb + j];
          sum += x;
          magnitude += std::fabs(x);
        }
        const double expected = t.alpha * sum + old[i * n + j];
        const double bound =
            2e-7 * static_cast<double>(t.k + 2) *
                (std::fabs(t.alpha) * magnitude + std::fabs(old[i * n + j])) + 1e-30;
        if (!(std::fabs(got - expected) <= bound)) {
          if (wrong < 3) ADD_FAILURE() << "at (" << i << ", " << j << "): " << got << " vs " << expected;
          ++wrong;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}
