// tensor/cpu/norm.h — the CPU loops of batch norm and layer norm (tensor/norm.h, whose front
// checks the arguments and calls these for CPU tensors). Each takes the arguments of its
// kernels:: entry as checked there, on the CPU; a batch norm's x (and dy, residual, relu_y) is
// float32 or float64, the front having widened a 16-bit one.
#pragma once

#include <array>
#include <utility>

#include "tensor/norm.h"

namespace loom::cpu {

// Per-channel float64 sum and sum of squares of x [N, C, *].
kernels::BatchNormSums batch_norm_sums(const Tensor& x);
// mean, var and invstd in the floating `dtype` from sums of C values each, over count > 0
// values a channel.
kernels::BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq,
                                                   int64_t count, double eps, DType dtype);
// Two-pass statistics of x, computed in double and rounded once to the floating `dtype`.
kernels::BatchNormStats batch_norm_stats(const Tensor& x, double eps, DType dtype);
// 1 / sqrt(var + eps), through the elementwise kernels.
Tensor batch_norm_invstd(const Tensor& var, double eps);
// The running statistics' update, through the elementwise kernels; shapes and count checked.
void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const kernels::BatchNormStats& stats, double momentum);
// y = (x - mean) invstd weight + bias, then the epilogue; vectors of C values (or undefined).
Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const kernels::BatchNormEpilogue& epilogue);
// The batch's statistics in x's dtype, then y, one channel per thread.
std::pair<Tensor, kernels::BatchNormStats> batch_norm_forward_train(
    const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
    const kernels::BatchNormEpilogue& epilogue);
// The float64 sum(dy) and sum(dy x_hat) per channel; dy of x's shape, converted to x's dtype.
std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd);
// dx from the sums over count > 0 values (both given), or eval-mode dx (neither given).
Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count);
// The fused backward, one channel per thread; relu_y (if given) of x's shape and dtype, and
// given whenever need_dresidual.
kernels::NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& invstd, const Tensor& weight, bool training,
                                       std::array<bool, 3> need, const Tensor& relu_y,
                                       bool need_dresidual);
// Layer norm of x [M, D] (D = normalized_numel divides x) in float32 or float64.
kernels::LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel,
                                             const Tensor& weight, const Tensor& bias, double eps);
// Its backward; mean and rstd of M values, weight of D (or undefined).
kernels::NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& rstd, const Tensor& weight,
                                       int64_t normalized_numel, std::array<bool, 3> need);

}  // namespace loom::cpu
