// tensor/cuda/pool_stubs.cpp — tensor/cuda/pool.h in a build without CUDA: every entry point
// raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/pool.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

std::pair<Tensor, Tensor> max_pool2d(const Tensor&, const kernels::Pool2dOptions&) {
  built_without_cuda("max_pool2d");
}
Tensor max_pool2d_backward(const Tensor&, const Tensor&, const Shape&, MemoryFormat) {
  built_without_cuda("max_pool2d_backward");
}
Tensor avg_pool2d(const Tensor&, const kernels::Pool2dOptions&) {
  built_without_cuda("avg_pool2d");
}
Tensor avg_pool2d_backward(const Tensor&, const Shape&, const kernels::Pool2dOptions&,
                           MemoryFormat) {
  built_without_cuda("avg_pool2d_backward");
}
Tensor adaptive_avg_pool2d(const Tensor&, kernels::Pair) {
  built_without_cuda("adaptive_avg_pool2d");
}
Tensor adaptive_avg_pool2d_backward(const Tensor&, const Shape&, MemoryFormat) {
  built_without_cuda("adaptive_avg_pool2d_backward");
}

}  // namespace loom::cuda
