// autograd/ops/norm.h — differentiable normalisation layers' ops.
#pragma once

#include "tensor/tensor.h"

namespace loom {

// x [N,C,...]; weight, bias [C] or undefined. In training, normalises with the batch's
// statistics (biased variance) and, when running_mean/var are given, updates them in place
// with `momentum` (running_var with the unbiased variance), as PyTorch. In eval, normalises
// with the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// relu(batch_norm(...) + residual) (residual optional), as one op: the ReLU and the add are
// applied as y is written, and their gradients taken inside the batch norm's backward (Note
// [Batch norm with ReLU], tensor/norm.h). A residual of another shape, dtype or device falls
// back to the three ops.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training,
                       double momentum = 0.1, double eps = 1e-5, const Tensor& residual = Tensor());
// Normalises over the trailing dims given by normalized_shape; weight, bias of that shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace loom
