// tensor/elementwise.h — elementwise kernels with NumPy broadcasting. Not differentiable:
// autograd/ops/elementwise.cpp wraps each with its backward.
// Binary ops promote their operands (promote_types) and compute in the promoted type; float
// ops accept float32 and float64, and float16 and bfloat16, which compute in float and round
// the result once (Note [16-bit arithmetic] in tensor/cuda/float16.h). addcmul_ and addcdiv_,
// the optimizers' updates, take float32 and float64 only.
// In-place variants (suffix _) write into their first argument, which must already have the
// broadcast shape, and bump its version.
// tensor/elementwise.cpp is the front (checks, the device switch, the CPU's 16-bit rule);
// tensor/cpu/elementwise.cpp and tensor/cuda/elementwise*.cu hold the loops and the kernels.
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

// --- binary, broadcasting ---
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// With a scalar operand (kept in a's dtype).
Tensor add_scalar(const Tensor& a, double b);
Tensor mul_scalar(const Tensor& a, double b);
Tensor pow_scalar(const Tensor& a, double exponent);
Tensor rsub_scalar(const Tensor& a, double b);  // b - a
Tensor div_scalar(const Tensor& a, double b);

// --- comparisons: bool results ---
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq_scalar(const Tensor& a, double b);
Tensor gt_scalar(const Tensor& a, double b);
Tensor lt_scalar(const Tensor& a, double b);

// --- unary ---
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor clamp(const Tensor& x, double min, double max);  // use +-infinity for one-sided

// --- ternary ---
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);  // condition: bool

// --- backward helpers (fused, so backward passes do not build temporaries) ---
Tensor relu_backward(const Tensor& dout, const Tensor& out);     // dout * (out > 0)
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out);  // dout * y(1-y)
Tensor tanh_backward(const Tensor& dout, const Tensor& out);     // dout * (1-y^2)
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation);
Tensor clamp_backward(const Tensor& dout, const Tensor& x, double min, double max);

// --- in place ---
void add_(const Tensor& self, const Tensor& other, double alpha = 1.0);
void sub_(const Tensor& self, const Tensor& other, double alpha = 1.0);
void mul_(const Tensor& self, const Tensor& other);
void div_(const Tensor& self, const Tensor& other);
void mul_scalar_(const Tensor& self, double value);
void add_scalar_(const Tensor& self, double value);
// self += alpha * a * b (the optimizers' addcmul_) and self += alpha * a / b (addcdiv_).
void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha = 1.0);
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha = 1.0);

}  // namespace loom::kernels
