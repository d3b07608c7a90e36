// tensor/view.h — views: new sizes, strides and offset over the same storage, no copy.
// Not differentiable: autograd/ops/view.cpp wraps each with its backward. Each checks its
// arguments and raises ShapeError or IndexError naming the op and the shape.
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset);
// The shape a view/reshape asks for, with one -1 inferred.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op);
// A view with a new shape; raises ShapeError when the strides do not allow it (use reshape).
Tensor view(const Tensor& t, const Shape& shape);
// view when possible, else a contiguous copy.
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor permute(const Tensor& t, const Shape& dims);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim);
// A tensor sharing t's storage and layout but with no autograd history (detach's kernel).
Tensor alias(const Tensor& t);

}  // namespace loom::kernels
