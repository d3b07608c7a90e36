// autograd/ops/conv.h — differentiable convolution and pooling over NCHW tensors.
#pragma once

#include <array>

#include "tensor/tensor.h"

namespace loom {

using Pair = std::array<int64_t, 2>;  // (height, width)

// x [N,C,H,W], weight [O, C/groups, kh, kw], bias [O] or undefined -> [N,O,Ho,Wo]
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Pair stride = {1, 1}, Pair padding = {0, 0}, Pair dilation = {1, 1},
              int64_t groups = 1);
// Pads with -inf; stride defaults to the kernel size (pass {0,0}), as PyTorch.
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  Pair dilation = {1, 1}, bool ceil_mode = false);
// count_include_pad as PyTorch's default (true).
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

}  // namespace loom
