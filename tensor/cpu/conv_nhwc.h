// tensor/cpu/conv_nhwc.h — conv2d on channels-last tensors without converting them to NCHW
// (Note [conv2d in channels-last], tensor/cpu/conv_nhwc.cpp). tensor/cpu/conv.cpp calls these
// for the layers they fit.
#pragma once

#include <array>

#include "tensor/conv.h"

namespace loom::cpu {

// Whether conv2d_nhwc computes this layer: x channels-last (suggest_memory_format), float32 or
// float64, one group, and the packed kernels of Note [CPU instruction sets] in use.
bool conv2d_nhwc_fits(const Tensor& x, const Tensor& weight, const kernels::Conv2dOptions& options);

// out = conv2d(x, weight, bias), out channels-last of conv2d_output_shape's shape. The weight is
// read through its strides, in either format. Assumes checked operands of one dtype that
// conv2d_nhwc_fits.
void conv2d_nhwc(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const kernels::Conv2dOptions& options, const Tensor& out);

// Writes the gradients that grads holds (defined): dx channels-last, dweight in any layout (written
// through its strides), dbias. dout in any format (made channels-last first); a batch with
// elements. Assumes checked operands that conv2d_nhwc_fits.
void conv2d_nhwc_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const kernels::Conv2dOptions& options, const kernels::Conv2dGrads& grads);

}  // namespace loom::cpu
