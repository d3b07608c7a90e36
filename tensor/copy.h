// tensor/copy.h — kernels that move or convert data without arithmetic: strided copies with
// dtype conversion and broadcasting, fills, contiguous(), dtype and device conversion.
// Not differentiable: autograd/ wraps them.
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

// dst[...] = src broadcast to dst's shape, converted to dst's dtype, across devices. Bumps
// dst's version.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& t);  // t itself when already contiguous
// t itself when it already is in `format` (for kChannelsLast: its suggest_memory_format), else a
// copy stored in it.
Tensor contiguous(const Tensor& t, MemoryFormat format);
Tensor clone(const Tensor& t);  // always a fresh contiguous copy
// t itself when already of that dtype, else a copy in t's suggest_memory_format (so autocast
// keeps a channels-last activation channels-last).
Tensor to_dtype(const Tensor& t, DType dtype);
// t itself when already of that dtype and stored in `format`, else a copy stored in it (autocast
// casts a convolution's weight straight into the layout cuDNN reads, Note [The cast cache]).
Tensor to_dtype(const Tensor& t, DType dtype, MemoryFormat format);
Tensor to_device(const Tensor& t, Device device);  // keeps t's suggest_memory_format
// t in float32 when it is float16 or bfloat16 (exactly: every 16-bit value is a float32 value),
// t itself otherwise (undefined included).
Tensor widened(const Tensor& t);
// a and b hold the same elements in the same order, densely: one can be copied byte for byte
// into the other (both contiguous, or both channels-last; where a shape is dense in both
// orders, C = 1 or H = W = 1, the two orders are the same bytes).
bool same_dense_layout(const Tensor& a, const Tensor& b);
// t's elements fill its storage span with no gap, in row-major or channels-last order: a flat
// loop over numel() elements from data() visits each once (the optimizers' updates, the loss
// scaler's unscale and the gradient norms run so on a channels-last parameter or gradient).
bool is_dense(const Tensor& t);
// t itself when same_dense_layout(t, like), else a copy of t (of like's shape: ShapeError
// otherwise) stored as `like` is (contiguous(t, suggest_memory_format(like))). An optimizer brings
// a gradient to its parameter's layout so.
Tensor dense_like(const Tensor& t, const Tensor& like);

}  // namespace loom::kernels
