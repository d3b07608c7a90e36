// tensor/cuda/pool.h — the CUDA side of tensor/conv.h's 2-D pooling (tensor/cuda/pool.cu), with
// the names, windows, index convention and results of the loom::kernels ones
// (the front, tensor/pool.cpp, checks the arguments and then switches here). Host-only. Inputs may
// have any strides; results take the input's memory format (suggest_memory_format), dx the
// `format` given, as on the CPU. float32 and float64 as the CPU, plus float16 and bfloat16
// (accumulating in float32).
#pragma once

#include <utility>

#include "tensor/conv.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// (values, int64 indices of each maximum within its H*W input plane; -1 for a window that
// holds no input).
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const kernels::Pool2dOptions& options);
Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format = MemoryFormat::kContiguous);

Tensor avg_pool2d(const Tensor& x, const kernels::Pool2dOptions& options);
Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape,
                           const kernels::Pool2dOptions& options,
                           MemoryFormat format = MemoryFormat::kContiguous);

Tensor adaptive_avg_pool2d(const Tensor& x, kernels::Pair output_size);
Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape,
                                    MemoryFormat format = MemoryFormat::kContiguous);

}  // namespace loom::cuda
