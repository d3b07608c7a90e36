// tensor/cuda/elementwise_inplace.cu — the in-place elementwise ops on CUDA (add_, mul_,
// addcmul_, ...; tensor/cuda/elementwise.h; the shared helpers in elementwise_ops.cuh).

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/elementwise_ops.cuh"

namespace loom::cuda {

using namespace elementwise_detail;  // NOLINT: this file's ops are built from its helpers

// ---------------------------------------------------------------- in place

void add_(const Tensor& self, const Tensor& other, double alpha) {
  if (alpha == 1.0)
    return inplace_binary("add_", self, other, [] __device__(auto x, auto y) { return x + y; });
  inplace_binary("add_", self, other, [alpha] __device__(auto x, auto y) {
    return x + static_cast<decltype(x)>(alpha) * y;
  });
}
void sub_(const Tensor& self, const Tensor& other, double alpha) {
  inplace_binary("sub_", self, other, [alpha] __device__(auto x, auto y) {
    return x - static_cast<decltype(x)>(alpha) * y;
  });
}
void mul_(const Tensor& self, const Tensor& other) {
  inplace_binary("mul_", self, other, [] __device__(auto x, auto y) { return x * y; });
}
void div_(const Tensor& self, const Tensor& other) {
  LOOM_CHECK(is_floating(self.dtype()), DTypeError, "div_: true division cannot write into a ",
             self.dtype(), " tensor");
  inplace_binary("div_", self, other, [] __device__(auto x, auto y) { return x / y; });
}
void mul_scalar_(const Tensor& self, double value) {
  inplace_scalar("mul_", self, value, [] __device__(auto x, auto v) { return x * v; });
}
void add_scalar_(const Tensor& self, double value) {
  inplace_scalar("add_", self, value, [] __device__(auto x, auto v) { return x + v; });
}

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  inplace_ternary("addcmul_", self, a, b, [alpha] __device__(auto x, auto p, auto q) {
    using T = decltype(x);
    return x + static_cast<T>(alpha) * p * q;
  });
}
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  inplace_ternary("addcdiv_", self, a, b, [alpha] __device__(auto x, auto p, auto q) {
    using T = decltype(x);
    return x + static_cast<T>(alpha) * p / q;
  });
}

}  // namespace loom::cuda
