// tensor/cuda/conv.h — the CUDA side of tensor/conv.h's conv2d and its backward, through cuDNN
// (tensor/cuda/conv.cu, Note [conv2d on cuDNN]), with the names and semantics of the
// loom::kernels ones, which check the arguments and then switch here. Host-only. float32,
// float64, float16 and bfloat16 (the 16-bit types accumulate in float32). Pooling is
// tensor/cuda/pool.h.
#pragma once

#include <array>

#include "tensor/conv.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// x [N,C,H,W], weight [O,C/groups,kh,kw], bias [O] or undefined -> [N,O,Ho,Wo]. The output has
// x's memory format: NHWC strides (a permuted view) when x is channels-last, else contiguous.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dOptions& options);

// The gradients asked for by needs = {dx, dweight, dbias}; the others stay undefined. dx has
// x's memory format, dweight the weight's; dbias is contiguous. Deterministic where cuDNN has a
// deterministic algorithm for the shape (Note [conv2d on cuDNN]).
kernels::Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const kernels::Conv2dOptions& options,
                                     std::array<bool, 3> needs);

}  // namespace loom::cuda
