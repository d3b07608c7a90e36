// tensor/cuda/linalg_stubs.cpp — tensor/cuda/linalg.h in a build without CUDA: every entry
// point raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/linalg.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

void mm_out(const Tensor&, const Tensor&, const Tensor&, double, double) {
  built_without_cuda("mm");
}
Tensor bmm(const Tensor&, const Tensor&) { built_without_cuda("bmm"); }

}  // namespace loom::cuda
