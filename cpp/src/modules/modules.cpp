#include "attnlab/modules.h"

#include <cmath>
#include <fstream>
#include <iterator>

#include "attnlab/attention.h"

namespace attnlab::nn {

MultiheadAttentionImpl::MultiheadAttentionImpl(int64_t input_dim_, int64_t embed_dim_,
                                               int64_t num_heads_)
    : input_dim(input_dim_), embed_dim(embed_dim_), num_heads(num_heads_) {
  TORCH_CHECK(input_dim > 0 && embed_dim > 0 && num_heads > 0,
              "attnlab::nn::MultiheadAttention: input_dim, embed_dim and num_heads must be "
              "positive, got ", input_dim, ", ", embed_dim, ", ", num_heads);
  TORCH_CHECK(embed_dim % num_heads == 0, "attnlab::nn::MultiheadAttention: embed_dim (",
              embed_dim, ") must be divisible by num_heads (", num_heads, ")");
  head_dim = embed_dim / num_heads;
  qkv_proj = register_module("qkv_proj", torch::nn::Linear(input_dim, 3 * embed_dim));
  o_proj = register_module("o_proj", torch::nn::Linear(embed_dim, embed_dim));
  for (auto* linear : {&qkv_proj, &o_proj}) {
    torch::nn::init::xavier_uniform_((*linear)->weight);
    torch::nn::init::zeros_((*linear)->bias);
  }
}

std::tuple<torch::Tensor, torch::Tensor> MultiheadAttentionImpl::forward(
    const torch::Tensor& x, const std::optional<torch::Tensor>& mask, bool return_attention) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == input_dim,
              "attnlab::nn::MultiheadAttention expects x of shape [batch, length, ", input_dim,
              "], got ", x.sizes());
  const int64_t batch = x.size(0), length = x.size(1);
  auto qkv = qkv_proj(x).reshape({batch, length, num_heads, 3 * head_dim}).permute({0, 2, 1, 3});
  auto parts = qkv.chunk(3, -1);  // q, k, v: [B, H, L, head_dim]
  std::optional<torch::Tensor> heads_mask = mask;
  if (mask && mask->dim() == 3) heads_mask = mask->unsqueeze(1);
  auto [values, attention] = scaled_dot_product_attention(
      parts[0], parts[1], parts[2], heads_mask, false, std::nullopt, return_attention);
  values = values.permute({0, 2, 1, 3}).reshape({batch, length, embed_dim});
  return {o_proj(values), attention};
}

EncoderBlockImpl::EncoderBlockImpl(int64_t input_dim, int64_t num_heads,
                                   int64_t dim_feedforward, double dropout_p, bool norm_first_)
    : norm_first(norm_first_) {
  TORCH_CHECK(dim_feedforward > 0, "attnlab::nn::EncoderBlock: dim_feedforward must be "
              "positive, got ", dim_feedforward);
  self_attn = register_module("self_attn", MultiheadAttention(input_dim, input_dim, num_heads));
  linear_net = register_module(
      "linear_net",
      torch::nn::Sequential(torch::nn::Linear(input_dim, dim_feedforward),
                            torch::nn::Dropout(dropout_p), torch::nn::ReLU(),
                            torch::nn::Linear(dim_feedforward, input_dim)));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({input_dim})));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({input_dim})));
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
}

torch::Tensor EncoderBlockImpl::forward(const torch::Tensor& x,
                                        const std::optional<torch::Tensor>& mask) {
  // The fused operator computes exactly this block on the CPU while dropout is inactive.
  const bool dropout_active = is_training() && dropout->options.p() > 0;
  const bool learnable_mask = mask && mask->requires_grad();
  const auto& attn = *self_attn;
  if (x.device().is_cpu() && x.dim() == 3 && x.size(2) == attn.input_dim &&
      x.scalar_type() == attn.qkv_proj->weight.scalar_type() &&
      (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble) &&
      !dropout_active && !learnable_mask) {
    const auto& ff1 = linear_net[0]->as<torch::nn::Linear>();
    const auto& ff2 = linear_net[3]->as<torch::nn::Linear>();
    const EncoderBlockWeights weights{
        attn.qkv_proj->weight, attn.qkv_proj->bias, attn.o_proj->weight, attn.o_proj->bias,
        norm1->weight,         norm1->bias,         ff1->weight,         ff1->bias,
        ff2->weight,           ff2->bias,           norm2->weight,       norm2->bias};
    std::optional<torch::Tensor> heads_mask = mask;
    if (mask && mask->dim() == 3) heads_mask = mask->unsqueeze(1);
    return encoder_block(x, weights, attn.num_heads, heads_mask, norm_first,
                         norm1->options.eps(), norm2->options.eps());
  }
  if (norm_first) {
    auto h = x + dropout(std::get<0>(self_attn(norm1(x), mask)));
    return h + dropout(linear_net->forward(norm2(h)));
  }
  auto h = norm1(x + dropout(std::get<0>(self_attn(x, mask))));
  return norm2(h + dropout(linear_net->forward(h)));
}

TransformerEncoderImpl::TransformerEncoderImpl(int64_t num_layers, int64_t input_dim,
                                               int64_t num_heads, int64_t dim_feedforward,
                                               double dropout, bool norm_first) {
  TORCH_CHECK(num_layers > 0, "attnlab::nn::TransformerEncoder: num_layers must be positive, "
              "got ", num_layers);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    layers->push_back(EncoderBlock(input_dim, num_heads, dim_feedforward, dropout, norm_first));
  }
}

torch::Tensor TransformerEncoderImpl::forward(torch::Tensor x,
                                              const std::optional<torch::Tensor>& mask) {
  for (const auto& layer : *layers) x = layer->as<EncoderBlockImpl>()->forward(x, mask);
  return x;
}

std::vector<torch::Tensor> TransformerEncoderImpl::get_attention_maps(
    torch::Tensor x, const std::optional<torch::Tensor>& mask) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> maps;
  for (const auto& layer : *layers) {
    auto* block = layer->as<EncoderBlockImpl>();
    auto input = block->norm_first ? block->norm1(x) : x;
    maps.push_back(std::get<1>(block->self_attn(input, mask, true)));
    x = block->forward(x, mask);
  }
  return maps;
}

torch::Tensor sinusoidal_table(int64_t length, int64_t dim, double scale) {
  TORCH_CHECK(length >= 0 && dim > 0, "attnlab::nn::sinusoidal_table: need length >= 0 and "
              "dim > 0, got ", length, ", ", dim);
  const int64_t even = dim + dim % 2;
  auto options = torch::TensorOptions().dtype(torch::kDouble);
  auto position = torch::arange(length, options).unsqueeze(1);
  auto frequency = torch::exp(torch::arange(0, even, 2, options) * (-std::log(scale) / even));
  auto table = torch::zeros({length, even}, options);
  using torch::indexing::Slice;
  table.index_put_({Slice(), Slice(0, torch::indexing::None, 2)}, torch::sin(position * frequency));
  table.index_put_({Slice(), Slice(1, torch::indexing::None, 2)}, torch::cos(position * frequency));
  return table.index({Slice(), Slice(0, dim)}).to(torch::kFloat);
}

PositionalEncodingImpl::PositionalEncodingImpl(int64_t d_model_, int64_t max_len_)
    : d_model(d_model_), max_len(max_len_) {
  TORCH_CHECK(max_len > 0, "attnlab::nn::PositionalEncoding: max_len must be positive, got ",
              max_len);
  pe = register_buffer("pe", sinusoidal_table(max_len, d_model).unsqueeze(0));
}

torch::Tensor PositionalEncodingImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == d_model, "attnlab::nn::PositionalEncoding expects x "
              "of shape [batch, length, ", d_model, "], got ", x.sizes());
  TORCH_CHECK(x.size(1) <= max_len, "attnlab::nn::PositionalEncoding: sequence length ",
              x.size(1), " exceeds max_len ", max_len);
  return x + pe.index({torch::indexing::Slice(), torch::indexing::Slice(0, x.size(1))});
}

void load_state_dict(torch::nn::Module& module, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file, "attnlab::nn::load_state_dict: cannot open ", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto dict = torch::pickle_load(bytes).toGenericDict();
  torch::NoGradGuard no_grad;
  auto copy_into = [&](const std::string& name, torch::Tensor& target, bool required) {
    const auto it = dict.find(name);
    TORCH_CHECK(it != dict.end() || !required, "attnlab::nn::load_state_dict: ", path,
                " has no entry ", name);
    if (it == dict.end()) return;
    const auto source = it->value().toTensor();
    TORCH_CHECK(source.sizes() == target.sizes(), "attnlab::nn::load_state_dict: ", name,
                " has shape ", source.sizes(), " in ", path, " but ", target.sizes(),
                " in the module");
    target.copy_(source);
  };
  for (auto& item : module.named_parameters()) copy_into(item.key(), item.value(), true);
  // Buffers such as the positional table are not saved by Python (persistent=False).
  for (auto& item : module.named_buffers()) copy_into(item.key(), item.value(), false);
}

}  // namespace attnlab::nn
