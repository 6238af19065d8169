// The branch-free float exp and log of the CPU kernels against the C library in double.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "cpu/vec_math.h"

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

}  // namespace
