// The sparse normalizers through the C++ API, against a sort-based sparsemax written here.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
// The tensor API and autograd only: the whole C++ frontend (torch/torch.h) took twice as
// long to compile.
#include <torch/autograd.h>
#include <torch/types.h>

#include "attnlab/attention.h"

namespace {

using torch::Tensor;

// Sparsemax of one row of scores z (finite entries): sort, find the support size k (the
// largest k with 1 + k·z_(k) > Σ_{i<=k} z_(i)), then p = max(z − τ, 0).
std::vector<double> sparsemax_row(const std::vector<double>& z) {
  std::vector<double> sorted = z;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double sum = 0, tau = 0;
  for (size_t k = 1; k <= sorted.size(); ++k) {
    sum += sorted[k - 1];
    if (1 + static_cast<double>(k) * sorted[k - 1] > sum) tau = (sum - 1) / static_cast<double>(k);
  }
  std::vector<double> p(z.size());
  for (size_t j = 0; j < z.size(); ++j) p[j] = std::max(z[j] - tau, 0.0);
  return p;
}

TEST(SparseAttention, SparsemaxMatchesSortedReference) {
  torch::manual_seed(0);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({2, 5, 4}, opts), k = torch::randn({2, 40, 4}, opts);
  auto v = torch::randn({2, 40, 3}, opts);
  auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, std::nullopt, false, 1.5, true,
                                                        "sparsemax");
  auto scores = (torch::matmul(q, k.transpose(-2, -1)) * 1.5).contiguous();
  auto expected = torch::empty_like(scores);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 5; ++i) {
      const double* row = scores[b][i].data_ptr<double>();
      auto p = sparsemax_row(std::vector<double>(row, row + 40));
      for (int64_t j = 0; j < 40; ++j) expected[b][i][j] = p[j];
    }
  }
  EXPECT_TRUE(torch::allclose(w, expected, 0, 1e-12));
  EXPECT_TRUE(torch::equal(w.eq(0), expected.eq(0)));
  EXPECT_GT(w.eq(0).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::allclose(out, torch::matmul(expected, v), 0, 1e-12));
}

// attnlab::_sdpa_summaries on rows long enough for support lists (which the summaries are
// reduced from), against the same reductions of the weights need_weights=True returns: a fully
// masked row, a row with half its keys masked, supports shorter than k, a repeated key in `to`.
TEST(SparseAttention, SummariesFromSupportListsMatchTheWeights) {
  using Summaries = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
  const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("attnlab::_sdpa_summaries", "")
          .typed<Summaries(const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, bool, std::optional<double>,
                           c10::string_view, std::optional<double>, bool, bool, int64_t,
                           int64_t, c10::IntArrayRef)>();
  torch::manual_seed(1);
  const auto q = torch::randn({2, 12, 8}) * 3, k = torch::randn({2, 300, 8});
  const auto v = torch::randn({2, 300, 4});
  auto mask = torch::ones({12, 300}, torch::kBool);
  mask[4].fill_(false);
  mask[2].slice(0, 0, 150).fill_(false);
  const std::vector<int64_t> to = {5, 0, 5};
  for (const char* normalizer : {"sparsemax", "entmax15"}) {
    SCOPED_TRACE(normalizer);
    const auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, mask, false,
                                                                std::nullopt, true, normalizer);
    const auto [output, received, entropy, top_w, top_i, pooled, to_w] =
        op.call(q, k, v, mask, false, std::nullopt, normalizer, std::nullopt, true, true, 8, 64,
                to);
    EXPECT_TRUE(torch::allclose(output, out, 1e-6, 1e-7));
    EXPECT_TRUE(torch::allclose(received, w.sum(-2), 1e-5, 1e-6));
    const auto log_w = torch::where(w > 0, w, torch::ones_like(w)).log();
    EXPECT_TRUE(torch::allclose(entropy, -(w * log_w).sum(-1), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(top_w, std::get<0>(w.topk(8)), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(w.gather(-1, top_i), top_w, 0, 1e-6));
    EXPECT_GT(top_w.eq(0).sum().item<int64_t>(), 0) << "no support shorter than k";
    EXPECT_TRUE(torch::equal(top_i[0][4], torch::arange(8, torch::kLong)));
    EXPECT_TRUE(torch::equal(to_w.select(-1, 0), to_w.select(-1, 2)));
    EXPECT_TRUE(torch::allclose(to_w.select(-1, 1), w.select(-1, 0), 1e-6, 1e-7));
    ASSERT_EQ(pooled.sizes(), (std::vector<int64_t>{2, 1, 5}));
    for (int64_t c = 0; c < 5; ++c) {
      const auto block = w.slice(-1, c * 64, std::min<int64_t>(300, (c + 1) * 64));
      EXPECT_TRUE(torch::allclose(pooled.select(-1, c).select(-1, 0), block.mean({-2, -1}), 1e-5,
                                  1e-7));
    }
  }
}

TEST(SparseAttention, EntmaxRowsSumToOneAndGradientsFlow) {
  torch::manual_seed(1);
  auto q = torch::randn({3, 6, 8}, torch::requires_grad());
  auto k = torch::randn({3, 6, 8}, torch::requires_grad());
  auto v = torch::randn({3, 6, 2}, torch::requires_grad());
  for (const auto& [normalizer, alpha] :
       {std::pair<const char*, std::optional<double>>{"entmax15", std::nullopt},
        std::pair<const char*, std::optional<double>>{"entmax", 1.7}}) {
    auto [out, w] = attnlab::scaled_dot_product_attention(q, k, v, std::nullopt, true,
                                                          std::nullopt, true, normalizer, alpha);
    EXPECT_TRUE(torch::allclose(w.sum(-1), torch::ones({3, 6}), 0, 1e-5));
    EXPECT_TRUE(w.ge(0).all().item<bool>());
    out.sum().backward();
    EXPECT_TRUE(q.grad().isfinite().all().item<bool>());
    q.mutable_grad().reset();
  }
}

TEST(SparseAttention, BadNormalizerArgumentsThrow) {
  auto q = torch::randn({2, 4, 3});
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, q, q, std::nullopt, false, std::nullopt,
                                                     false, "sparsemaks"),
               c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, q, q, std::nullopt, false, std::nullopt,
                                                     false, "entmax"),
               c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, q, q, std::nullopt, false, std::nullopt,
                                                     false, "entmax", 1.0),
               c10::Error);
  EXPECT_THROW(attnlab::scaled_dot_product_attention(q, q, q, std::nullopt, false, std::nullopt,
                                                     false, "sparsemax", 2.0),
               c10::Error);
}

}  // namespace
