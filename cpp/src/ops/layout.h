#pragma once
// Tensors laid out for the CPU kernels: batch shapes, strided batches of rows, additive masks.
// Shared by the attention and encoder-block operators.

#include <initializer_list>
#include <vector>

#include <ATen/ATen.h>

#include "cpu/attention_kernel.h"

namespace attnlab {

// batch followed by tail.
std::vector<int64_t> with_tail(at::IntArrayRef batch, std::initializer_list<int64_t> tail);

// The mask as an additive mask of the inputs' dtype whose key dimension is contiguous;
// the query and batch dimensions may still broadcast.
at::Tensor additive_mask(const at::Tensor& mask, const at::Tensor& query, int64_t len_k);

// A tensor of shape [..., L, C] seen as the rows of the batch `batch`, without copying
// broadcast or strided batch dimensions. `offsets` keeps one element offset per batch entry.
template <typename T>
cpu::BatchedRows<T> batched_rows(const at::Tensor& t, at::IntArrayRef batch,
                                 std::vector<int64_t>& offsets) {
  const at::Tensor e = t.expand(with_tail(batch, {t.size(-2), t.size(-1)}));
  const int64_t dims = static_cast<int64_t>(batch.size());
  offsets.assign(c10::multiply_integers(batch), 0);
  std::vector<int64_t> index(dims, 0);
  int64_t offset = 0;
  for (auto& o : offsets) {
    o = offset;
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++index[d] < e.size(d)) {
        offset += e.stride(d);
        break;
      }
      offset -= e.stride(d) * (e.size(d) - 1);
      index[d] = 0;
    }
  }
  const int64_t row_stride = e.size(-2) <= 1 ? std::max<int64_t>(1, e.size(-1)) : e.stride(-2);
  return {e.data_ptr<T>(), offsets.data(), row_stride};
}

}  // namespace attnlab
