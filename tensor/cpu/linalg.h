// tensor/cpu/linalg.h — the CPU matrix products (tensor/linalg.h), which its front
// (tensor/linalg.cpp) calls for CPU tensors, shapes and dtypes checked, 16-bit operands widened.
#pragma once

#include "tensor/tensor.h"

namespace loom::cpu {

// out = beta * out + alpha * (a @ b), out [M,N] with a unit inner stride, of a's dtype; bumps
// out's version. A dtype other than float32 or float64 raises DTypeError.
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
// a [B,M,K] @ b [B,K,N] -> [B,M,N], one mm_out per matrix.
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace loom::cpu
