// tensor/cuda/norm.h — the CUDA batch norm and layer norm kernels behind tensor/norm.h: same
// names, signatures and results as the loom::kernels ones (the front, tensor/norm.cpp, checks
// the arguments, then switches here for CUDA tensors), including the pieces SyncBatchNorm allreduces
// between (Note [Batch norm pieces]). Host-only header; kernels in tensor/cuda/norm.cu.
#pragma once

#include <array>
#include <utility>

#include "tensor/norm.h"
#include "tensor/tensor.h"

namespace loom::cuda {

kernels::BatchNormSums batch_norm_sums(const Tensor& x);
kernels::BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq,
                                                   int64_t count, double eps, DType dtype);
kernels::BatchNormStats batch_norm_stats(const Tensor& x, double eps);
Tensor batch_norm_invstd(const Tensor& var, double eps);
void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const kernels::BatchNormStats& stats, double momentum);
Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const kernels::BatchNormEpilogue& epilogue = {});
std::pair<Tensor, kernels::BatchNormStats> batch_norm_forward_train(
    const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
    const kernels::BatchNormEpilogue& epilogue = {});
std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd);
Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count);
kernels::NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& invstd, const Tensor& weight, bool training,
                                       std::array<bool, 3> need, const Tensor& relu_y = Tensor(),
                                       bool need_dresidual = false);

kernels::LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel,
                                             const Tensor& weight, const Tensor& bias, double eps);
kernels::NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& rstd, const Tensor& weight,
                                       int64_t normalized_numel, std::array<bool, 3> need);

}  // namespace loom::cuda
