#pragma once
// Tensors laid out for the CPU kernels: batch shapes, strided batches of rows, additive masks,
// the weights buffer and a whole attention problem. Shared by the attention (softmax and sparse)
// and encoder-block operators.

#include <initializer_list>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include "cpu/attention/attention_kernel.h"

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
  // The strides of t expanded to the batch, without making the view (which took a dispatcher
  // call and a tensor per operand).
  const auto shape = with_tail(batch, {t.size(-2), t.size(-1)});
  const auto e = at::inferExpandGeometry_dimvector(t.sizes(), t.strides(), shape);
  const auto& strides = e.strides;
  const int64_t dims = static_cast<int64_t>(batch.size());
  offsets.assign(c10::multiply_integers(batch), 0);
  std::vector<int64_t> index(dims, 0);
  int64_t offset = 0;
  for (auto& o : offsets) {
    o = offset;
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
  const int64_t row_stride =
      shape[dims] <= 1 ? std::max<int64_t>(1, shape[dims + 1]) : strides[dims];
  const T* data;
  if constexpr (std::is_same_v<T, uint16_t>) {
    data = static_cast<const uint16_t*>(t.const_data_ptr());  // float16/bfloat16 bits
  } else {
    data = t.data_ptr<T>();
  }
  return {data, offsets.data(), row_stride};
}

// The softmax scale: `scale`, else 1/sqrt(dim_qk).
double resolve_scale(std::optional<double> scale, int64_t dim_qk);

// Keeps t's memory when each matrix row is contiguous and rows do not overlap, so that BLAS can
// use the row stride as its leading dimension; copies otherwise.
at::Tensor rows_contiguous(const at::Tensor& t);

// An empty CPU tensor for the attention weights, or another buffer whose every element the
// kernels write before reading it (the encoder block's activations).
// Large ones come from a small pool of freed weight buffers (at most 4 and 512 MiB wait
// there), else from new memory on transparent huge pages where the kernel allows it: fresh
// pages cost a page fault and the kernel's zeroing each, several times the normalizer itself.
at::Tensor empty_weights(at::IntArrayRef shape, const at::TensorOptions& options);

// float32 copies of CPU tensors (same shapes, contiguous), in one buffer that comes from the
// weights' pool when it is large: the reduced-precision paths widen their inputs on every call,
// and fresh memory for each copy cost the page faults and zeroing of every page (17 % of a
// bfloat16 forward's time at (8, 8, 512, 64), in the kernel's page-fault handler). Below
// 256 KiB, at::empty.
std::vector<at::Tensor> widened_to_float(std::initializer_list<at::Tensor> tensors);

// Everything the CPU attention kernels need, with the storage it points into.
template <typename T>
struct PreparedProblem {
  cpu::AttentionProblem<T> problem;
  std::vector<int64_t> batch;
  at::Tensor query, key, value, mask;
  std::vector<int64_t> q_offsets, k_offsets, v_offsets, mask_offsets;

  PreparedProblem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& attn_mask, bool is_causal,
                  std::optional<double> scale, std::vector<int64_t> batch_shape,
                  bool narrow_inputs = false)
      : batch(std::move(batch_shape)),
        query(rows_contiguous(q)),
        key(rows_contiguous(k)),
        value(rows_contiguous(v)) {
    auto& p = problem;
    p.batch = c10::multiply_integers(batch);
    p.len_q = q.size(-2);
    p.len_k = k.size(-2);
    p.dim_qk = q.size(-1);
    p.dim_v = v.size(-1);
    p.causal = is_causal;
    p.scale = static_cast<T>(resolve_scale(scale, p.dim_qk));
    if constexpr (std::is_same_v<T, float>) {
      if (narrow_inputs) {
        // float16/bfloat16 q, k, v that the kernel widens itself (AttentionProblem::narrow)
        using Narrow = typename cpu::AttentionProblem<T>::Narrow;
        p.narrow = q.scalar_type() == at::kBFloat16 ? Narrow::bfloat16 : Narrow::float16;
        p.query16 = batched_rows<uint16_t>(query, batch, q_offsets);
        p.key16 = batched_rows<uint16_t>(key, batch, k_offsets);
        p.value16 = batched_rows<uint16_t>(value, batch, v_offsets);
      }
    }
    if (!narrow_inputs) {
      p.query = batched_rows<T>(query, batch, q_offsets);
      p.key = batched_rows<T>(key, batch, k_offsets);
      p.value = batched_rows<T>(value, batch, v_offsets);
    }
    if (attn_mask && attn_mask->defined()) {
      // (the mask in the kernel's type, whatever the inputs')
      mask = additive_mask(*attn_mask, q.dtype() == at::CppTypeToScalarType<T>::value
                                           ? q
                                           : at::empty({0}, q.options().dtype(
                                                                at::CppTypeToScalarType<T>::value)),
                           p.len_k);
      const at::Tensor rows = mask.expand(with_tail(batch, {p.len_q, p.len_k}));
      p.mask = batched_rows<T>(rows, batch, mask_offsets);
      p.mask.row_stride = rows.stride(-2);  // 0 when one mask row serves every query
    }
  }
};

}  // namespace attnlab
