// nn/init.cpp — the initialisers of nn/init.h.

#include "nn/init.h"

#include <cmath>

#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"

namespace loom::nn::init {

namespace k = kernels;

std::pair<int64_t, int64_t> fans(const Tensor& weight) {
  LOOM_CHECK(weight.dim() >= 2, ValueError,
             "init: fan in and fan out need a tensor of at least 2 dims; got ", weight.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return {weight.size(1) * receptive, weight.size(0) * receptive};
}

double calculate_gain(const std::string& nonlinearity, double a) {
  if (nonlinearity == "linear" || nonlinearity == "conv2d" || nonlinearity == "sigmoid" ||
      nonlinearity == "conv1d" || nonlinearity == "conv3d")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + a * a));
  if (nonlinearity == "selu") return 0.75;
  throw ValueError(detail::str("calculate_gain: unknown nonlinearity '", nonlinearity, "'"));
}

// Draws replace t's values in place, whatever its dtype and device; no graph is recorded.
void uniform_(const Tensor& t, double low, double high) {
  autograd::NoGradGuard no_grad;
  Tensor u = k::add_scalar(k::mul_scalar(rand(t.sizes(), kFloat64), high - low), low);
  k::copy_(t, u);
  t.bump_version();
}

void normal_(const Tensor& t, double mean, double std) {
  autograd::NoGradGuard no_grad;
  Tensor z = k::add_scalar(k::mul_scalar(randn(t.sizes(), kFloat64), std), mean);
  k::copy_(t, z);
  t.bump_version();
}

void constant_(const Tensor& t, double value) {
  autograd::NoGradGuard no_grad;
  k::fill_(t, value);
  t.bump_version();
}
void zeros_(const Tensor& t) { constant_(t, 0.0); }
void ones_(const Tensor& t) { constant_(t, 1.0); }

namespace {
double kaiming_std(const Tensor& t, double a, const std::string& mode,
                   const std::string& nonlinearity) {
  const auto [fan_in, fan_out] = fans(t);
  LOOM_CHECK(mode == "fan_in" || mode == "fan_out", ValueError,
             "kaiming init: mode must be 'fan_in' or 'fan_out'; got '", mode, "'");
  const double fan = static_cast<double>(mode == "fan_in" ? fan_in : fan_out);
  return calculate_gain(nonlinearity, a) / std::sqrt(fan);
}
}  // namespace

void kaiming_uniform_(const Tensor& t, double a, const std::string& mode,
                      const std::string& nonlinearity) {
  const double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity);
  uniform_(t, -bound, bound);
}

void kaiming_normal_(const Tensor& t, double a, const std::string& mode,
                     const std::string& nonlinearity) {
  normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity));
}

void xavier_uniform_(const Tensor& t, double gain) {
  const auto [fan_in, fan_out] = fans(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform_(t, -bound, bound);
}

void xavier_normal_(const Tensor& t, double gain) {
  const auto [fan_in, fan_out] = fans(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace loom::nn::init
