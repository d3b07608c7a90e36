// tensor/cuda/conv_stubs.cpp — tensor/cuda/conv.h in a build without CUDA: every entry point
// raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/conv.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, const kernels::Conv2dOptions&) {
  built_without_cuda("conv2d");
}

kernels::Conv2dGrads conv2d_backward(const Tensor&, const Tensor&, const Tensor&,
                                     const kernels::Conv2dOptions&, std::array<bool, 3>) {
  built_without_cuda("conv2d_backward");
}

}  // namespace loom::cuda
