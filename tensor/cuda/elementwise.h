// tensor/cuda/elementwise.h — the CUDA kernels behind tensor/elementwise.h: the same functions,
// names and signatures in namespace loom::cuda, for tensors on one CUDA device. The front,
// tensor/elementwise.cpp, calls them for CUDA tensors (through tensor/cuda_backend.h); each
// checks its arguments as the CPU one does and returns exactly what it returns (dtype, shape, contiguity, version bumps).
// Host-only header; defined in tensor/cuda/elementwise.cu.
#pragma once

#include "tensor/elementwise.h"
#include "tensor/tensor.h"

namespace loom::cuda {

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

}  // namespace loom::cuda
