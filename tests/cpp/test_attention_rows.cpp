// attention_forward_rows / attention_backward_rows: the small kernels writing their outputs at
// any row layout (the encoder block's heads side by side in its token rows). Each must give
// bitwise what the contiguous attention_forward / attention_backward give, touch nothing
// between its rows, and refuse a problem the small kernels do not take.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "cpu/attention/attention_kernel.h"

namespace {

using attnlab::cpu::AttentionProblem;
using attnlab::cpu::BatchedRows;
using attnlab::cpu::OutputRows;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Heads side by side: entry (b, h) of B·H reads its rows from a [B·L, 3·H·D] buffer at
// columns h·3D (q), h·3D + D (k), h·3D + 2D (v), as the encoder block lays them out.
struct SideBySide {
  int64_t batch, heads, len, dim;
  std::vector<float> qkv;
  std::vector<int64_t> q_off, k_off, v_off, out_off, dense_qk, dense_v;
  AttentionProblem<float> p;

  SideBySide(int64_t b_, int64_t h_, int64_t l_, int64_t d_, std::mt19937& rng)
      : batch(b_), heads(h_), len(l_), dim(d_), qkv(b_ * l_ * 3 * h_ * d_) {
    std::normal_distribution<float> normal;
    for (float& x : qkv) x = normal(rng);
    const int64_t width = 3 * heads * dim;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = b * len * width + h * 3 * dim;
        q_off.push_back(base);
        k_off.push_back(base + dim);
        v_off.push_back(base + 2 * dim);
        out_off.push_back(b * len * heads * dim + h * dim);
        dense_qk.push_back((b * heads + h) * len * dim);
        dense_v.push_back((b * heads + h) * len * dim);
      }
    }
    p.batch = batch * heads;
    p.len_q = p.len_k = len;
    p.dim_qk = p.dim_v = dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    p.query = {qkv.data(), q_off.data(), width};
    p.key = {qkv.data(), k_off.data(), width};
    p.value = {qkv.data(), v_off.data(), width};
  }
  int64_t entries() const { return batch * heads; }
  // Element (entry, row, col) of a side-by-side [B·L, row_width] buffer at these offsets.
  float at(const std::vector<float>& buf, const std::vector<int64_t>& off, int64_t width,
           int64_t i, int64_t r, int64_t c) const {
    return buf[off[i] + r * width + c];
  }
};

TEST(AttentionRows, ForwardAndBackwardMatchTheContiguousFormsBitwise) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const auto& [b, h, l, d] : std::vector<std::array<int64_t, 4>>{
           {3, 4, 10, 64}, {2, 1, 16, 32}, {2, 3, 7, 24}}) {
    SideBySide s(b, h, l, d, rng);
    ASSERT_TRUE(attnlab::cpu::attention_is_small(s.p));
    const int64_t n = s.entries() * l * d, out_width = h * d, qkv_width = 3 * h * d;

    // Forward: into [B·L, H·D] token rows (NaN elsewhere: none may be left or written over).
    std::vector<float> dense(n), lse(s.entries() * l), lse_rows(s.entries() * l);
    attnlab::cpu::attention_forward(s.p, dense.data(), lse.data(), static_cast<float*>(nullptr));
    std::vector<float> rows(n, kNaN);
    attnlab::cpu::attention_forward_rows(s.p, OutputRows<float>{rows.data(), s.out_off.data(),
                                                                out_width},
                                         lse_rows.data());
    int64_t differ = 0;
    for (int64_t i = 0; i < s.entries(); ++i) {
      for (int64_t r = 0; r < l; ++r) {
        for (int64_t c = 0; c < d; ++c) {
          const float x = s.at(rows, s.out_off, out_width, i, r, c);
          differ += std::memcmp(&x, &dense[(i * l + r) * d + c], sizeof(float)) != 0;
        }
      }
    }
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(std::memcmp(lse.data(), lse_rows.data(), lse.size() * sizeof(float)), 0);

    // Backward: the gradients into the side-by-side qkv layout.
    std::vector<float> grad_out(n);
    for (float& x : grad_out) x = normal(rng);
    const BatchedRows<float> dout{grad_out.data(), s.dense_v.data(), d};
    std::vector<float> dq(n), dk(n), dv(n);
    attnlab::cpu::attention_backward(s.p, dout, dense.data(), lse.data(),
                                     static_cast<const float*>(nullptr), dq.data(), dk.data(),
                                     dv.data(), static_cast<float*>(nullptr),
                                     static_cast<float*>(nullptr));
    std::vector<float> dqkv(s.qkv.size(), kNaN);
    const auto qkv_rows = [&](const std::vector<int64_t>& off) {
      return OutputRows<float>{dqkv.data(), off.data(), qkv_width};
    };
    attnlab::cpu::attention_backward_rows(s.p, dout, lse.data(), qkv_rows(s.q_off),
                                          qkv_rows(s.k_off), qkv_rows(s.v_off));
    differ = 0;
    for (int64_t i = 0; i < s.entries(); ++i) {
      for (int64_t r = 0; r < l; ++r) {
        for (int64_t c = 0; c < d; ++c) {
          const int64_t dense_at = (i * l + r) * d + c;
          const float gq = s.at(dqkv, s.q_off, qkv_width, i, r, c);
          const float gk = s.at(dqkv, s.k_off, qkv_width, i, r, c);
          const float gv = s.at(dqkv, s.v_off, qkv_width, i, r, c);
          differ += std::memcmp(&gq, &dq[dense_at], sizeof(float)) != 0;
          differ += std::memcmp(&gk, &dk[dense_at], sizeof(float)) != 0;
          differ += std::memcmp(&gv, &dv[dense_at], sizeof(float)) != 0;
        }
      }
    }
    EXPECT_EQ(differ, 0) << b << "x" << h << "x" << l << "x" << d;
    int64_t nan_left = 0;  // every element of the qkv layout is some head's q, k or v
    for (float x : dqkv) nan_left += std::isnan(x);
    EXPECT_EQ(nan_left, 0);
  }
}

TEST(AttentionRows, RefusesProblemsTheSmallKernelsDoNotTake) {
  std::mt19937 rng(6);
  SideBySide s(1, 1, 40, 32, rng);  // 40 keys: more than one vector holds
  EXPECT_FALSE(attnlab::cpu::attention_is_small(s.p));
  std::vector<float> out(40 * 32), lse(40);
  EXPECT_THROW(attnlab::cpu::attention_forward_rows(
                   s.p, OutputRows<float>{out.data(), s.out_off.data(), 32}, lse.data()),
               c10::Error);
  const BatchedRows<float> dout{out.data(), s.dense_v.data(), 32};
  const OutputRows<float> grad{out.data(), s.out_off.data(), 32};
  EXPECT_THROW(attnlab::cpu::attention_backward_rows(s.p, dout, lse.data(), grad, grad, grad),
               c10::Error);
}

}  // namespace
