// tensor/cuda/loss_stubs.cpp — the CUDA softmax family and losses in a build without CUDA: no
// tensor lives on a GPU there, so each raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/loss.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

Tensor softmax(const Tensor&, int64_t) { built_without_cuda("softmax"); }
Tensor log_softmax(const Tensor&, int64_t) { built_without_cuda("log_softmax"); }
Tensor softmax_backward(const Tensor&, const Tensor&, int64_t) {
  built_without_cuda("softmax_backward");
}
Tensor log_softmax_backward(const Tensor&, const Tensor&, int64_t) {
  built_without_cuda("log_softmax_backward");
}
int64_t check_class_target(const char* op, const Tensor&, const Tensor&, int64_t) {
  built_without_cuda(op);
}
kernels::CrossEntropyForward cross_entropy_forward(const Tensor&, const Tensor&, Reduction, int64_t,
                                                   double) {
  built_without_cuda("cross_entropy");
}
Tensor cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Reduction,
                              int64_t, double, const Tensor&) {
  built_without_cuda("cross_entropy_backward");
}
kernels::NllLossForward nll_loss_forward(const Tensor&, const Tensor&, const Tensor&, Reduction,
                                         int64_t) {
  built_without_cuda("nll_loss");
}
Tensor nll_loss_backward(const Tensor&, const Shape&, const Tensor&, const Tensor&, Reduction,
                         int64_t, double) {
  built_without_cuda("nll_loss_backward");
}
Tensor mse_loss(const Tensor&, const Tensor&, Reduction) { built_without_cuda("mse_loss"); }
Tensor mse_loss_backward(const Tensor&, const Tensor&, const Tensor&, Reduction) {
  built_without_cuda("mse_loss_backward");
}

}  // namespace loom::cuda
