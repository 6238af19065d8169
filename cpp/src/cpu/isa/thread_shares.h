#pragma once
// Work split among threads in proportion to how fast each thread ran its part in the last few
// calls, for regions whose parts cannot be handed out task by task (TaskRanges) because
// smaller parts would cost more: the encoder block runs each thread's rows as a few large
// GEMMs, and halving a thread's rows halves their height. The two vCPUs of the Intel Xeon host
// took 0.74–1.75× each other's time for the same rows (100-call windows of
// benchmarks/encoder_cpu.py), changing within seconds; a fixed even split waited for the slower one at every region's end. Hybrid
// CPUs (performance and efficiency cores) need the same.
//
// Only how much work each part gets changes, never what a row or column computes, so results
// stay bitwise the same from call to call wherever the work of a row or column does not depend
// on which part holds it (the callers' rows and columns are independent products and sums).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace attnlab::cpu {

class ThreadShares {
 public:
  static constexpr int64_t kMaxParts = 64;  // beyond: an even split
  // Weight of the newest call in the running estimate: about four calls to follow a change.
  static constexpr float kNewest = 0.25f;

  ThreadShares() {
    for (auto& w : weight_) w.store(1.0f, std::memory_order_relaxed);
  }

  // parts + 1 boundaries: part i takes [bounds[i], bounds[i + 1]) of `units`, in proportion
  // to its thread's recent speed; at least one unit each when units >= parts.
  std::vector<int64_t> split(int64_t units, int64_t parts) const {
    std::vector<int64_t> bounds(parts + 1, 0);
    std::vector<double> w(parts, 1.0);
    if (parts <= kMaxParts && parts_.load(std::memory_order_relaxed) == parts) {
      for (int64_t i = 0; i < parts; ++i) w[i] = weight_[i].load(std::memory_order_relaxed);
    }
    double total = 0;
    for (double x : w) total += x;
    double before = 0;
    for (int64_t i = 1; i < parts; ++i) {
      before += w[i - 1];
      const int64_t at = static_cast<int64_t>(static_cast<double>(units) * before / total + 0.5);
      const int64_t lo = std::min(bounds[i - 1] + 1, units), hi = std::max<int64_t>(units - (parts - i), 0);
      bounds[i] = std::clamp(at, std::min(lo, hi), hi);
    }
    bounds[parts] = units;
    return bounds;
  }

  // After a region that ran split(units, parts): seconds[i], the time part i took for its
  // units. Parts that got no units or took no measurable time leave the estimate as it is.
  void update(const std::vector<int64_t>& bounds, const double* seconds) {
    const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
    if (parts < 2 || parts > kMaxParts) return;
    std::vector<double> rate(parts, 0.0);
    double sum = 0;
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t units = bounds[i + 1] - bounds[i];
      if (units <= 0 || !(seconds[i] > 1e-7)) return;
      rate[i] = static_cast<double>(units) / seconds[i];
      sum += rate[i];
    }
    const bool fresh = parts_.exchange(parts, std::memory_order_relaxed) != parts;
    for (int64_t i = 0; i < parts; ++i) {
      // Relative speed (mean 1), bounded so that one preempted call cannot starve a thread.
      const float relative = std::clamp(static_cast<float>(rate[i] * parts / sum), 0.2f, 5.0f);
      const float old = fresh ? 1.0f : weight_[i].load(std::memory_order_relaxed);
      weight_[i].store(old + kNewest * (relative - old), std::memory_order_relaxed);
    }
  }

  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  // Relaxed atomics: calls from several threads at once may mix their updates, which costs at
  // most a less even split, never a wrong result.
  std::array<std::atomic<float>, kMaxParts> weight_;
  std::atomic<int64_t> parts_{0};
};

}  // namespace attnlab::cpu
