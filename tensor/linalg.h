// tensor/linalg.h — matrix products (GEMM through Eigen on the CPU). Operands may be any 2-D
// views with a unit stride in either dim: a transposed operand is a free view (t.t()), never a
// copy. Not differentiable: autograd/ops/linalg.cpp wraps them. tensor/linalg.cpp is the front
// (checks, the device switch, the CPU's 16-bit rule); tensor/cpu/linalg.cpp and
// tensor/cuda/linalg.cu hold the GEMM calls.
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

// a [M,K] @ b [K,N] -> [M,N]
Tensor mm(const Tensor& a, const Tensor& b);
// beta * c + alpha * (a @ b), c broadcast to [M,N]
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, double beta = 1.0,
             double alpha = 1.0);
// out = beta * out + alpha * (a @ b) into an existing [M,N] tensor with a unit inner stride
// (beta = 0 ignores out's old values, NaNs included). Bumps out's version.
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha = 1.0,
            double beta = 0.0);
// a [B,M,K] @ b [B,K,N] -> [B,M,N]
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace loom::kernels
