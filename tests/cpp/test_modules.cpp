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
