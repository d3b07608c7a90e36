// tensor/cpu/conv.h — the CPU loops of conv2d (tensor/conv.h, whose front checks the arguments
// and calls these for CPU tensors).
#pragma once

#include <array>
#include <vector>

#include "tensor/conv.h"

namespace loom::cpu {

// conv2d(x, weight, bias) into a new tensor of out_shape (conv2d_output_shape's), in x's memory
// format. Assumes checked CPU operands of one dtype, never 16-bit (the front widens those).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dOptions& options, const Shape& out_shape);

// The gradients of conv2d that `needs` asks for, dx in x's memory format and dweight in the
// weight's. Assumes checked CPU operands of one dtype (dout of conv2d's output shape), never
// 16-bit (the front widens those).
kernels::Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const kernels::Conv2dOptions& options,
                                     std::array<bool, 3> needs);

// kernels::conv2d_choices and clear_conv2d_choices (tensor/conv.h): the table of
// Note [Choosing convolutions by measurement].
std::vector<kernels::Conv2dChoice> conv2d_choices();
void clear_conv2d_choices();

}  // namespace loom::cpu
