// autograd/ops/view.h — differentiable views and conversions. A view's backward puts the
// gradient back in the input's shape (reshape back, permute back, pad with zeros, sum over the
// expanded dims).
#pragma once

#include "tensor/tensor.h"

namespace loom {

Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);
Tensor contiguous(const Tensor& x, MemoryFormat format);  // channels-last: Note [Memory formats]
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, DType dtype, MemoryFormat format);  // and stored in `format`
Tensor to(const Tensor& x, Device device);

}  // namespace loom
