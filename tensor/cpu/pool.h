// tensor/cpu/pool.h — the CPU loops of the pools (tensor/conv.h, whose front tensor/pool.cpp
// checks the arguments, computes the geometry and calls these for CPU tensors).
#pragma once

#include <utility>

#include "tensor/conv.h"

namespace loom::cpu {

// Each takes checked CPU tensors; the forwards allocate their results in suggest_memory_format(x)
// and the backwards dx in `format` (Note [Pooling channels-last on the CPU]). dispatch_floating
// refuses dtypes other than float32 and float64.

// (values, int64 indices within each H*W plane) of max pooling x over the windows of g.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const kernels::Pool2dGeometry& g);
// dx [x_shape]: each dout element added at its indices' position (indices of dout's shape).
Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format);

// The average of each window of g, divided as count_include_pad says.
Tensor avg_pool2d(const Tensor& x, const kernels::Pool2dGeometry& g, bool count_include_pad);
// dx [x_shape]: each dout element shared out over its window of g (dout of g's output size).
Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape,
                           const kernels::Pool2dGeometry& g, bool count_include_pad,
                           MemoryFormat format);

// The average of each adaptive window (x 4-D with a non-empty plane, output_size >= 1).
Tensor adaptive_avg_pool2d(const Tensor& x, kernels::Pair output_size);
// dx [x_shape]: each dout element shared out over its adaptive window.
Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, MemoryFormat format);

}  // namespace loom::cpu
