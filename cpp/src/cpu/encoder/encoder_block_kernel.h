#pragma once
// One transformer encoder block (self-attention with the tutorial's fused qkv projection, an
// output projection, a ReLU feed-forward net, two LayerNorms, post- or pre-norm, no dropout)
// forward and backward in one call each, over raw pointers. The operator layer
// (ops/encoder_block.cpp) validates and lays out the tensors; these functions only compute.
//
// Post-norm: h = LN1(x + attn(x)), y = LN2(h + ff(h)).
// Pre-norm:  h = x + attn(LN1(x)), y = h + ff(LN2(h)).

#include <cstdint>

#include "cpu/attention/attention_kernel.h"

namespace attnlab::cpu {

struct EncoderBlockShape {
  int64_t batch = 0, length = 0, dim = 0, heads = 1, dim_ff = 0;
  bool norm_first = false;
  int64_t tokens() const { return batch * length; }
  int64_t head_dim() const { return dim / heads; }
};

// Row-major parameters, named as in attnlab.nn.EncoderBlock: qkv [3·dim, dim] (per head
// [q_h; k_h; v_h]), out [dim, dim], ff1 [dim_ff, dim], ff2 [dim, dim_ff], norms [dim].
template <typename T>
struct EncoderBlockParams {
  const T *qkv_weight, *qkv_bias, *out_weight, *out_bias, *norm1_weight, *norm1_bias;
  const T *ff1_weight, *ff1_bias, *ff2_weight, *ff2_bias, *norm2_weight, *norm2_bias;
};

// Gradients of the parameters, in the same layout, written (not accumulated).
template <typename T>
struct EncoderBlockGrads {
  T *qkv_weight, *qkv_bias, *out_weight, *out_bias, *norm1_weight, *norm1_bias;
  T *ff1_weight, *ff1_bias, *ff2_weight, *ff2_bias, *norm2_weight, *norm2_bias;
};

// What the forward keeps for the backward, as views into one buffer of
// activations_size(shape) elements (N = tokens, E = dim, F = dim_ff):
//   qkv [N, 3E]; attention [N, E] (heads side by side); xhat1, norm1_out, xhat2, norm2_out
//   [N, E] (normalised rows before and after the affine map; norm2_out only for pre-norm);
//   relu_out [N, F]; rstd1, rstd2 [N]; logsumexp [batch·heads, length].
int64_t activations_size(const EncoderBlockShape& s);

// output [N, E]. mask: additive [length, length] rows per (batch, head) entry, as for
// attention_forward (data == nullptr for none); eps1/eps2: the LayerNorms' epsilons.
template <typename T>
void encoder_block_forward(const EncoderBlockShape& s, const T* x, const EncoderBlockParams<T>& p,
                           const BatchedRows<T>& mask, T eps1, T eps2, T* output,
                           T* activations);

// grad_x [N, E] may be null (not needed). activations: the forward's.
template <typename T>
void encoder_block_backward(const EncoderBlockShape& s, const T* grad_output, const T* x,
                            const EncoderBlockParams<T>& p, const BatchedRows<T>& mask,
                            const T* activations, T* grad_x, const EncoderBlockGrads<T>& grads);

}  // namespace attnlab::cpu
