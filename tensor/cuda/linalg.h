// tensor/cuda/linalg.h — the CUDA side of tensor/linalg.h: matrix products through cuBLAS
// (tensor/cuda/linalg.cu), with the names and semantics of the loom::kernels ones, which check
// the arguments and then switch here. Host-only.
// Operands are read in place when they have a unit stride in either matrix dim (a transposed
// view costs nothing); float32, float64, float16 and bfloat16 (the 16-bit types on tensor
// cores, accumulating in float32). float32 may use TF32 (tensor/cuda/blas.h).
#pragma once

#include "tensor/linalg.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// out = beta * out + alpha * (a @ b) for out [M,N] (beta = 0 ignores out's old values, NaNs
// included). Bumps out's version.
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha = 1.0,
            double beta = 0.0);
// a [B,M,K] @ b [B,K,N] -> [B,M,N], contiguous.
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace loom::cuda
