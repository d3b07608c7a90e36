// apps/fashion_mlp — the smallest complete training program: a two-layer perceptron
// (784 -> 256 -> 10) on Fashion-MNIST with SGD and momentum, written with loom's tensors and
// autograd alone, printing the loss as it goes and the test accuracy at the end.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "data/idx.h"
#include "loom.h"

using namespace loom;

namespace {

// uint8 images [N, 28, 28] -> float32 [N, 784] normalised with Fashion-MNIST's mean and std.
Tensor to_features(const Tensor& images) {
  return (images.reshape({images.size(0), -1}).to(kFloat32) / 255.0 - 0.2860) / 0.3530;
}

// PyTorch's default Linear initialisation: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
Tensor uniform_param(const Shape& shape, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return (rand(shape) * (2 * bound) - bound).detach().requires_grad_();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a two-layer perceptron on Fashion-MNIST with loom"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 2, batch = 128, threads = 0;
  double lr = 0.05, momentum = 0.9;
  uint64_t seed = 0;
  app.add_option("--data", data_dir, "directory with the IDX files");
  app.add_option("--epochs", epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate");
  app.add_option("--momentum", momentum, "SGD momentum");
  app.add_option("--seed", seed, "random seed");
  app.add_option("--threads", threads, "CPU threads (0: all cores)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) set_num_threads(threads);
    manual_seed(seed);
    const auto train = data::read_mnist(data_dir, /*train=*/true);
    const auto test = data::read_mnist(data_dir, /*train=*/false);
    const Tensor x_train = to_features(train.images), x_test = to_features(test.images);
    std::printf("fashion_mlp: %lld training and %lld test images, %d threads\n",
                static_cast<long long>(x_train.size(0)), static_cast<long long>(x_test.size(0)),
                get_num_threads());

    std::vector<Tensor> params = {uniform_param({256, 784}, 784), uniform_param({256}, 784),
                                  uniform_param({10, 256}, 256), uniform_param({10}, 256)};
    std::vector<Tensor> velocity;
    for (const Tensor& p : params) velocity.push_back(zeros_like(p));
    auto forward = [&](const Tensor& x) {
      return linear(relu(linear(x, params[0], params[1])), params[2], params[3]);
    };

    const int64_t n = x_train.size(0);
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      // A fresh permutation per epoch from the seeded generator: sort random keys.
      std::vector<int64_t> index(n);
      {
        const std::vector<double> keys = rand({n}, kFloat64).to_vector<double>();
        for (int64_t i = 0; i < n; ++i) index[i] = i;
        std::sort(index.begin(), index.end(),
                  [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
      }
      const Tensor order = tensor<int64_t>(index);
      double loss_sum = 0;
      int64_t steps = 0;
      for (int64_t first = 0; first + batch <= n; first += batch) {
        const Tensor rows = order.slice(0, first, first + batch);
        const Tensor xb = index_select(x_train, 0, rows);
        const Tensor yb = index_select(train.labels, 0, rows);
        Tensor loss = cross_entropy(forward(xb), yb);
        for (Tensor& p : params) p.set_grad(Tensor());
        loss.backward();
        NoGradGuard no_grad;
        for (size_t k = 0; k < params.size(); ++k) {  // v = m v + g ; p -= lr v
          velocity[k].mul_(momentum).add_(params[k].grad());
          params[k].sub_(velocity[k], lr);
        }
        loss_sum += loss.item();
        ++steps;
      }
      NoGradGuard no_grad;
      const Tensor predicted = argmax(forward(x_test), 1);
      const double accuracy =
          sum(predicted == test.labels).item() / static_cast<double>(x_test.size(0));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %d  train loss %.4f  test accuracy %.2f%%  (%.1f s)\n", epoch,
                  loss_sum / steps, 100 * accuracy, seconds);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "fashion_mlp: %s\n", e.what());
    return 2;
  }
  return 0;
}
