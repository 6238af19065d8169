#pragma once
// LibTorch modules mirroring attnlab.nn, with the same parameter names, so weights saved from
// Python with attnlab.nn.save_for_cpp(module, path) load here with load_state_dict().

#include <optional>
#include <string>
#include <tuple>

#include <torch/torch.h>

namespace attnlab::nn {

// Self-attention with the tutorial's fused projection: qkv_proj (input_dim → 3·embed_dim,
// reshaped to [B, L, H, 3·head_dim] and split into q, k, v), o_proj (embed_dim → embed_dim).
struct MultiheadAttentionImpl : torch::nn::Module {
  MultiheadAttentionImpl(int64_t input_dim, int64_t embed_dim, int64_t num_heads);
  // Returns (output [B, L, embed_dim], attention [B, H, L, L] or an empty tensor unless
  // return_attention). mask: bool (true = may attend) or float (added), broadcastable.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x,
                                                   const std::optional<torch::Tensor>& mask = {},
                                                   bool return_attention = false);
  int64_t input_dim, embed_dim, num_heads, head_dim;
  torch::nn::Linear qkv_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(MultiheadAttention);

// Post-norm block (pre-norm with norm_first): self_attn, linear_net (Linear, Dropout, ReLU,
// Linear), norm1, norm2, dropout.
struct EncoderBlockImpl : torch::nn::Module {
  EncoderBlockImpl(int64_t input_dim, int64_t num_heads, int64_t dim_feedforward,
                   double dropout = 0.0, bool norm_first = false);
  torch::Tensor forward(const torch::Tensor& x, const std::optional<torch::Tensor>& mask = {});
  bool norm_first;
  MultiheadAttention self_attn{nullptr};
  torch::nn::Sequential linear_net{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(EncoderBlock);

struct TransformerEncoderImpl : torch::nn::Module {
  TransformerEncoderImpl(int64_t num_layers, int64_t input_dim, int64_t num_heads,
                         int64_t dim_feedforward, double dropout = 0.0, bool norm_first = false);
  torch::Tensor forward(torch::Tensor x, const std::optional<torch::Tensor>& mask = {});
  // One [B, H, L, L] map per layer.
  std::vector<torch::Tensor> get_attention_maps(torch::Tensor x,
                                                const std::optional<torch::Tensor>& mask = {});
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(TransformerEncoder);

// Adds the sinusoidal table (precomputed to max_len) to x [B, L, d_model].
struct PositionalEncodingImpl : torch::nn::Module {
  explicit PositionalEncodingImpl(int64_t d_model, int64_t max_len = 5000);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t d_model, max_len;
  torch::Tensor pe;  // [1, max_len, d_model]
};
TORCH_MODULE(PositionalEncoding);

// PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(...), [length, dim]; odd dim
// computed for dim + 1 and cropped.
torch::Tensor sinusoidal_table(int64_t length, int64_t dim, double scale = 10000.0);

// Copies the tensors saved from Python with attnlab.nn.save_for_cpp (a plain dict of tensors)
// into the module's parameters and buffers of the same names. Every parameter must be present
// with its shape.
void load_state_dict(torch::nn::Module& module, const std::string& path);

}  // namespace attnlab::nn
