// The LibTorch modules against the tutorial's equations written with ATen ops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "attnlab/modules.h"

namespace {

using torch::Tensor;

std::tuple<Tensor, Tensor> tutorial_mha(attnlab::nn::MultiheadAttention& m, const Tensor& x) {
  const int64_t B = x.size(0), L = x.size(1), H = m->num_heads, hd = m->head_dim;
  auto qkv = torch::linear(x, m->qkv_proj->weight, m->qkv_proj->bias)
                 .reshape({B, L, H, 3 * hd})
                 .permute({0, 2, 1, 3});
  using torch::indexing::Slice;
  auto q = qkv.index({"...", Slice(0, hd)}), k = qkv.index({"...", Slice(hd, 2 * hd)});
  auto v = qkv.index({"...", Slice(2 * hd, 3 * hd)});
  auto attention = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd)), -1);
  auto values = torch::matmul(attention, v).permute({0, 2, 1, 3}).reshape({B, L, H * hd});
  return {torch::linear(values, m->o_proj->weight, m->o_proj->bias), attention};
}

TEST(Modules, MultiheadAttentionMatchesTutorialEquations) {
  torch::manual_seed(0);
  attnlab::nn::MultiheadAttention mha(6, 12, 3);
  mha->to(torch::kDouble);
  auto x = torch::randn({4, 7, 6}, torch::kDouble);
  auto [out, attention] = mha(x, std::nullopt, true);
  auto [ref_out, ref_attention] = tutorial_mha(mha, x);
  EXPECT_TRUE(torch::allclose(out, ref_out, 1e-9, 1e-9));
  EXPECT_TRUE(torch::allclose(attention, ref_attention, 1e-9, 1e-9));
}

TEST(Modules, EncoderIsPermutationEquivariantAndHasParameterNamesOfPython) {
  torch::manual_seed(1);
  attnlab::nn::TransformerEncoder encoder(2, 16, 4, 32);
  encoder->eval();
  auto x = torch::randn({3, 10, 16});
  auto perm = torch::randperm(10);
  auto diff = (encoder(x).index_select(1, perm) - encoder(x.index_select(1, perm))).abs().max();
  EXPECT_LT(diff.item<double>(), 1e-5);
  auto maps = encoder->get_attention_maps(x);
  ASSERT_EQ(maps.size(), 2u);
  EXPECT_EQ(maps[0].sizes(), torch::IntArrayRef({3, 4, 10, 10}));
  std::vector<std::string> names;
  for (const auto& p : encoder->named_parameters()) names.push_back(p.key());
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.linear_net.3.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.0.self_attn.qkv_proj.bias"), names.end());
}

// The block as the tutorial writes it (pre-norm when norm_first), in ATen ops.
Tensor tutorial_block(attnlab::nn::EncoderBlock& block, const Tensor& x) {
  auto norm = [](torch::nn::LayerNorm& ln, const Tensor& t) {
    return torch::layer_norm(t, {t.size(-1)}, ln->weight, ln->bias, ln->options.eps());
  };
  auto ffn = [&](const Tensor& t) {
    auto* first = block->linear_net[0]->as<torch::nn::Linear>();
    auto* second = block->linear_net[3]->as<torch::nn::Linear>();
    return torch::linear(torch::relu(torch::linear(t, first->weight, first->bias)),
                         second->weight, second->bias);
  };
  if (block->norm_first) {
    auto h = x + std::get<0>(tutorial_mha(block->self_attn, norm(block->norm1, x)));
    return h + ffn(norm(block->norm2, h));
  }
  auto h = norm(block->norm1, x + std::get<0>(tutorial_mha(block->self_attn, x)));
  return norm(block->norm2, h + ffn(h));
}

TEST(Modules, EncoderBlockMatchesTutorialEquationsWithGradients) {
  for (const bool norm_first : {false, true}) {
    torch::manual_seed(2);
    attnlab::nn::EncoderBlock block(8, 2, 12, 0.0, norm_first);
    block->to(torch::kDouble);
    auto x = torch::randn({3, 5, 8}, torch::kDouble).requires_grad_();
    auto grad = torch::randn({3, 5, 8}, torch::kDouble);
    std::vector<Tensor> inputs{x};
    for (const auto& p : block->parameters()) inputs.push_back(p);
    auto out = block(x);  // the fused operator: dropout is 0
    auto expected = tutorial_block(block, x);
    EXPECT_TRUE(torch::allclose(out, expected, 1e-9, 1e-9)) << "norm_first " << norm_first;
    auto got = torch::autograd::grad({out}, inputs, {grad});
    auto want = torch::autograd::grad({expected}, inputs, {grad});
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-9, 1e-9))
          << "gradient " << i << ", norm_first " << norm_first;
    }
  }
}

TEST(Modules, BadArgumentsThrow) {
  EXPECT_THROW(attnlab::nn::MultiheadAttention(8, 10, 3), c10::Error);
  EXPECT_THROW(attnlab::nn::EncoderBlock(8, 2, 0), c10::Error);
  attnlab::nn::MultiheadAttention mha(8, 8, 2);
  EXPECT_THROW(mha(torch::randn({5, 8})), c10::Error);
  EXPECT_THROW(mha(torch::randn({2, 5, 7})), c10::Error);
  attnlab::nn::PositionalEncoding pe(8, 10);
  EXPECT_THROW(pe(torch::randn({1, 11, 8})), c10::Error);
}

}  // namespace
