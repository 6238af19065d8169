// Loads the state_dict that make_state_dict.py saved from Python into the C++ encoder and
// checks that both give the same outputs and attention maps. Exit status 0 on agreement.
#include <fstream>
#include <iostream>
#include <iterator>

#include <torch/torch.h>

#include "attnlab/modules.h"

namespace {
torch::Tensor load_tensor(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toTensor();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: state_dict_check FOLDER\n";
    return 2;
  }
  const std::string folder = argv[1];
  attnlab::nn::TransformerEncoder encoder(2, 16, 4, 32);
  encoder->eval();
  attnlab::nn::load_state_dict(*encoder, folder + "/encoder.pt");
  torch::NoGradGuard no_grad;
  const auto x = load_tensor(folder + "/input.pt");
  const auto mask = load_tensor(folder + "/mask.pt");
  const double out_diff = (encoder(x, mask) - load_tensor(folder + "/expected.pt")).abs().max().item<double>();
  const double map_diff =
      (encoder->get_attention_maps(x, mask)[1] - load_tensor(folder + "/maps.pt")).abs().max().item<double>();
  std::cout << "max |C++ - Python|: output " << out_diff << ", layer-2 attention " << map_diff << "\n";
  return out_diff < 1e-6 && map_diff < 1e-6 ? 0 : 1;
}
