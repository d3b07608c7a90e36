// nn/init.h — parameter initialisation, in place, with PyTorch's formulas (torch.nn.init):
// the draws come from loom's default generator, so a seed fixes them; the distributions (not
// the exact numbers) match PyTorch's.
#pragma once

#include <string>
#include <utility>

#include "tensor/tensor.h"

namespace loom::nn::init {

// fan_in and fan_out of a weight [out, in, k...] (receptive field = product of k...); ValueError
// for fewer than 2 dims.
std::pair<int64_t, int64_t> fans(const Tensor& weight);
// The recommended gain of a nonlinearity: "linear", "conv2d", "sigmoid" -> 1, "tanh" -> 5/3,
// "relu" -> sqrt(2), "leaky_relu" -> sqrt(2 / (1 + a^2)), "selu" -> 3/4.
double calculate_gain(const std::string& nonlinearity, double a = 0.0);

void uniform_(const Tensor& t, double low = 0.0, double high = 1.0);
void normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
void constant_(const Tensor& t, double value);
void zeros_(const Tensor& t);
void ones_(const Tensor& t);

// mode "fan_in" or "fan_out"; std = gain / sqrt(fan); uniform bound = sqrt(3) std.
void kaiming_uniform_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                      const std::string& nonlinearity = "leaky_relu");
void kaiming_normal_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                     const std::string& nonlinearity = "leaky_relu");
// std = gain sqrt(2 / (fan_in + fan_out)).
void xavier_uniform_(const Tensor& t, double gain = 1.0);
void xavier_normal_(const Tensor& t, double gain = 1.0);

}  // namespace loom::nn::init
