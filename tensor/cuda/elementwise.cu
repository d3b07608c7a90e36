// tensor/cuda/elementwise.cu — the elementwise kernels on CUDA: the binary arithmetic here,
// the comparisons in elementwise_compare.cu, the unary ops in elementwise_unary.cu, the in-place
// ones in elementwise_inplace.cu, and their shared helpers in elementwise_ops.cuh. Each op is a
// __device__ lambda over the strided map of tensor/cuda/loops.cuh (Note [CUDA elementwise loops]:
// one element, or one 4-element vector, per thread per grid-stride step). Mirrors
// tensor/cpu/elementwise.cpp: same checks, dtypes, promotion, outputs and version bumps; inputs are
// converted with cuda::copy_. float16 and bfloat16 elements are widened to float and the result
// rounded once (InMath, Note [16-bit arithmetic] in tensor/cuda/float16.h).

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/elementwise_ops.cuh"

namespace loom::cuda {

using namespace elementwise_detail;  // NOLINT: this file's ops are built from its helpers

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("add", a, b, [] __device__(auto x, auto y) { return x + y; });
  return arithmetic("add", a, b, [alpha] __device__(auto x, auto y) {
    return x + static_cast<decltype(y)>(alpha) * y;
  });
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("sub", a, b, [] __device__(auto x, auto y) { return x - y; });
  return arithmetic("sub", a, b, [alpha] __device__(auto x, auto y) {
    return x - static_cast<decltype(y)>(alpha) * y;
  });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return arithmetic("mul", a, b, [] __device__(auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  // True division: integers divide as float32, as in PyTorch.
  DType t = promote_types(a.dtype(), b.dtype());
  if (!is_floating(t)) t = kFloat32;
  return binary<false>("div", a, b, t, [] __device__(auto x, auto y) { return x / y; });
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return arithmetic("pow", a, b, [] __device__(auto x, auto y) { return generic_pow(x, y); });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return arithmetic("maximum", a, b, [] __device__(auto x, auto y) {
    return (x != x || x > y) ? x : y;  // NaN propagates
  });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return arithmetic("minimum", a, b,
                    [] __device__(auto x, auto y) { return (x != x || x < y) ? x : y; });
}

Tensor add_scalar(const Tensor& a, double b) {
  return with_scalar("add", a, b, [] __device__(auto x, auto v) { return x + v; });
}
Tensor mul_scalar(const Tensor& a, double b) {
  return with_scalar("mul", a, b, [] __device__(auto x, auto v) { return x * v; });
}
Tensor rsub_scalar(const Tensor& a, double b) {
  return with_scalar("rsub", a, b, [] __device__(auto x, auto v) { return v - x; });
}
Tensor div_scalar(const Tensor& a, double b) {
  const Tensor af = is_floating(a.dtype()) ? a : kernels::to_dtype(a, kFloat32);
  return with_scalar("div", af, b, [] __device__(auto x, auto v) { return x / v; });
}
Tensor pow_scalar(const Tensor& a, double exponent) {
  if (exponent == 2.0)
    return with_scalar("pow", a, exponent, [] __device__(auto x, auto) { return x * x; });
  if (exponent == 0.5 && is_floating(a.dtype()))
    return unary_float("pow", a, [] __device__(auto x) { return dev_sqrt(x); });
  return with_scalar("pow", a, exponent,
                     [] __device__(auto x, auto v) { return generic_pow(x, v); });
}

}  // namespace loom::cuda
