// tensor/cpu/elementwise.h — the CPU loops of the elementwise kernels (tensor/elementwise.h),
// which its front (tensor/elementwise.cpp) calls for CPU tensors.
//
// Each may assume what the front has checked: CPU tensors, shapes that broadcast (into self for
// the in-place ones), a condition of dtype bool, min <= max, a float self for div_. None computes
// in float16 or bfloat16: the front widens those computations to float32 and rounds the result
// once; an operand of a mixed-dtype op is converted to the op's compute type here, a 16-bit one
// included. A dtype the loops have no instance for (bool arithmetic, an integer exp) raises
// DTypeError from the dtype dispatch (tensor/dispatch.h).
#pragma once

#include "tensor/tensor.h"

namespace loom::cpu {

// --- binary, broadcasting, in the promoted dtype
Tensor add(const Tensor& a, const Tensor& b, double alpha);  // a + alpha * b
// a + alpha * b of two bfloat16 tensors, each element widened, computed in float32 and
// rounded once in the loop: the bits of add on float32 copies, without the copies.
Tensor add_bfloat16(const Tensor& a, const Tensor& b, double alpha);
Tensor sub(const Tensor& a, const Tensor& b, double alpha);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);                // a * b
Tensor div(const Tensor& a, const Tensor& b);                // a / b; integers as float32
Tensor pow(const Tensor& a, const Tensor& b);                // a ^ b; integers by squaring
Tensor maximum(const Tensor& a, const Tensor& b);            // NaN propagates
Tensor minimum(const Tensor& a, const Tensor& b);            // NaN propagates
// With a scalar operand, in a's dtype (float32 for an integer a and a fractional scalar).
Tensor add_scalar(const Tensor& a, double b);         // a + b
Tensor mul_scalar(const Tensor& a, double b);         // a * b
Tensor pow_scalar(const Tensor& a, double exponent);  // x*x for 2, sqrt for a float a and 0.5
Tensor rsub_scalar(const Tensor& a, double b);        // b - a
Tensor div_scalar(const Tensor& a, double b);         // an integer a divides as float32

// --- comparisons: bool results; the scalar ones compare in double
Tensor eq(const Tensor& a, const Tensor& b);  // a == b
Tensor ne(const Tensor& a, const Tensor& b);  // a != b
Tensor lt(const Tensor& a, const Tensor& b);  // a < b
Tensor le(const Tensor& a, const Tensor& b);  // a <= b
Tensor gt(const Tensor& a, const Tensor& b);  // a > b
Tensor ge(const Tensor& a, const Tensor& b);  // a >= b
Tensor eq_scalar(const Tensor& a, double b);  // a == b
Tensor gt_scalar(const Tensor& a, double b);  // a > b
Tensor lt_scalar(const Tensor& a, double b);  // a < b

// --- unary, in x's dtype: neg, abs, sign, relu and clamp for any numeric x, the rest float only
Tensor neg(const Tensor& x);                            // -x
Tensor abs(const Tensor& x);                            // |x|
Tensor sign(const Tensor& x);                           // -1, 0 or 1
Tensor exp(const Tensor& x);                            // e^x
Tensor log(const Tensor& x);                            // ln x
Tensor sqrt(const Tensor& x);                           // x^(1/2)
Tensor rsqrt(const Tensor& x);                          // 1 / sqrt(x)
Tensor tanh(const Tensor& x);                           // tanh x
Tensor sigmoid(const Tensor& x);                        // 1 / (1 + e^-x)
Tensor relu(const Tensor& x);                           // max(x, 0)
Tensor gelu(const Tensor& x, bool tanh_approximation);  // erf form, or the tanh approximation
Tensor clamp(const Tensor& x, double min, double max);  // NaN stays NaN

// condition ? a : b in the promoted dtype of a and b, broadcast.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);

// --- fused backwards: dout * f'(saved), in dout's (float) dtype, dout and saved of one dtype
Tensor relu_backward(const Tensor& dout, const Tensor& out);     // dout * (out > 0)
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out);  // dout * y(1-y)
Tensor tanh_backward(const Tensor& dout, const Tensor& out);     // dout * (1-y^2)
// dout * gelu'(x), of the erf form or the tanh approximation
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation);
// dout where min <= x <= max, else 0
Tensor clamp_backward(const Tensor& dout, const Tensor& x, double min, double max);

// --- in place: self = f(self, other converted to self's dtype); each bumps self's version
void add_(const Tensor& self, const Tensor& other, double alpha);  // self += alpha * other
void sub_(const Tensor& self, const Tensor& other, double alpha);  // self -= alpha * other
void mul_(const Tensor& self, const Tensor& other);                // self *= other
void div_(const Tensor& self, const Tensor& other);                // self /= other
void mul_scalar_(const Tensor& self, double value);                // self *= value
void add_scalar_(const Tensor& self, double value);                // self += value
// self += alpha * a * b and self += alpha * a / b, for a float32 or float64 self.
void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha);
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha);

}  // namespace loom::cpu
