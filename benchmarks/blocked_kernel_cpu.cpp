// The CPU attention kernels' entry points (cpp/src/cpu/attention/attention_kernel.h) timed on their own:
// attnlab::cpu::attention_forward and attention_backward on raw float32 buffers, without the
// operator, Python or autograd; the blocked path, or the small kernels where every key fits in
// a vector (up to 16 keys: benchmarks/small_kernel_cpu.sh times those without the task split).
// Built and run by benchmarks/blocked_kernel_cpu.sh.
//
//   blocked_kernel_cpu [--heads N] [--len L] [--len-k LK] [--dim E] [--threads T] [--backward]
//                      [--weights]
//
// Times a problem of N contiguous heads (L query rows, LK keys, E features) with the causal
// mask and without it, alternately in one process (causal, plain, causal per round, 61 rounds
// after 5 of warm-up), and prints each one's median time, its rate over the pairs it must
// compute (4·L·LK·E FLOPs per head forward, 2.5× that more backward; under the causal mask only
// the visible pairs count), and the median of the per-round ratios causal / plain. That ratio
// moves far less than either time on a shared host: a slow spell slows both. --backward times
// the backward (reading the forward's output and log-sum-exp) instead of the forward. --weights:
// the forward also writes the normalized weights [N, L, LK], which the backward then reads
// instead of recomputing the probabilities (as the operator does with need_weights=True).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "timer_args.h"
#include "cpu/attention/attention_kernel.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kProgram = "blocked_kernel_cpu";
constexpr const char* kOptions =
    "[--heads N] [--len L] [--len-k LK] [--dim E] [--threads T] [--backward] [--weights]";

[[noreturn]] void usage(const std::string& why) { timer_args::fail(kProgram, kOptions, why); }

long positive_arg(int& i, int argc, char** argv, long most) {
  return timer_args::positive(i, argc, argv, most, kProgram, kOptions);
}

// The CPU's model name as /proc/cpuinfo gives it ("unknown" elsewhere).
std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      return line.substr(line.find(':') + 2);
    }
  }
  return "unknown";
}

double median(std::vector<double> x) {
  std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  namespace cpu = attnlab::cpu;
  long heads = 64, len = 512, len_k = 0, dim = 64, threads = 1;
  bool backward = false, with_weights = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--heads") heads = positive_arg(i, argc, argv, 1L << 16);
    else if (a == "--len") len = positive_arg(i, argc, argv, 1L << 16);
    else if (a == "--len-k") len_k = positive_arg(i, argc, argv, 1L << 16);
    else if (a == "--dim") dim = positive_arg(i, argc, argv, 1024);
    else if (a == "--threads") threads = positive_arg(i, argc, argv, 1024);
    else if (a == "--backward") backward = true;
    else if (a == "--weights") with_weights = true;
    else usage("unknown argument " + a);
  }
  if (len_k == 0) len_k = len;
  if (double(heads) * std::max(len, len_k) * dim > 1e9 ||
      (with_weights && double(heads) * len * len_k > 1e9)) {
    usage("the problem is too large");
  }
  at::set_num_threads(static_cast<int>(threads));

  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(heads * len * dim), k(heads * len_k * dim), v(k.size()), dout(q.size()),
      out(q.size()), lse(heads * len), dq(q.size()), dk(k.size()), dv(k.size()),
      weights(with_weights ? heads * len * len_k : 0);
  float* const w = with_weights ? weights.data() : nullptr;
  for (auto* x : {&q, &k, &v, &dout}) {
    for (auto& y : *x) y = normal(gen);
  }
  std::vector<int64_t> q_offsets(heads), k_offsets(heads);
  for (long h = 0; h < heads; ++h) {
    q_offsets[h] = h * len * dim;
    k_offsets[h] = h * len_k * dim;
  }
  cpu::AttentionProblem<float> p;
  p.batch = heads;
  p.len_q = len;
  p.len_k = len_k;
  p.dim_qk = p.dim_v = dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(dim));
  p.query = {q.data(), q_offsets.data(), dim};
  p.key = {k.data(), k_offsets.data(), dim};
  p.value = {v.data(), k_offsets.data(), dim};
  const cpu::BatchedRows<float> grad_output{dout.data(), q_offsets.data(), dim};

  // One call, ms. The backward reads the forward of the same mask, run just before it.
  const auto call = [&](bool causal) {
    p.causal = causal;
    if (backward) cpu::attention_forward<float>(p, out.data(), lse.data(), w);
    const auto t0 = Clock::now();
    if (backward) {
      cpu::attention_backward<float>(p, grad_output, out.data(), lse.data(), w, dq.data(),
                                     dk.data(), dv.data(), nullptr, nullptr);
    } else {
      cpu::attention_forward<float>(p, out.data(), lse.data(), w);
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (int i = 0; i < 5; ++i) {
    call(true);
    call(false);
  }
  std::vector<double> causal_ms, plain_ms, ratio;
  for (int i = 0; i < 61; ++i) {
    const double a = call(true), b = call(false), c = call(true);
    causal_ms.push_back(a);
    causal_ms.push_back(c);
    plain_ms.push_back(b);
    ratio.push_back((a + c) / 2 / b);
  }
  // The pairs each must compute: every one, or under the causal mask those with j <= i.
  const double all_pairs = double(len) * len_k;
  double visible_pairs = 0;
  for (long i = 0; i < len; ++i) visible_pairs += double(std::min(i + 1, len_k));
  const double flops_per_pair = 4.0 * dim * (backward ? 2.5 : 1.0) * heads;
  const double causal_t = median(causal_ms), plain_t = median(plain_ms);
  std::printf("%s (%s), heads %ld, (%ld rows, %ld keys, %ld features), %s%s, %ld thread%s:\n",
              cpu_model().c_str(),
              __builtin_cpu_supports("avx512f") ? "AVX-512"
              : __builtin_cpu_supports("avx2")  ? "AVX2"
                                                : "no AVX2",
              heads, len, len_k, dim, backward ? "backward" : "forward",
              with_weights ? " with weights" : "", threads,
              threads == 1 ? "" : "s");
  std::printf("  causal %.3f ms (%.0f GFLOP/s)  plain %.3f ms (%.0f GFLOP/s)  causal/plain %.4f\n",
              causal_t, visible_pairs * flops_per_pair / causal_t / 1e6, plain_t,
              all_pairs * flops_per_pair / plain_t / 1e6, median(ratio));
  return 0;
}
