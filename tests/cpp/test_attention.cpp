// The attention operator called from C++, against a composite of ATen ops in float64.
#include <array>
#include <vector>

#include <gtest/gtest.h>
// The tensor API and autograd only: the whole C++ frontend (torch/torch.h) took twice as
// long to compile.
#include <torch/autograd.h>
#include <torch/types.h>

#include "attnlab/attention.h"
#include "attnlab/build_info.h"

namespace {

using torch::Tensor;

// softmax(q kᵀ·scale + mask) v with the package's conventions (fully masked rows → 0).
std::tuple<Tensor, Tensor> reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::optional<Tensor>& mask, bool causal) {
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  if (mask) {
    scores = mask->scalar_type() == torch::kBool
                 ? scores.masked_fill(mask->logical_not(), -INFINITY)
                 : scores + *mask;
  }
  if (causal) {
    auto allowed = torch::ones({q.size(-2), k.size(-2)}, torch::kBool).tril();
    scores = scores.masked_fill(allowed.logical_not(), -INFINITY);
  }
  auto weights = torch::softmax(scores, -1).nan_to_num(0.0);
  return {torch::matmul(weights, v), weights};
}

TEST(Attention, MatchesReferenceWithMaskAndWeights) {
  torch::manual_seed(0);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({2, 3, 7, 5}, opts), k = torch::randn({2, 3, 9, 5}, opts);
  auto v = torch::randn({2, 3, 9, 4}, opts);
  auto mask = torch::rand({7, 9}) > 0.3;
  mask.index_put_({2}, false);  // one query with every key masked
  auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, mask, false, std::nullopt, true);
  auto [ref_out, ref_w] = reference(q, k, v, mask, false);
  EXPECT_TRUE(torch::allclose(out, ref_out, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(w, ref_w, 1e-12, 1e-12));
  EXPECT_EQ(out.index({torch::indexing::Ellipsis, 2, torch::indexing::Slice()}).abs().max().item<double>(), 0.0);
}

TEST(Attention, CausalFloat32LongSequence) {
  torch::manual_seed(1);
  auto q = torch::randn({1, 2, 600, 16}), k = torch::randn({1, 2, 700, 16});
  auto v = torch::randn({1, 2, 700, 8});
  auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, std::nullopt, true);
  EXPECT_EQ(w.numel(), 0);
  auto [ref_out, ref_w] = reference(q.to(torch::kDouble), k.to(torch::kDouble),
                                    v.to(torch::kDouble), std::nullopt, true);
  EXPECT_TRUE(torch::allclose(out.to(torch::kDouble), ref_out, 1e-5, 1e-6));
}

TEST(Attention, GradientsMatchReference) {
  torch::manual_seed(2);
  auto opts = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  auto q = torch::randn({3, 6, 4}, opts), k = torch::randn({3, 5, 4}, opts);
  auto v = torch::randn({3, 5, 2}, opts);
  auto mask = torch::randn({6, 5}, torch::kDouble);
  auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, mask);
  auto grads = torch::autograd::grad({out.pow(2).sum()}, {q, k, v});
  auto [ref_out, ref_w] = reference(q, k, v, mask, false);
  auto ref_grads = torch::autograd::grad({ref_out.pow(2).sum()}, {q, k, v});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::allclose(grads[i], ref_grads[i], 1e-10, 1e-10)) << "input " << i;
  }
}

// Empty and length-1 problems, forward and backward, with and without weights: the shapes where
// index arithmetic goes wrong first (the sanitizer build runs these too).
TEST(Attention, EmptyAndSingleLengthProblems) {
  const std::vector<std::array<int64_t, 3>> shapes = {  // batch, L_q, L_k
      {0, 3, 4}, {2, 0, 4}, {2, 3, 0}, {2, 1, 1}, {1, 1, 70}, {1, 70, 1}};
  for (const auto& [batch, len_q, len_k] : shapes) {
    for (bool need_weights : {false, true}) {
      for (bool causal : {false, true}) {
        auto opts = torch::TensorOptions().requires_grad(true);
        auto q = torch::randn({batch, len_q, 5}, opts), k = torch::randn({batch, len_k, 5}, opts);
        auto v = torch::randn({batch, len_k, 3}, opts);
        auto mask = torch::randn({len_q, len_k}, opts);
        auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, mask, causal,
                                                              std::nullopt, need_weights);
        ASSERT_EQ(out.sizes(), torch::IntArrayRef({batch, len_q, 3}));
        auto grads = torch::autograd::grad({out.sum()}, {q, k, v, mask});
        for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(grads[i].isfinite().all().item<bool>());
        auto [ref_out, ref_w] = reference(q.detach().to(torch::kDouble), k.detach().to(torch::kDouble),
                                          v.detach().to(torch::kDouble), mask.detach().to(torch::kDouble), causal);
        EXPECT_TRUE(torch::allclose(out.to(torch::kDouble), ref_out, 1e-5, 1e-6))
            << batch << " " << len_q << " " << len_k;
      }
    }
  }
}

TEST(Attention, BadInputThrows) {
  auto q = torch::randn({2, 4, 8}), k = torch::randn({2, 5, 8}), v = torch::randn({2, 5, 3});
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, torch::randn({2, 5, 7}), v), c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, k, torch::randn({2, 6, 3})), c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q.to(torch::kDouble), k, v), c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(torch::randn({8}), k, v), c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, k, v, torch::ones({4, 5}, torch::kInt)),
               c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, k, v, std::nullopt, false, NAN),
               c10::Error);
  try {
    attnlab::scaled_dot_product_attention(q, torch::randn({2, 5, 7}), v);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("key has 7 features"), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(AdditiveScores, MatchesReferenceAndGradients) {
  torch::manual_seed(3);
  auto opts = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  auto qp = torch::randn({2, 5, 8}, opts), kp = torch::randn({2, 6, 8}, opts);
  auto w = torch::randn({8}, opts);
  auto scores = attnlab::additive_scores(qp, kp, w);
  auto reference = (torch::tanh(qp.unsqueeze(2) + kp.unsqueeze(1)) * w).sum(-1);
  EXPECT_TRUE(torch::allclose(scores, reference, 1e-12, 1e-12));
  auto grads = torch::autograd::grad({scores.sum()}, {qp, kp, w});
  auto ref_grads = torch::autograd::grad({reference.sum()}, {qp, kp, w});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::allclose(grads[i], ref_grads[i], 1e-10, 1e-10));
  EXPECT_THROW(attnlab::additive_scores(qp, kp, torch::randn({7}, torch::kDouble)), c10::Error);
}

TEST(BuildInfo, NamesTorchVersion) {
  EXPECT_FALSE(attnlab::build_info().torch_version.empty());
}

// The tests run with the torch they were built against: the loaded one is found and matches.
TEST(BuildInfo, FindsTheLoadedTorch) {
  EXPECT_EQ(attnlab::loaded_torch_version(), attnlab::build_info().torch_version);
  EXPECT_EQ(attnlab::torch_version_problem(), "");
}

TEST(BuildInfo, TorchVersionsCompatibleByRelease) {
  EXPECT_TRUE(attnlab::torch_versions_compatible("2.15.0+cu132", "2.15.0+cpu"));
  EXPECT_TRUE(attnlab::torch_versions_compatible("2.15.0", "2.15.0a0+git1234"));
  EXPECT_TRUE(attnlab::torch_versions_compatible("2.15.0", ""));  // unknown: not refused
  EXPECT_FALSE(attnlab::torch_versions_compatible("2.15.0+cu132", "2.16.0+cu132"));
  EXPECT_FALSE(attnlab::torch_versions_compatible("2.15.0", "2.15.1"));
  EXPECT_FALSE(attnlab::torch_versions_compatible("2.15.0", "12.15.0"));
}

}  // namespace
