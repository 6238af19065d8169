// Uses attnlab from an out-of-tree C++ project: the attention operator with its weights, and a
// LibTorch module loading weights that Python saved with attnlab.nn.save_for_cpp.
//
//   consumer                 prints the operator's output and weights for fixed inputs
//   consumer STATE_DICT.pt   also runs attnlab::nn::MultiheadAttention(8, 8, 2) with those weights
//
// Every tensor is printed as "name: v0 v1 ..." (row-major) so a script can compare it with
// Python's result for the same inputs.
#include <iomanip>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <attnlab/attention.h>
#include <attnlab/build_info.h>
#include <attnlab/modules.h>

namespace {

void print(const std::string& name, const torch::Tensor& t) {
  const auto values = t.to(torch::kDouble).contiguous();
  const double* data = values.data_ptr<double>();
  std::cout << name << ":" << std::setprecision(9);
  for (int64_t i = 0; i < values.numel(); ++i) std::cout << ' ' << data[i];
  std::cout << '\n';
}

// Smooth, fixed inputs that Python can rebuild exactly: sin or cos of a scaled arange.
torch::Tensor wave(std::vector<int64_t> shape, double step, bool cosine = false) {
  int64_t n = 1;
  for (int64_t size : shape) n *= size;
  const auto x = torch::arange(n, torch::kFloat32).mul(step);
  return (cosine ? x.cos() : x.sin()).view(shape);
}

}  // namespace

int run(int argc, char** argv) {
  const auto info = attnlab::build_info();
  std::cout << "attnlab " << info.version << ", built against torch " << info.torch_version
            << ", running on torch " << attnlab::loaded_torch_version() << '\n';

  // [batch 2, heads 3, 5 queries, 4 features] against 6 keys with 2-wide values; query i may
  // attend to keys 0..i+1 (a boolean mask, true = may attend, broadcast over batch and heads).
  const auto query = wave({2, 3, 5, 4}, 0.37);
  const auto key = wave({2, 3, 6, 4}, 0.23, /*cosine=*/true);
  const auto value = wave({2, 3, 6, 2}, 0.11);
  const auto mask = torch::ones({5, 6}, torch::kBool).tril(1);
  const auto [output, weights] = attnlab::scaled_dot_product_attention(
      query, key, value, mask, /*is_causal=*/false, /*scale=*/std::nullopt,
      /*need_weights=*/true);
  print("output", output);
  print("weights", weights);

  if (argc > 1) {
    attnlab::nn::MultiheadAttention attention(/*input_dim=*/8, /*embed_dim=*/8, /*num_heads=*/2);
    attention->eval();
    attnlab::nn::load_state_dict(*attention, argv[1]);
    torch::NoGradGuard no_grad;
    const auto [y, maps] = attention(wave({1, 4, 8}, 0.05), std::nullopt,
                                     /*return_attention=*/true);
    print("module_output", y);
    print("module_attention", maps);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& error) {  // bad input, a missing file, another torch: one message
    std::cerr << "consumer: " << error.what_without_backtrace() << '\n';
    return 1;
  }
}
