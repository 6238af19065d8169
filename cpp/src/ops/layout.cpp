#include "ops/layout.h"

#include <limits>

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

}  // namespace attnlab
