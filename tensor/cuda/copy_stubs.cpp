// tensor/cuda/copy_stubs.cpp — linked when loom is built without CUDA: the CUDA copies of
// tensor/cuda/copy.h raise DeviceError("<op>: loom was built without CUDA ...").

#include "tensor/cuda/copy.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

void copy_(const Tensor&, const Tensor&) { built_without_cuda("copy_"); }
void fill_(const Tensor&, double) { built_without_cuda("fill_"); }

}  // namespace loom::cuda
