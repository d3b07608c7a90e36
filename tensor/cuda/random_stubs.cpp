// tensor/cuda/random_stubs.cpp — stand-ins for tensor/cuda/random.h in a build without CUDA:
// each raises DeviceError naming the fill.

#include "tensor/cuda/random.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

void fill_uniform_(const Tensor&, uint64_t, uint64_t, double, double) {
  built_without_cuda("fill_uniform_");
}
void fill_normal_(const Tensor&, uint64_t, uint64_t, double, double) {
  built_without_cuda("fill_normal_");
}
void fill_randint_(const Tensor&, uint64_t, uint64_t, int64_t, int64_t) {
  built_without_cuda("fill_randint_");
}

}  // namespace loom::cuda
