// tensor/cuda/optim_stubs.cpp — tensor/cuda/optim.h in a build without CUDA.

#include "tensor/cuda/optim.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

void sgd_update(std::span<const SgdTensors>, const SgdStep&) { built_without_cuda("SGD"); }
void adam_update(std::span<const AdamTensors>, const AdamStep&) { built_without_cuda("Adam"); }
void unscale_and_check_(std::span<const Tensor>, double, const Tensor&) {
  built_without_cuda("GradScaler: unscale_");
}

}  // namespace loom::cuda
