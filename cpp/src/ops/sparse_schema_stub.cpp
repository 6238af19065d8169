// TEMPORARY, delete when the CPU sparse attention operators are merged: the schemas of
// attnlab::_sparse_sdpa_forward and attnlab::_sparse_sdpa_backward, so that the CUDA
// implementations in cuda/sparse_ops.cpp can be registered and loaded on this branch. The
// operators' owner (ops/sparse_attention.cpp) defines the same schemas; both at once would fail
// to load ("already registered").

#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def(
      "_sparse_sdpa_forward(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
      "bool is_causal, float? scale, bool need_weights, float alpha) "
      "-> (Tensor output, Tensor tau, Tensor support_value, Tensor weights)");
  m.def(
      "_sparse_sdpa_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask, bool is_causal, float? scale, Tensor output, Tensor tau, "
      "Tensor support_value, float alpha, Tensor? weights=None, bool grad_mask=False) "
      "-> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_mask)");
}
