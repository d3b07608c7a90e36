// tensor/cuda/elementwise_compare.cu — the elementwise comparisons on CUDA, tensor with tensor
// and with a scalar, into bool tensors (tensor/cuda/elementwise.h; the shared helpers in
// elementwise_ops.cuh).

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/elementwise_ops.cuh"

namespace loom::cuda {

using namespace elementwise_detail;  // NOLINT: this file's ops are built from its helpers

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  return compare("eq", a, b, [] __device__(auto x, auto y) { return x == y; });
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare("ne", a, b, [] __device__(auto x, auto y) { return x != y; });
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare("lt", a, b, [] __device__(auto x, auto y) { return x < y; });
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare("le", a, b, [] __device__(auto x, auto y) { return x <= y; });
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare("gt", a, b, [] __device__(auto x, auto y) { return x > y; });
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare("ge", a, b, [] __device__(auto x, auto y) { return x >= y; });
}
Tensor eq_scalar(const Tensor& a, double b) {
  return compare_scalar("eq", a, b, [] __device__(double x, double y) { return x == y; });
}
Tensor gt_scalar(const Tensor& a, double b) {
  return compare_scalar("gt", a, b, [] __device__(double x, double y) { return x > y; });
}
Tensor lt_scalar(const Tensor& a, double b) {
  return compare_scalar("lt", a, b, [] __device__(double x, double y) { return x < y; });
}

}  // namespace loom::cuda
