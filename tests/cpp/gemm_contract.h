#pragma once
// Checks that attnlab's GEMM kernels share with cpu::gemm's contract, for any of them.
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace attnlab_test {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);

// k = 0: C = beta·C (cleared when beta = 0, NaN included); m = 0 or n = 0: nothing written.
inline void expect_empty_products_follow_gemm(GemmFn gemm) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kUntouched = -12345.0f;
  std::vector<float> c = {kNaN, kNaN, 3.0f, -1.0f};
  const float a = 1.0f, b = 1.0f;
  gemm(false, false, 1, 2, 0, 1.0f, &a, 1, &b, 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_EQ(c[1], 0.0f);
  gemm(false, false, 1, 2, 0, 1.0f, &a, 1, &b, 2, 2.0f, c.data() + 2, 2);
  EXPECT_EQ(c[2], 6.0f);
  EXPECT_EQ(c[3], -2.0f);
  float untouched = kUntouched;
  gemm(false, false, 0, 1, 4, 1.0f, &a, 4, &b, 1, 0.0f, &untouched, 1);
  gemm(false, false, 1, 0, 4, 1.0f, &a, 4, &b, 1, 0.0f, &untouched, 1);
  EXPECT_EQ(untouched, kUntouched);
}

}  // namespace attnlab_test
