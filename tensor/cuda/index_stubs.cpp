// tensor/cuda/index_stubs.cpp — stand-ins for tensor/cuda/index.h in a build without CUDA: each
// raises DeviceError naming the op.

#include "tensor/cuda/index.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

Tensor cat(const std::vector<Tensor>&, int64_t) { built_without_cuda("cat"); }
Tensor index_select(const Tensor&, int64_t, const Tensor&) { built_without_cuda("index_select"); }
void index_add_(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  built_without_cuda("index_add_");
}
Tensor gather(const Tensor&, int64_t, const Tensor&) { built_without_cuda("gather"); }
void scatter_add_(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  built_without_cuda("scatter_add_");
}
void scatter_add_into(const Tensor&, int64_t, const Tensor&, const Tensor&, const char* op) {
  built_without_cuda(op);
}
Tensor scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  built_without_cuda("scatter_add");
}
Tensor one_hot(const Tensor&, int64_t) { built_without_cuda("one_hot"); }
Tensor embedding(const Tensor&, const Tensor&) { built_without_cuda("embedding"); }
Tensor embedding_backward(const Tensor&, const Tensor&, int64_t, int64_t) {
  built_without_cuda("embedding_backward");
}
Tensor dropout_masked(const Tensor&, double, uint64_t, uint64_t) { built_without_cuda("dropout"); }

}  // namespace loom::cuda
