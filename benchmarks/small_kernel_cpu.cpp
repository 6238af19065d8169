// The register-resident small attention kernels (cpp/src/cpu/attention/small_attention.h) timed on their
// own: no operator, no Python, no threads. Built and run by benchmarks/small_kernel_cpu.sh.
//
//   small_kernel_cpu [--heads N] [--len L] [--dim E] [--weights] [--causal] [--avx2]
//
// Times the forward (optionally writing the weights) and the backward (reading the forward's
// probabilities, as the operator does at these sizes) over N contiguous heads of L query rows,
// L keys and E features, one sweep over all heads per call; prints the median µs per head of
// 41 timings of 20 sweeps each. --avx2 calls the 32-byte-vector copy directly (the CPU needs
// AVX2 and FMA); without it the entry points choose as the library does.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "timer_args.h"
#include "cpu/attention/small_attention.h"
#include "cpu/attention/softmax_rows.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double median_us_per_head(long heads, F&& sweep) {
  constexpr int kTimings = 41, kSweeps = 20;
  for (int i = 0; i < kSweeps; ++i) sweep();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < kTimings; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kSweeps; ++i) sweep();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                (double(kSweeps) * heads));
  }
  std::nth_element(t.begin(), t.begin() + kTimings / 2, t.end());
  return t[kTimings / 2];
}

constexpr const char* kProgram = "small_kernel_cpu";
constexpr const char* kOptions =
    "[--heads N] [--len L (1..16)] [--dim E (1..256)] [--weights] [--causal] [--avx2]";

[[noreturn]] void usage(const std::string& why) { timer_args::fail(kProgram, kOptions, why); }

long positive_arg(int& i, int argc, char** argv, long most) {
  return timer_args::positive(i, argc, argv, most, kProgram, kOptions);
}

}  // namespace

int main(int argc, char** argv) {
  namespace cpu = attnlab::cpu;
  long heads = 1024, len = 16, dim = 32;
  bool weights = false, causal = false, avx2 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--heads") heads = positive_arg(i, argc, argv, 1L << 20);
    else if (a == "--len") len = positive_arg(i, argc, argv, cpu::kSmallKeys<float>);
    else if (a == "--dim") dim = positive_arg(i, argc, argv, cpu::kSmallAttentionMaxDim);
    else if (a == "--weights") weights = true;
    else if (a == "--causal") causal = true;
    else if (a == "--avx2") avx2 = true;
    else usage("unknown argument " + a);
  }
  if (avx2 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    usage("--avx2 needs a CPU with AVX2 and FMA");
  }
  const auto rows = avx2 ? cpu::avx2::small_attention_rows
                         : static_cast<decltype(&cpu::avx2::small_attention_rows)>(
                               cpu::small_attention_rows);
  const auto backward = avx2 ? cpu::avx2::small_attention_backward
                             : static_cast<decltype(&cpu::avx2::small_attention_backward)>(
                                   cpu::small_attention_backward);
  const long head = len * dim;
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(heads * head), k(q.size()), v(q.size()), dout(q.size()), out(q.size()),
      dq(q.size()), dk(q.size()), dv(q.size()), lse(heads * len), probs(heads * len * len);
  for (auto* x : {&q, &k, &v, &dout}) {
    for (auto& y : *x) y = normal(gen);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int64_t visible_base = causal ? 1 : cpu::kAllVisible;
  const auto forward_sweep = [&](float* w) {
    for (long h = 0; h < heads; ++h) {
      rows(len, len, dim, dim, &q[h * head], dim, &k[h * head], dim, &v[h * head], dim, nullptr,
           0, visible_base, scale, &out[h * head], dim, &lse[h * len],
           w ? w + h * len * len : nullptr, len);
    }
  };
  const double fwd = median_us_per_head(heads, [&] { forward_sweep(weights ? probs.data() : nullptr); });
  forward_sweep(probs.data());  // the probabilities the backward reads
  const double bwd = median_us_per_head(heads, [&] {
    for (long h = 0; h < heads; ++h) {
      backward(len, len, dim, dim, &q[h * head], dim, &k[h * head], dim, &v[h * head], dim,
               nullptr, 0, visible_base, scale, &dout[h * head], dim, &lse[h * len],
               &probs[h * len * len], &dq[h * head], dim, &dk[h * head], dim, &dv[h * head], dim,
               nullptr, nullptr);
    }
  });
  std::printf("heads %ld, (%ld rows, %ld keys, %ld features)%s%s, %s: forward %.4f us/head, "
              "backward %.4f us/head\n",
              heads, len, len, dim, causal ? ", causal" : "", weights ? ", weights" : "",
              avx2 ? "AVX2 copy" : "library's choice", fwd, bwd);
  return 0;
}
