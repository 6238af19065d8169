// The FlashAttention-2-style CUDA forward (cpp/src/cuda/sdpa_flash.cuh), compiled as host C++
// and run on the warp emulator (tests/cpp/cuda_emulation): its tiling, swizzled shared memory,
// copy pipeline, fragment indexing, masking and online softmax, checked against a float64
// reference on this machine, which has no GPU. The tensor-core arithmetic itself (and timing,
// races, the real instructions' layouts) is checked on a GPU by
// tests/python/operator/test_attention_cuda.py.

#include "cuda_emulation/warp_emulator.h"
// The emulator first: it stands in for the device functions of warp_primitives.cuh.
#include "cuda/sdpa_flash.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace emulation = attnlab::cuda::emulation;
using attnlab::cuda::SdpaProblem;

struct FlashCase {
  std::vector<int64_t> batch;  // batch shape (one or two dimensions)
  int64_t len_q, len_k;
  bool causal = false;
  int64_t row_padding = 0;       // extra elements per row of Q, K and V (strided rows)
  bool broadcast_kv = false;     // K and V shared along the last batch dimension
  double scale_factor = 1.0;     // scale = scale_factor / sqrt(D)

  std::string name() const {
    std::string s = "batch";
    for (int64_t d : batch) s += " " + std::to_string(d);
    s += ", L_q " + std::to_string(len_q) + ", L_k " + std::to_string(len_k);
    if (causal) s += ", causal";
    if (row_padding) s += ", row padding " + std::to_string(row_padding);
    if (broadcast_kv) s += ", K/V broadcast";
    if (scale_factor != 1.0) s += ", scale x" + std::to_string(scale_factor);
    return s;
  }
};

// A [entries, len, row_stride] operand of random normal values, stored as T; `values` holds
// them exactly as stored (rounded), for the reference.
template <typename T>
struct Operand {
  std::vector<T> data;
  std::vector<double> values;
  int64_t row_stride;
};

template <typename T>
Operand<T> random_operand(int64_t entries, int64_t len, int64_t dim, int64_t row_stride,
                          std::mt19937& gen) {
  std::normal_distribution<float> normal;
  Operand<T> op{std::vector<T>(std::max<int64_t>(entries * len * row_stride, 1)),
                std::vector<double>(entries * len * dim), row_stride};
  // Padding between rows holds a NaN: the kernel must never read it.
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  std::fill(op.data.begin(), op.data.end(), nan);
  for (int64_t e = 0; e < entries; ++e) {
    for (int64_t r = 0; r < len; ++r) {
      for (int64_t c = 0; c < dim; ++c) {
        const T x = T(normal(gen));
        op.data[(e * len + r) * row_stride + c] = x;
        op.values[(e * len + r) * dim + c] = static_cast<float>(x);
      }
    }
  }
  return op;
}

// A case's inputs (random, rounded to T) and the problem description pointing at them.
template <typename T, int kHead>
struct FlashInputs {
  int64_t entries, kv_entries, last;
  Operand<T> q, k, v;
  SdpaProblem p;

  explicit FlashInputs(const FlashCase& c, std::mt19937& gen) {
    entries = 1;
    for (int64_t d : c.batch) entries *= d;
    last = c.batch.back();
    kv_entries = c.broadcast_kv ? entries / last : entries;
    const int64_t stride = kHead + c.row_padding;
    q = random_operand<T>(entries, c.len_q, kHead, stride, gen);
    k = random_operand<T>(kv_entries, c.len_k, kHead, stride, gen);
    v = random_operand<T>(kv_entries, c.len_k, kHead, stride, gen);
    p.batch = entries;
    p.len_q = c.len_q;
    p.len_k = c.len_k;
    p.dim_qk = p.dim_v = kHead;
    p.causal = c.causal;
    p.scale = static_cast<float>(c.scale_factor / std::sqrt(double(kHead)));
    p.shape.dims = static_cast<int>(c.batch.size());
    for (size_t d = 0; d < c.batch.size(); ++d) p.shape.sizes[d] = c.batch[d];
    describe(p.query, q, c.len_q, false, c);
    describe(p.key, k, c.len_k, c.broadcast_kv, c);
    describe(p.value, v, c.len_k, c.broadcast_kv, c);
  }

  // Row-major batch strides over the case's batch shape; the last dimension's is 0 when
  // broadcast.
  void describe(attnlab::cuda::MatrixOperand& op, const Operand<T>& src, int64_t len,
                bool broadcast, const FlashCase& c) const {
    op.data = src.data.data();
    op.row_stride = src.row_stride;
    op.col_stride = 1;
    int64_t s = len * src.row_stride;
    for (int d = p.shape.dims - 1; d >= 0; --d) {
      if (broadcast && d == p.shape.dims - 1) {
        op.batch_stride[d] = 0;
        continue;
      }
      op.batch_stride[d] = s;
      s *= c.batch[d];
    }
  }

  int64_t kv_entry(int64_t b) const { return entries != kv_entries ? b / last : b; }
};

// The float64 softmax row of query i of entry b: probabilities over the visible keys (the rest
// of `probs` is 0) and the log-sum-exp (−inf with no key).
template <typename T, int kHead>
double reference_row(const FlashInputs<T, kHead>& in, int64_t b, int64_t i, std::vector<double>& probs) {
  const SdpaProblem& p = in.p;
  const int64_t kb = in.kv_entry(b);
  const int64_t visible = p.causal ? std::min(p.len_k, i + 1) : p.len_k;
  std::fill(probs.begin(), probs.end(), 0.0);
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < visible; ++j) {
    double dot = 0;
    for (int d = 0; d < kHead; ++d) {
      dot += in.q.values[(b * p.len_q + i) * kHead + d] * in.k.values[(kb * p.len_k + j) * kHead + d];
    }
    probs[j] = dot * p.scale;
    max = std::max(max, probs[j]);
  }
  if (visible == 0) return -std::numeric_limits<double>::infinity();
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) sum += std::exp(probs[j] - max);
  for (int64_t j = 0; j < visible; ++j) probs[j] = std::exp(probs[j] - max) / sum;
  return max + std::log(sum);
}

// How a schedule reads in a failure's trace.
std::string schedule_name(const emulation::LaunchOptions& o) {
  switch (o.schedule) {
    case emulation::Schedule::kRoundRobin: return "round robin";
    case emulation::Schedule::kLowestFirst: return "lowest first";
    case emulation::Schedule::kHighestFirst: return "highest first";
    case emulation::Schedule::kRandom: return "random, seed " + std::to_string(o.seed);
  }
  return "?";
}

// weights_tolerance > 0: the kernel also writes the weights (its second pass over the keys),
// compared element by element with the float64 probabilities, hidden pairs exactly 0.
template <typename T, int kHead, int kRowsPerWarp, int kWarps = 4>
void check_flash_case(const FlashCase& c, double tolerance,
                      emulation::LaunchOptions options = {}, double weights_tolerance = 0) {
  SCOPED_TRACE(c.name() + ", " + std::to_string(kRowsPerWarp) + " rows per warp, " +
               std::to_string(kWarps) + " warps, " + schedule_name(options) +
               (weights_tolerance > 0 ? ", weights" : ""));
  using Tiles = attnlab::cuda::detail::FlashForwardTiles<kHead, kRowsPerWarp, kWarps>;
  std::mt19937 gen(static_cast<unsigned>(c.len_q * 131 + c.len_k * 7 + kHead + c.causal));
  const FlashInputs<T, kHead> in(c, gen);
  const SdpaProblem& p = in.p;
  const int64_t entries = in.entries;

  // Outputs poisoned (NaN), with a guard region after each that must stay untouched.
  constexpr int64_t kGuard = 64;
  const T poison = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> output(entries * c.len_q * kHead + kGuard, poison);
  std::vector<float> lse(entries * c.len_q + kGuard, std::numeric_limits<float>::quiet_NaN());
  const bool with_weights = weights_tolerance > 0;
  const int64_t weight_count = with_weights ? entries * c.len_q * c.len_k : 0;
  std::vector<T> weights(weight_count + kGuard, poison);
  const int64_t q_blocks = (c.len_q + Tiles::kBlockM - 1) / Tiles::kBlockM;
  emulation::launch(entries * q_blocks, Tiles::kThreads, Tiles::kSharedBytes, [&] {
    if (with_weights) {
      attnlab::cuda::detail::sdpa_flash_forward_kernel<T, kHead, kRowsPerWarp, true, kWarps>(
          p, output.data(), lse.data(), weights.data());
    } else {
      attnlab::cuda::detail::sdpa_flash_forward_kernel<T, kHead, kRowsPerWarp, false, kWarps>(
          p, output.data(), lse.data(), nullptr);
    }
  }, options);
  for (int64_t g = 0; g < kGuard; ++g) {
    ASSERT_TRUE(std::isnan(static_cast<float>(weights[weight_count + g])))
        << "weights guard element " << g << " was written";
  }

  for (int64_t g = 0; g < kGuard; ++g) {
    ASSERT_TRUE(std::isnan(static_cast<float>(output[entries * c.len_q * kHead + g])))
        << "output guard element " << g << " was written";
    ASSERT_TRUE(std::isnan(lse[entries * c.len_q + g])) << "lse guard element " << g;
  }
  double worst = 0, worst_lse = 0, worst_weight = 0;
  std::vector<double> probs(std::max<int64_t>(c.len_k, 1));
  for (int64_t b = 0; b < entries; ++b) {
    const int64_t kb = in.kv_entry(b);
    for (int64_t i = 0; i < c.len_q; ++i) {
      const double ref_lse = reference_row(in, b, i, probs);
      for (int64_t j = 0; with_weights && j < c.len_k; ++j) {
        const double got = static_cast<float>(weights[(b * c.len_q + i) * c.len_k + j]);
        ASSERT_FALSE(std::isnan(got)) << "weight not written (or NaN) at entry " << b << ", row "
                                      << i << ", key " << j;
        if (probs[j] == 0.0 && c.causal && j > i) {
          ASSERT_EQ(got, 0.0) << "hidden weight at entry " << b << ", row " << i << ", key " << j;
        }
        worst_weight = std::max(worst_weight, std::abs(got - probs[j]));
      }
      for (int d = 0; d < kHead; ++d) {
        double ref = 0;
        for (int64_t j = 0; j < c.len_k; ++j) ref += probs[j] * in.v.values[(kb * c.len_k + j) * kHead + d];
        const double got = static_cast<float>(output[(b * c.len_q + i) * kHead + d]);
        ASSERT_FALSE(std::isnan(got)) << "output not written (or NaN) at entry " << b << ", row "
                                      << i << ", column " << d;
        worst = std::max(worst, std::abs(got - ref));
      }
      const float got_lse = lse[b * c.len_q + i];
      ASSERT_FALSE(std::isnan(got_lse)) << "lse not written at entry " << b << ", row " << i;
      if (std::isinf(ref_lse)) {
        EXPECT_EQ(got_lse, -std::numeric_limits<float>::infinity());
      } else {
        worst_lse = std::max(worst_lse, std::abs(got_lse - ref_lse) / std::max(1.0, std::abs(ref_lse)));
      }
    }
  }
  EXPECT_LE(worst, tolerance) << "largest output error against the float64 reference";
  EXPECT_LE(worst_lse, 1e-5) << "largest relative log-sum-exp error";
  if (with_weights) {
    EXPECT_LE(worst_weight, weights_tolerance) << "largest weight error against float64";
  }
}

// The backward: dQ, dK, dV from the float64 reference's log-sum-exp and delta (as the forward
// and the delta kernel would give them), against the float64 gradients, relative to the
// largest reference value of each.
template <typename T, int kHead>
void check_flash_backward_case(const FlashCase& c, double tolerance,
                               emulation::LaunchOptions options = {}) {
  SCOPED_TRACE("backward, " + c.name() + ", " + schedule_name(options));
  using Tiles = attnlab::cuda::detail::FlashTiles<kHead>;
  using Layout = attnlab::cuda::detail::FlashBackwardTiles<kHead>;
  std::mt19937 gen(static_cast<unsigned>(c.len_q * 37 + c.len_k * 11 + kHead + c.causal));
  const FlashInputs<T, kHead> in(c, gen);
  const SdpaProblem& p = in.p;
  const int64_t entries = in.entries, kv_entries = in.kv_entries;
  // dO laid out like Q (same strides), random.
  const auto dout = random_operand<T>(entries, c.len_q, kHead, in.q.row_stride, gen);
  attnlab::cuda::MatrixOperand grad_output;
  in.describe(grad_output, dout, c.len_q, false, c);

  // Reference: P, O, lse, delta per row; then the gradients.
  const int64_t lq = c.len_q, lk = c.len_k;
  std::vector<double> P(entries * lq * std::max<int64_t>(lk, 1)), dq(entries * lq * kHead, 0.0),
      dk(kv_entries * lk * kHead, 0.0), dv(kv_entries * lk * kHead, 0.0);
  std::vector<float> lse(entries * lq), delta(entries * lq);
  std::vector<double> probs(std::max<int64_t>(lk, 1));
  for (int64_t b = 0; b < entries; ++b) {
    const int64_t kb = in.kv_entry(b);
    for (int64_t i = 0; i < lq; ++i) {
      lse[b * lq + i] = static_cast<float>(reference_row(in, b, i, probs));
      double dl = 0;
      for (int d = 0; d < kHead; ++d) {
        double o = 0;
        for (int64_t j = 0; j < lk; ++j) o += probs[j] * in.v.values[(kb * lk + j) * kHead + d];
        dl += o * dout.values[(b * lq + i) * kHead + d];
      }
      delta[b * lq + i] = static_cast<float>(dl);
      for (int64_t j = 0; j < lk; ++j) {
        if (probs[j] == 0) continue;
        double dp = 0;
        for (int d = 0; d < kHead; ++d) {
          dp += dout.values[(b * lq + i) * kHead + d] * in.v.values[(kb * lk + j) * kHead + d];
        }
        const double ds = probs[j] * (dp - dl);
        for (int d = 0; d < kHead; ++d) {
          dq[(b * lq + i) * kHead + d] += p.scale * ds * in.k.values[(kb * lk + j) * kHead + d];
          dk[(kb * lk + j) * kHead + d] += p.scale * ds * in.q.values[(b * lq + i) * kHead + d];
          dv[(kb * lk + j) * kHead + d] += probs[j] * dout.values[(b * lq + i) * kHead + d];
        }
      }
    }
  }

  // The kernels write dK and dV per batch entry (not summed over a broadcast: the caller sums).
  constexpr int64_t kGuard = 64;
  const T poison = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<float> accum(entries * lq * kHead + kGuard, 0.f);
  std::vector<T> grad_q(entries * lq * kHead + kGuard, poison);
  std::vector<T> grad_k(entries * lk * kHead + kGuard, poison), grad_v(grad_k);
  const int64_t k_blocks = (lk + Tiles::kBlockN - 1) / Tiles::kBlockN;
  emulation::launch(entries * k_blocks, Tiles::kThreads, Layout::kSharedBytes, [&] {
    attnlab::cuda::detail::sdpa_flash_backward_kernel<T, kHead>(
        p, grad_output, lse.data(), delta.data(), accum.data(), grad_k.data(), grad_v.data());
  }, options);
  const int64_t count = entries * lq * kHead;
  emulation::launch((count / 2 + 255) / 256, 256, 0, [&] {
    attnlab::cuda::detail::flash_grad_query_kernel<T>(accum.data(), p.scale, count,
                                                      grad_q.data());
  }, options);

  const auto compare = [&](const std::vector<T>& got, const std::vector<double>& ref,
                           int64_t rows, const char* what, auto ref_index) {
    for (int64_t g = 0; g < kGuard; ++g) {
      ASSERT_TRUE(std::isnan(static_cast<float>(got[rows * kHead + g])))
          << what << ": guard element " << g << " was written";
    }
    double worst = 0, largest = 1e-30;
    for (int64_t r = 0; r < rows; ++r) {
      for (int d = 0; d < kHead; ++d) {
        const double x = static_cast<float>(got[r * kHead + d]);
        ASSERT_FALSE(std::isnan(x)) << what << " not written (or NaN) at row " << r << ", column " << d;
        const double want = ref_index(r, d);
        worst = std::max(worst, std::abs(x - want));
        largest = std::max(largest, std::abs(want));
      }
    }
    EXPECT_LE(worst, tolerance * largest) << what << ": largest error against float64 (largest "
                                          << "reference value " << largest << ")";
  };
  compare(grad_q, dq, entries * lq, "grad_query",
          [&](int64_t r, int d) { return dq[r * kHead + d]; });
  // Per entry b, the reference sums over the broadcast entries sharing K and V: compare the
  // kernel's per-entry dK/dV summed the same way.
  if (entries == kv_entries) {
    compare(grad_k, dk, entries * lk, "grad_key", [&](int64_t r, int d) { return dk[r * kHead + d]; });
    compare(grad_v, dv, entries * lk, "grad_value", [&](int64_t r, int d) { return dv[r * kHead + d]; });
  } else {
    // Sum the kernel's rows over each group of `last` entries into T-free doubles.
    const int64_t last = in.last;
    double worst_k = 0, worst_v = 0, largest_k = 1e-30, largest_v = 1e-30;
    for (int64_t kb = 0; kb < kv_entries; ++kb) {
      for (int64_t j = 0; j < lk; ++j) {
        for (int d = 0; d < kHead; ++d) {
          double sk = 0, sv = 0;
          for (int64_t e = 0; e < last; ++e) {
            sk += static_cast<float>(grad_k[((kb * last + e) * lk + j) * kHead + d]);
            sv += static_cast<float>(grad_v[((kb * last + e) * lk + j) * kHead + d]);
          }
          const double rk = dk[(kb * lk + j) * kHead + d], rv = dv[(kb * lk + j) * kHead + d];
          worst_k = std::max(worst_k, std::abs(sk - rk));
          worst_v = std::max(worst_v, std::abs(sv - rv));
          largest_k = std::max(largest_k, std::abs(rk));
          largest_v = std::max(largest_v, std::abs(rv));
        }
      }
    }
    EXPECT_LE(worst_k, tolerance * largest_k) << "grad_key summed over the broadcast entries";
    EXPECT_LE(worst_v, tolerance * largest_v) << "grad_value summed over the broadcast entries";
  }
}

// Errors come from rounding P to T before P·V and the output to T: inputs N(0, 1), outputs of
// size about 1, so a few units in the last place of T. Indexing errors give errors of order 1.
constexpr double kHalfTolerance = 4e-3;
constexpr double kBfloat16Tolerance = 3e-2;
// Gradients, relative to the largest reference value: P and dS are rounded to T for the
// products, dQ is summed in float32 across key blocks.
constexpr double kHalfGradTolerance = 1e-2;
constexpr double kBfloat16GradTolerance = 5e-2;

std::vector<FlashCase> cases_for_head(int head) {
  std::vector<FlashCase> cases = {
      {{2}, 70, 130, false},                   // tiles cut both ways
      {{2}, 70, 130, true},
      {{1}, 130, 70, true},                    // more queries than keys, causal
      {{1}, 200, 260, true},                   // five key tiles: both buffers reused
      {{2, 3}, 64, 64, true, 0, true},         // exact tiles, K/V broadcast over the heads
      {{1}, 1, 1, false},                      // one query, one key
      {{1}, 65, 129, false, 24, false, -0.5},  // strided rows, negative scale
      {{2}, 9, 0, false},                      // no keys: zeros and lse −inf
      {{1}, 200, 256, true},                   // causal tiles past a block's rows, rows of 16 B
  };
  if (head == 128) cases.resize(5);  // the same code at a wider head: fewer cases
  return cases;
}

TEST(FlashEmulated, HalfHead64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance);
  }
}

TEST(FlashEmulated, Bfloat16Head64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_case<emulation::bfloat16, 64, 32>(c, kBfloat16Tolerance);
  }
}

TEST(FlashEmulated, HalfHead128) {
  for (const auto& c : cases_for_head(128)) {
    check_flash_case<emulation::half, 128, 16>(c, kHalfTolerance);
  }
}

TEST(FlashEmulated, Bfloat16Head128) {
  for (const auto& c : cases_for_head(128)) {
    check_flash_case<emulation::bfloat16, 128, 16>(c, kBfloat16Tolerance);
  }
}

// The weights, rounded to T once from float32 probabilities of at most 1: a few units in the
// last place of T (half: 2^-11, bfloat16: 2^-8) at most.
constexpr double kHalfWeightsTolerance = 1e-3;
constexpr double kBfloat16WeightsTolerance = 8e-3;

TEST(FlashEmulated, WeightsHalfHead64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance, {}, kHalfWeightsTolerance);
  }
}

TEST(FlashEmulated, WeightsBfloat16Head128) {
  for (const auto& c : cases_for_head(128)) {
    check_flash_case<emulation::bfloat16, 128, 16>(c, kBfloat16Tolerance, {},
                                                   kBfloat16WeightsTolerance);
  }
}

// Blocks of 8 warps (16 rows each, 128 rows per block), with and without weights.
TEST(FlashEmulated, EightWarpsHalfHead128) {
  for (const auto& c : cases_for_head(64)) {  // all eight cases at the wider head
    check_flash_case<emulation::half, 128, 16, 8>(c, kHalfTolerance);
    check_flash_case<emulation::half, 128, 16, 8>(c, kHalfTolerance, {}, kHalfWeightsTolerance);
  }
}

TEST(FlashEmulated, EightWarpsBfloat16Head64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_case<emulation::bfloat16, 64, 16, 8>(c, kBfloat16Tolerance);
    check_flash_case<emulation::bfloat16, 64, 16, 8>(c, kBfloat16Tolerance, {},
                                                     kBfloat16WeightsTolerance);
  }
}

TEST(FlashEmulated, BackwardHalfHead64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_backward_case<emulation::half, 64>(c, kHalfGradTolerance);
  }
}

TEST(FlashEmulated, BackwardBfloat16Head64) {
  for (const auto& c : cases_for_head(64)) {
    check_flash_backward_case<emulation::bfloat16, 64>(c, kBfloat16GradTolerance);
  }
}

TEST(FlashEmulated, BackwardHalfHead128) {
  for (const auto& c : cases_for_head(128)) {
    check_flash_backward_case<emulation::half, 128>(c, kHalfGradTolerance);
  }
}

TEST(FlashEmulated, BackwardBfloat16Head128) {
  for (const auto& c : cases_for_head(128)) {
    check_flash_backward_case<emulation::bfloat16, 128>(c, kBfloat16GradTolerance);
  }
}

// The other schedules let one warp run ahead of the others (or interleave them at random):
// a missing block_sync between a cp.async prefetch and the warps still reading the buffer it
// overwrites then shows as NaN (the 0xFF fill) or wrong values. A subset of the cases: the
// ones with several key tiles (buffers reused), ragged tiles and broadcast K/V.
std::vector<emulation::LaunchOptions> other_schedules() {
  return {{emulation::Schedule::kLowestFirst, 0},
          {emulation::Schedule::kHighestFirst, 0},
          {emulation::Schedule::kRandom, 12345}};
}

std::vector<FlashCase> schedule_cases() {
  const auto all = cases_for_head(64);
  return {all[0], all[3], all[4]};
}

TEST(FlashEmulated, HalfHead64OtherSchedules) {
  for (const auto& options : other_schedules()) {
    for (const auto& c : schedule_cases()) {
      check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance, options);
    }
  }
}

TEST(FlashEmulated, WeightsHalfHead64OtherSchedules) {
  for (const auto& options : other_schedules()) {
    for (const auto& c : schedule_cases()) {
      check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance, options, kHalfWeightsTolerance);
    }
  }
}

TEST(FlashEmulated, EightWarpsHalfHead128OtherSchedules) {
  for (const auto& options : other_schedules()) {
    for (const auto& c : schedule_cases()) {
      check_flash_case<emulation::half, 128, 16, 8>(c, kHalfTolerance, options,
                                                    kHalfWeightsTolerance);
    }
  }
}

TEST(FlashEmulated, BackwardHalfHead64OtherSchedules) {
  for (const auto& options : other_schedules()) {
    for (const auto& c : schedule_cases()) {
      check_flash_backward_case<emulation::half, 64>(c, kHalfGradTolerance, options);
    }
  }
}

// Random cases: batch shapes of one or two dimensions (K/V broadcast over the second or not),
// lengths 1 to 200 queries and 0 to 200 keys, causal or not, padded rows, scales of either sign.
std::vector<FlashCase> random_cases(int count, unsigned seed) {
  std::mt19937 gen(seed);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  constexpr double kScales[] = {1.0, 0.5, 2.0, -1.0};
  std::vector<FlashCase> cases;
  for (int n = 0; n < count; ++n) {
    FlashCase c;
    c.batch = uniform(0, 1) ? std::vector<int64_t>{uniform(1, 2)}
                            : std::vector<int64_t>{uniform(1, 2), uniform(2, 3)};
    c.len_q = uniform(1, 200);
    c.len_k = uniform(0, 200);
    c.causal = uniform(0, 1) == 1;
    c.row_padding = 8 * uniform(0, 2);
    c.broadcast_kv = c.batch.size() == 2 && uniform(0, 1) == 1;
    c.scale_factor = kScales[uniform(0, 3)];
    cases.push_back(c);
  }
  return cases;
}

TEST(FlashEmulated, RandomCasesHead64) {
  for (const auto& c : random_cases(24, 2024)) {
    check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance);
    check_flash_case<emulation::bfloat16, 64, 32>(c, kBfloat16Tolerance);
    check_flash_case<emulation::half, 64, 32>(c, kHalfTolerance, {}, kHalfWeightsTolerance);
    check_flash_backward_case<emulation::half, 64>(c, kHalfGradTolerance);
    check_flash_backward_case<emulation::bfloat16, 64>(c, kBfloat16GradTolerance);
  }
}

TEST(FlashEmulated, RandomCasesHead128) {
  for (const auto& c : random_cases(8, 128)) {
    check_flash_case<emulation::bfloat16, 128, 16>(c, kBfloat16Tolerance);
    check_flash_case<emulation::half, 128, 16>(c, kHalfTolerance);
    check_flash_case<emulation::half, 128, 16, 8>(c, kHalfTolerance, {}, kHalfWeightsTolerance);
    check_flash_backward_case<emulation::bfloat16, 128>(c, kBfloat16GradTolerance);
  }
}

}  // namespace
