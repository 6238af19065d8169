// The branch-free float exp and log of the CPU kernels against the C library in double, and the
// softmax rows' exp (its AVX-512 form where the CPU has it) likewise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/gemm/bf16_gemm.h"
#include "cpu/attention/softmax_rows.h"
#include "cpu/isa/vec_math.h"

namespace {

using attnlab::cpu::exp_nonpositive;
using attnlab::cpu::log_positive;

TEST(VecMath, LogPositiveWithin2e7RelativeFromOneToHuge) {
  // Every softmax sum the kernels take the log of is >= 1; the domain is wider (normal x > 0).
  double worst = 0.0, worst_absolute = 0.0;
  for (float x = std::numeric_limits<float>::min(); x < 3e38f; x *= 1.0001271f) {
    const double exact = std::log(static_cast<double>(x));
    const double error = std::fabs(static_cast<double>(log_positive(x)) - exact);
    if (std::fabs(exact) > 1e-3) {
      worst = std::max(worst, error / std::fabs(exact));
    } else {
      worst_absolute = std::max(worst_absolute, error);
    }
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_LT(worst_absolute, 1e-7);  // near x = 1, where log x -> 0
  EXPECT_EQ(log_positive(1.0f), 0.0f);
  EXPECT_NEAR(log_positive(2.0f), std::log(2.0), 1e-7);
  // sums just either side of the √2 split
  for (float x : {1.41421f, 1.41422f, 2.82842f, 2.82843f, 16.0f}) {
    EXPECT_NEAR(log_positive(x), std::log(static_cast<double>(x)), 2e-7 * std::log(x)) << x;
  }
}

TEST(VecMath, LogPositivePassesInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(log_positive(inf), inf);
  EXPECT_TRUE(std::isnan(log_positive(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, ExpNonpositiveWithin3e7RelativeAndZeroBelowRange) {
  double worst = 0.0;
  for (float x = 0.0f; x > -87.0f; x -= 0.00137f) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_nonpositive(x) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-200.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

// probs_from_lse with lse = 0 is exp of each score: the path the attention backward (and, with
// the same exp, the forward's online softmax) takes, on AVX-512 where the CPU has it. A row of
// odd length, so its last vector is partial.
TEST(VecMath, SoftmaxRowExpWithin3e7RelativeZeroBelowRangeNaNKept) {
  std::vector<float> x;
  for (float v = 0.0f; v > -87.0f; v -= 0.00137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {-87.5f, -100.0f, -1e30f, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(v);
  }
  if (x.size() % 16 == 0) x.push_back(-1.0f);
  const std::vector<float> in = x;
  const float lse = 0.0f;
  attnlab::cpu::probs_from_lse(x.data(), 1, static_cast<int64_t>(x.size()),
                               static_cast<int64_t>(x.size()), nullptr, 0,
                               attnlab::cpu::kAllVisible, &lse);
  double worst = 0.0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(x[i])) << i;
    } else if (in[i] < -87.0f) {
      EXPECT_EQ(x[i], 0.0f) << in[i];
    } else {
      const double exact = std::exp(static_cast<double>(in[i]));
      worst = std::max(worst, std::fabs(x[i] - exact) / exact);
      EXPECT_TRUE(std::isnormal(x[i])) << in[i];
    }
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(x[0], 1.0f);
}

// The online softmax over a row in two blocks, at every width from 1 to 40 per block (whole and
// partial vectors, padded or not): the row max, the sum of exp(s − max) and the correction
// against double, with a NaN anywhere in the row carried into the sum rather than skipped.
TEST(VecMath, OnlineSoftmaxTwoBlocksMatchDoubleAndKeepNaN) {
  constexpr int64_t kLd = 48;
  for (int64_t cols = 1; cols <= 40; ++cols) {
    for (int nan_at = -1; nan_at < 2; ++nan_at) {  // -1: none; 0 / 1: in the first / second block
      float row_max = -std::numeric_limits<float>::infinity(), row_sum = 0.0f, correction = -1.0f;
      double exact_max = -std::numeric_limits<double>::infinity();
      std::vector<std::vector<float>> blocks(2, std::vector<float>(kLd, 123.0f));
      for (int blk = 0; blk < 2; ++blk) {
        for (int64_t c = 0; c < cols; ++c) {
          blocks[blk][c] = std::sin(0.37f * static_cast<float>(c + 41 * blk)) * (3.0f + blk);
          exact_max = std::max(exact_max, static_cast<double>(blocks[blk][c]));
        }
      }
      if (nan_at >= 0) blocks[nan_at][cols / 2] = std::numeric_limits<float>::quiet_NaN();
      double exact_sum = 0.0;
      for (int blk = 0; blk < 2; ++blk) {
        for (int64_t c = 0; c < cols; ++c) exact_sum += std::exp(blocks[blk][c] - exact_max);
      }
      float first_max = 0.0f;
      for (int blk = 0; blk < 2; ++blk) {
        attnlab::cpu::online_softmax_block(blocks[blk].data(), 1, cols, kLd, nullptr, 0,
                                           attnlab::cpu::kAllVisible, &row_max, &row_sum,
                                           &correction);
        if (blk == 0) {
          if (nan_at < 0) EXPECT_EQ(correction, 0.0f) << cols;  // nothing to rescale yet
          first_max = row_max;
        }
      }
      if (nan_at >= 0) {
        EXPECT_TRUE(std::isnan(row_sum)) << cols << " " << nan_at;
        continue;
      }
      EXPECT_EQ(row_max, static_cast<float>(exact_max)) << cols;
      EXPECT_NEAR(row_sum, exact_sum, 1e-6 * exact_sum) << cols;
      EXPECT_NEAR(correction, std::exp(static_cast<double>(first_max) - row_max), 1e-6) << cols;
    }
  }
}

// online_softmax_block_bf16 (P in bfloat16 for the products): per row the max, the sum of the
// unrounded exp(s − max) within 1e-5 of double, P within bfloat16's rounding of the exact value
// (2^-8, plus the exp's own 1e-5), columns the causal mask hides 0 up to cols,
// a row that sees nothing all 0, a NaN row NaN.
TEST(VecMath, OnlineSoftmaxBf16WritesRoundedProbabilities) {
  if (!attnlab::cpu::bf16_gemm_available()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  constexpr int64_t kLd = 48, kRows = 5;
  for (int64_t cols = 1; cols <= 40; ++cols) {
    std::vector<float> s(kRows * kLd, 55.0f);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        s[r * kLd + c] = std::sin(0.37f * static_cast<float>(c + 7 * r)) * (2.0f + r) + 20.0f;
      }
    }
    if (cols > 3) s[4 * kLd + 2] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> scores = s;
    std::vector<float> row_max(kRows, -std::numeric_limits<float>::infinity());
    std::vector<float> row_sum(kRows, 0.0f), correction(kRows, -1.0f);
    std::vector<uint16_t> p16(kRows * kLd, 0xABCD);
    // causal-style visibility: row r sees its first r + cols − 3 columns (row 0 with cols < 3:
    // none)
    attnlab::cpu::online_softmax_block_bf16(s.data(), kRows, cols, kLd, nullptr, 0, cols - 3,
                                            row_max.data(), row_sum.data(), correction.data(),
                                            p16.data(), kLd);
    for (int64_t r = 0; r < kRows; ++r) {
      SCOPED_TRACE("cols " + std::to_string(cols) + ", row " + std::to_string(r));
      const int64_t visible = std::clamp<int64_t>(cols - 3 + r, 0, cols);
      const auto p = [&](int64_t c) {
        const uint32_t bits = static_cast<uint32_t>(p16[r * kLd + c]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
      };
      if (r == 4 && cols > 3 && visible > 2) {  // the NaN is visible: the row is NaN
        EXPECT_TRUE(std::isnan(row_sum[r]));
        continue;
      }
      double exact_max = -std::numeric_limits<double>::infinity(), exact_sum = 0.0;
      for (int64_t c = 0; c < visible; ++c) exact_max = std::max<double>(exact_max, scores[r * kLd + c]);
      for (int64_t c = 0; c < visible; ++c) exact_sum += std::exp(scores[r * kLd + c] - exact_max);
      if (visible == 0) {
        EXPECT_EQ(row_sum[r], 0.0f);
        for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(p(c), 0.0f) << c;
        continue;
      }
      EXPECT_EQ(row_max[r], static_cast<float>(exact_max));
      EXPECT_NEAR(row_sum[r], exact_sum, 1e-5 * exact_sum);
      for (int64_t c = 0; c < visible; ++c) {
        const double exact = std::exp(scores[r * kLd + c] - exact_max);
        EXPECT_NEAR(p(c), exact, (1.0 / 256 + 1e-5) * exact) << c;
      }
      for (int64_t c = visible; c < cols; ++c) EXPECT_EQ(p(c), 0.0f) << c;
    }
  }
}

}  // namespace
