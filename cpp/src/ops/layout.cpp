#include "ops/layout.h"

#include <cmath>
#include <cstdint>
#include <limits>

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

at::Tensor empty_weights(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor weights = at::empty(shape, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t(1) << 21;
  const auto begin = reinterpret_cast<uintptr_t>(weights.data_ptr());
  const uintptr_t end = begin + weights.nbytes();
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = end & ~(kHugePage - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
  return weights;
}

}  // namespace attnlab
