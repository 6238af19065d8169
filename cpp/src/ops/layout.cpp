#include "ops/layout.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace attnlab {

std::vector<int64_t> with_tail(at::IntArrayRef batch, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> shape(batch.begin(), batch.end());
  shape.insert(shape.end(), tail);
  return shape;
}

at::Tensor additive_mask(const at::Tensor& mask, const at::Tensor& query, int64_t len_k) {
  at::Tensor m = mask;
  while (m.dim() < 2) m = m.unsqueeze(0);
  if (m.scalar_type() == at::kBool) {
    m = at::where(m, at::zeros({}, query.options()),
                  at::full({}, -std::numeric_limits<double>::infinity(), query.options()));
  } else {
    m = m.to(query.scalar_type());
  }
  if (m.size(-1) != len_k || (len_k > 1 && m.stride(-1) != 1)) {
    std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
    shape.back() = len_k;
    m = m.expand(shape).contiguous();
  }
  return m;
}

double resolve_scale(std::optional<double> scale, int64_t dim_qk) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(dim_qk));
}

at::Tensor rows_contiguous(const at::Tensor& t) {
  const bool inner_ok = t.size(-1) <= 1 || t.stride(-1) == 1;
  const bool rows_ok = t.size(-2) <= 1 || t.stride(-2) >= t.size(-1);
  return inner_ok && rows_ok ? t : t.contiguous();
}

namespace {

// Freed weight buffers, kept for the next call that needs as many bytes. A buffer of tens of
// MiB is otherwise mapped fresh by every call and the kernel zeroes each of its pages on first
// touch: at (8, 8, 512, 64) that zeroing was 60 % of what need_weights added to a forward.
// At most kMaxBlocks buffers and kMaxHeld bytes wait here; the oldest go back to the system.
class WeightsPool {
 public:
  static WeightsPool& instance() {
    static auto* pool = new WeightsPool;  // never destroyed: tensors may outlive static exit
    return *pool;
  }

  // A buffer of at least `bytes` (and `capacity` bytes in all): a kept one when one of
  // between 1 and 2 times the size waits, else a new one on huge pages where the kernel has
  // them.
  void* take(size_t bytes, size_t& capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= bytes && it->second <= 2 * bytes &&
            (best == free_.end() || it->second < best->second)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        void* data = best->first;
        capacity = best->second;
        held_ -= capacity;
        free_.erase(best);
        return data;
      }
    }
    capacity = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* data = nullptr;
    if (posix_memalign(&data, kHugePage, capacity) != 0) data = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, "attnlab.scaled_dot_product_attention: could not "
                      "allocate ", capacity, " bytes for the attention weights or the widened "
                      "inputs");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(data, capacity, MADV_HUGEPAGE);
#endif
    return data;
  }

  void give(void* data, size_t capacity) {
    std::vector<void*> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.emplace_back(data, capacity);
      held_ += capacity;
      while (free_.size() > kMaxBlocks || held_ > kMaxHeld) {
        release.push_back(free_.front().first);
        held_ -= free_.front().second;
        free_.erase(free_.begin());
      }
    }
    for (void* block : release) std::free(block);
  }

  static constexpr size_t kHugePage = size_t(1) << 21;
  static constexpr size_t kMaxBlocks = 4;
  static constexpr size_t kMaxHeld = size_t(512) << 20;

 private:
  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> free_;  // oldest first
  size_t held_ = 0;
};

}  // namespace

namespace {

// A buffer from the pool (CPU only).
at::Tensor pooled_empty(at::IntArrayRef shape, const at::TensorOptions& options) {
  const size_t bytes = c10::multiply_integers(shape) * options.dtype().itemsize();
  size_t capacity = 0;
  void* data = WeightsPool::instance().take(bytes, capacity);
  return at::from_blob(
      data, shape, [capacity](void* block) { WeightsPool::instance().give(block, capacity); },
      options);
}

}  // namespace

at::Tensor empty_weights(at::IntArrayRef shape, const at::TensorOptions& options) {
  const size_t bytes = c10::multiply_integers(shape) * options.dtype().itemsize();
  // Below 2 MiB malloc keeps freed memory for reuse itself.
  if (options.device().type() != at::kCPU || bytes < WeightsPool::kHugePage) {
    return at::empty(shape, options);
  }
  return pooled_empty(shape, options);
}

std::vector<at::Tensor> widened_to_float(std::initializer_list<at::Tensor> tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  const auto options = tensors.begin()->options().dtype(at::kFloat);
  // Small ones: malloc keeps freed memory for reuse itself.
  at::Tensor buffer = total * 4 < (int64_t(256) << 10)
                          ? at::empty({total}, options)
                          : pooled_empty({total}, options);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    out.push_back(buffer.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t));
    offset += t.numel();
  }
  return out;
}

}  // namespace attnlab
