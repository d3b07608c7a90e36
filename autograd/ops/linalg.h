// autograd/ops/linalg.h — differentiable matrix products.
#pragma once

#include "tensor/tensor.h"

namespace loom {

// a [M,K] @ b [K,N] -> [M,N]; 1-D operands as in PyTorch (vector-matrix, matrix-vector, dot);
// batched operands ([..., M, K] @ [..., K, N]) broadcast their batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// a [B,M,K] @ b [B,K,N] -> [B,M,N]
Tensor bmm(const Tensor& a, const Tensor& b);
// beta * input + alpha * (a [M,K] @ b [K,N]); input broadcasts to [M,N]
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, double beta = 1.0,
             double alpha = 1.0);
// x [..., in] @ weight[out, in]^T + bias[out] (nn.Linear's op, without a transpose copy)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace loom
