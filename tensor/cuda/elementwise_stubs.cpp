// tensor/cuda/elementwise_stubs.cpp — linked when loom is built without CUDA: the CUDA
// elementwise kernels of tensor/cuda/elementwise.h raise DeviceError("<op>: loom was built
// without CUDA ...").

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

Tensor add(const Tensor&, const Tensor&, double) { built_without_cuda("add"); }
Tensor sub(const Tensor&, const Tensor&, double) { built_without_cuda("sub"); }
Tensor mul(const Tensor&, const Tensor&) { built_without_cuda("mul"); }
Tensor div(const Tensor&, const Tensor&) { built_without_cuda("div"); }
Tensor pow(const Tensor&, const Tensor&) { built_without_cuda("pow"); }
Tensor maximum(const Tensor&, const Tensor&) { built_without_cuda("maximum"); }
Tensor minimum(const Tensor&, const Tensor&) { built_without_cuda("minimum"); }
Tensor add_scalar(const Tensor&, double) { built_without_cuda("add_scalar"); }
Tensor mul_scalar(const Tensor&, double) { built_without_cuda("mul_scalar"); }
Tensor pow_scalar(const Tensor&, double) { built_without_cuda("pow_scalar"); }
Tensor rsub_scalar(const Tensor&, double) { built_without_cuda("rsub_scalar"); }
Tensor div_scalar(const Tensor&, double) { built_without_cuda("div_scalar"); }
Tensor eq(const Tensor&, const Tensor&) { built_without_cuda("eq"); }
Tensor ne(const Tensor&, const Tensor&) { built_without_cuda("ne"); }
Tensor lt(const Tensor&, const Tensor&) { built_without_cuda("lt"); }
Tensor le(const Tensor&, const Tensor&) { built_without_cuda("le"); }
Tensor gt(const Tensor&, const Tensor&) { built_without_cuda("gt"); }
Tensor ge(const Tensor&, const Tensor&) { built_without_cuda("ge"); }
Tensor eq_scalar(const Tensor&, double) { built_without_cuda("eq_scalar"); }
Tensor gt_scalar(const Tensor&, double) { built_without_cuda("gt_scalar"); }
Tensor lt_scalar(const Tensor&, double) { built_without_cuda("lt_scalar"); }
Tensor neg(const Tensor&) { built_without_cuda("neg"); }
Tensor exp(const Tensor&) { built_without_cuda("exp"); }
Tensor log(const Tensor&) { built_without_cuda("log"); }
Tensor sqrt(const Tensor&) { built_without_cuda("sqrt"); }
Tensor rsqrt(const Tensor&) { built_without_cuda("rsqrt"); }
Tensor abs(const Tensor&) { built_without_cuda("abs"); }
Tensor sign(const Tensor&) { built_without_cuda("sign"); }
Tensor tanh(const Tensor&) { built_without_cuda("tanh"); }
Tensor sigmoid(const Tensor&) { built_without_cuda("sigmoid"); }
Tensor relu(const Tensor&) { built_without_cuda("relu"); }
Tensor gelu(const Tensor&, bool) { built_without_cuda("gelu"); }
Tensor clamp(const Tensor&, double, double) { built_without_cuda("clamp"); }
Tensor where(const Tensor&, const Tensor&, const Tensor&) { built_without_cuda("where"); }
Tensor relu_backward(const Tensor&, const Tensor&) { built_without_cuda("relu_backward"); }
Tensor sigmoid_backward(const Tensor&, const Tensor&) { built_without_cuda("sigmoid_backward"); }
Tensor tanh_backward(const Tensor&, const Tensor&) { built_without_cuda("tanh_backward"); }
Tensor gelu_backward(const Tensor&, const Tensor&, bool) { built_without_cuda("gelu_backward"); }
Tensor clamp_backward(const Tensor&, const Tensor&, double, double) {
  built_without_cuda("clamp_backward");
}
void add_(const Tensor&, const Tensor&, double) { built_without_cuda("add_"); }
void sub_(const Tensor&, const Tensor&, double) { built_without_cuda("sub_"); }
void mul_(const Tensor&, const Tensor&) { built_without_cuda("mul_"); }
void div_(const Tensor&, const Tensor&) { built_without_cuda("div_"); }
void mul_scalar_(const Tensor&, double) { built_without_cuda("mul_scalar_"); }
void add_scalar_(const Tensor&, double) { built_without_cuda("add_scalar_"); }
void addcmul_(const Tensor&, const Tensor&, const Tensor&, double) {
  built_without_cuda("addcmul_");
}
void addcdiv_(const Tensor&, const Tensor&, const Tensor&, double) {
  built_without_cuda("addcdiv_");
}

}  // namespace loom::cuda
