// Trains the UvA tutorial's sequence-reversal model with LibTorch and attnlab's modules alone:
// sequences of 16 digits, one-hot in, the reversed sequence out.
//
//   train_reversal [--epochs 10] [--train 50000] [--test 10000] [--seed 0] [--min-accuracy A]
//
// Prints the loss per epoch and the test accuracy; exits 1 if --min-accuracy is not reached.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "attnlab/modules.h"

namespace {

constexpr int64_t kClasses = 10, kLength = 16, kModel = 32, kBatch = 128;

struct Options {
  int64_t epochs = 10, train = 50000, test = 10000, seed = 0;
  double min_accuracy = 0.0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--epochs") o.epochs = std::stoll(value);
    else if (arg == "--train") o.train = std::stoll(value);
    else if (arg == "--test") o.test = std::stoll(value);
    else if (arg == "--seed") o.seed = std::stoll(value);
    else if (arg == "--min-accuracy") o.min_accuracy = std::stod(value);
    else throw std::invalid_argument("unknown argument " + arg);
  }
  if (o.epochs < 1 || o.train < kBatch || o.test < 1) {
    throw std::invalid_argument("need --epochs >= 1, --train >= 128 and --test >= 1");
  }
  return o;
}

// The tutorials' per-token predictor: input Linear, positional encoding, one encoder
// layer (1 head, d_ff = 2·d), output net Linear → LayerNorm → ReLU → Linear.
struct ReversalModelImpl : torch::nn::Module {
  ReversalModelImpl()
      : input_net(register_module("input_net", torch::nn::Linear(kClasses, kModel))),
        positional(register_module("positional", attnlab::nn::PositionalEncoding(kModel))),
        encoder(register_module("encoder", attnlab::nn::TransformerEncoder(1, kModel, 1, 2 * kModel))),
        output_net(register_module(
            "output_net",
            torch::nn::Sequential(torch::nn::Linear(kModel, kModel),
                                  torch::nn::LayerNorm(torch::nn::LayerNormOptions({kModel})),
                                  torch::nn::ReLU(), torch::nn::Linear(kModel, kClasses)))) {}

  torch::Tensor forward(const torch::Tensor& digits) {  // [B, L] int64 → logits [B, L, classes]
    auto x = torch::one_hot(digits, kClasses).to(torch::kFloat);
    return output_net->forward(encoder(positional(input_net(x))));
  }

  torch::nn::Linear input_net;
  attnlab::nn::PositionalEncoding positional;
  attnlab::nn::TransformerEncoder encoder;
  torch::nn::Sequential output_net;
};
TORCH_MODULE(ReversalModel);

double accuracy(ReversalModel& model, const torch::Tensor& digits) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  for (int64_t start = 0; start < digits.size(0); start += 1000) {
    auto batch = digits.narrow(0, start, std::min<int64_t>(1000, digits.size(0) - start));
    correct += (model(batch).argmax(-1) == batch.flip(1)).sum().item<int64_t>();
  }
  return double(correct) / double(digits.numel());
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "train_reversal: " << e.what() << "\n";
    return 2;
  }
  torch::manual_seed(options.seed);
  auto train = torch::randint(kClasses, {options.train, kLength});
  auto test = torch::randint(kClasses, {options.test, kLength});

  ReversalModel model;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(5e-4));
  const int64_t batches = options.train / kBatch;  // the last partial batch is dropped
  const int64_t max_iters = options.epochs * batches, warmup = 50;
  int64_t iteration = 0;
  for (int64_t epoch = 1; epoch <= options.epochs; ++epoch) {
    model->train();
    auto order = torch::randperm(options.train);
    double loss_sum = 0;
    for (int64_t b = 0; b < batches; ++b) {
      // Cosine schedule with linear warm-up, stepped every iteration.
      double factor = 0.5 * (1 + std::cos(M_PI * iteration / max_iters));
      if (iteration <= warmup) factor *= double(iteration) / warmup;
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamOptions&>(group.options()).lr(5e-4 * factor);
      }
      auto digits = train.index_select(0, order.narrow(0, b * kBatch, kBatch));
      auto logits = model(digits);
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kClasses}),
                                                       digits.flip(1).reshape({-1}));
      optimizer.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      optimizer.step();
      loss_sum += loss.item<double>();
      ++iteration;
    }
    std::cout << "epoch " << epoch << ": train loss " << loss_sum / batches << "\n";
  }
  const double test_accuracy = accuracy(model, test);
  std::cout << "test accuracy " << 100.0 * test_accuracy << " %\n";
  if (test_accuracy < options.min_accuracy) {
    std::cerr << "train_reversal: accuracy " << test_accuracy << " is below --min-accuracy "
              << options.min_accuracy << "\n";
    return 1;
  }
  return 0;
}
