#include "cuda/op_layout.h"

#include "ops/layout.h"

namespace attnlab::cuda {

using at::Tensor;

BatchIndexer::BatchIndexer(at::IntArrayRef batch_shape)
    : full_(batch_shape.begin(), batch_shape.end()), count_(c10::multiply_integers(full_)) {
  for (size_t d = 0; d < full_.size(); ++d) {
    if (full_[d] > 1) kept_.push_back(static_cast<int64_t>(d));
  }
  flatten_ = kept_.size() > static_cast<size_t>(kMaxBatchDims);
  if (flatten_) kept_ = {0};
  shape_.dims = static_cast<int>(kept_.size());
  for (int d = 0; d < shape_.dims; ++d) shape_.sizes[d] = flatten_ ? count_ : full_[kept_[d]];
}

MatrixOperand BatchIndexer::operand(const Tensor& t, int64_t rows, int64_t cols) {
  Tensor e = t.expand(with_tail(full_, {rows, cols}));
  if (flatten_) e = e.reshape({count_, rows, cols});
  alive_.push_back(e);
  MatrixOperand op;
  op.data = e.const_data_ptr();
  for (int d = 0; d < shape_.dims; ++d) op.batch_stride[d] = e.stride(kept_[d]);
  op.row_stride = e.stride(-2);
  op.col_stride = e.stride(-1);
  return op;
}

SdpaProblem make_problem(BatchIndexer& batch, const Tensor& query, const Tensor& key,
                         const Tensor& value, const std::optional<Tensor>& attn_mask,
                         bool is_causal, std::optional<double> scale) {
  SdpaProblem p;
  p.batch = batch.count();
  p.len_q = query.size(-2);
  p.len_k = key.size(-2);
  p.dim_qk = static_cast<int>(query.size(-1));
  p.dim_v = static_cast<int>(value.size(-1));
  p.shape = batch.shape();
  p.query = batch.operand(query, p.len_q, p.dim_qk);
  p.key = batch.operand(key, p.len_k, p.dim_qk);
  p.value = batch.operand(value, p.len_k, p.dim_v);
  p.causal = is_causal;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(p.dim_qk)));
  if (attn_mask && attn_mask->defined()) {
    Tensor mask = *attn_mask;
    while (mask.dim() < 2) mask = mask.unsqueeze(0);
    // Float masks are read as float32 whatever the inputs' precision; boolean ones as they are.
    p.mask_is_bool = mask.scalar_type() == at::kBool;
    if (!p.mask_is_bool) mask = mask.to(at::kFloat);
    p.mask = batch.operand(mask, p.len_q, p.len_k);
  }
  return p;
}

}  // namespace attnlab::cuda
