// tensor/cuda/norm_stubs.cpp — the CUDA batch norm and layer norm kernels in a build without
// CUDA: no tensor lives on a GPU there, so each raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/norm.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

kernels::BatchNormSums batch_norm_sums(const Tensor&) { built_without_cuda("batch_norm_sums"); }
kernels::BatchNormStats batch_norm_stats_from_sums(const Tensor&, const Tensor&, int64_t, double,
                                                   DType) {
  built_without_cuda("batch_norm_stats_from_sums");
}
kernels::BatchNormStats batch_norm_stats(const Tensor&, double) {
  built_without_cuda("batch_norm_stats");
}
Tensor batch_norm_invstd(const Tensor&, double) { built_without_cuda("batch_norm_invstd"); }
void batch_norm_update_running_stats_(const Tensor&, const Tensor&, const kernels::BatchNormStats&,
                                      double) {
  built_without_cuda("batch_norm_update_running_stats_");
}
Tensor batch_norm_elemt(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const kernels::BatchNormEpilogue&) {
  built_without_cuda("batch_norm_elemt");
}
std::pair<Tensor, kernels::BatchNormStats> batch_norm_forward_train(
    const Tensor&, const Tensor&, const Tensor&, double, const kernels::BatchNormEpilogue&) {
  built_without_cuda("batch_norm");
}
std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor&, const Tensor&, const Tensor&,
                                                     const Tensor&) {
  built_without_cuda("batch_norm_backward_reduce");
}
Tensor batch_norm_backward_elemt(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, int64_t) {
  built_without_cuda("batch_norm_backward_elemt");
}
kernels::NormGrads batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, bool, std::array<bool, 3>, const Tensor&,
                                       bool) {
  built_without_cuda("batch_norm_backward");
}
kernels::LayerNormForward layer_norm_forward(const Tensor&, int64_t, const Tensor&, const Tensor&,
                                             double) {
  built_without_cuda("layer_norm");
}
kernels::NormGrads layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, int64_t, std::array<bool, 3>) {
  built_without_cuda("layer_norm_backward");
}

}  // namespace loom::cuda
