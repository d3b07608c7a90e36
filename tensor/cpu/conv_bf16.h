// tensor/cpu/conv_bf16.h — conv2d of bfloat16 tensors on the CPU's bfloat16 products (AMX tiles
// or vdpbf16ps, through cpu::gemm_bf16) instead of widening them to float32 (Note [bf16
// convolutions] in tensor/cpu/conv_bf16.cpp). tensor/conv.cpp calls these for the layers they fit.
#pragma once

#include <array>

#include "tensor/conv.h"

namespace loom::cpu {

// Whether conv2d_bf16 computes this layer: bfloat16 operands, one group, and bfloat16 products
// in use for matrix products (cpu::multiplies_16bit: the CPU has them and LOOM_BF16_DOT allows).
bool conv2d_bf16_fits(const Tensor& x, const kernels::Conv2dOptions& options);

// Whether conv2d_bf16's forward and weight gradient (and dx, where it is a convolution) of these
// operands take the batch into the vector lanes (Note [bf16 batch lanes] in
// tensor/cpu/conv_bf16.cpp): outputs of at most 256 pixels on the vdpbf16ps kernel, with taps
// in the padding to skip.
bool conv2d_bf16_batch_lanes(const Tensor& x, const Tensor& weight,
                             const kernels::Conv2dOptions& options);

// Whether conv2d_bf16's forward (and dx, where it is a convolution) of these operands reads its
// B panels where they lie in the paired image (Note [bf16 row panels] in
// tensor/cpu/conv_bf16.cpp): stride 1, a "same" output whose width is a multiple of 32, at least
// 16 input channels, on the vdpbf16ps kernel, where the batch lanes are not taken.
bool conv2d_bf16_row_panels(const Tensor& x, const Tensor& weight,
                            const kernels::Conv2dOptions& options);

// conv2d(x, weight, bias) of checked bfloat16 operands that conv2d_bf16_fits, out_shape from
// conv2d_output_shape: the products summed in float32, the bias added, rounded once to bfloat16
// (the widened path's rule). The result has x's memory format.
Tensor conv2d_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const kernels::Conv2dOptions& options, const Shape& out_shape);

// The gradients `needs` asks for (dx, dweight, dbias), each summed in float32 and rounded once
// to bfloat16; dx in x's format, dweight in the weight's.
kernels::Conv2dGrads conv2d_bf16_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                          const kernels::Conv2dOptions& options,
                                          std::array<bool, 3> needs);

}  // namespace loom::cpu
