// tensor/cuda/optim_stubs.cpp — tensor/cuda/optim.h in a build without CUDA.

#include "tensor/cuda/optim.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

void sgd_update(const Tensor&, const Tensor&, const Tensor&, const SgdStep&) {
  built_without_cuda("SGD");
}
void adam_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const AdamStep&) {
  built_without_cuda("Adam");
}
void unscale_and_check_(const Tensor&, double, const Tensor&) {
  built_without_cuda("GradScaler: unscale_");
}

}  // namespace loom::cuda
