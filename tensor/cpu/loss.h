// tensor/cpu/loss.h — the CPU loops of softmax and the losses (tensor/loss.h, whose front in
// tensor/loss.cpp checks the arguments, the target values included, and calls these for CPU
// tensors). Each takes float32 or float64 values (DTypeError, from the dtype dispatch, otherwise).
#pragma once

#include "tensor/loss.h"

namespace loom::cpu {

// softmax / log_softmax of x along the lines of `l` (dim_layout of x); a fresh contiguous result.
Tensor softmax(const Tensor& x, const kernels::DimLayout& l);
Tensor log_softmax(const Tensor& x, const kernels::DimLayout& l);
// Their backwards along the lines `l` of y; dy of y's shape (any dtype, read as y's).
Tensor softmax_backward(const Tensor& dy, const Tensor& y, const kernels::DimLayout& l);
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, const kernels::DimLayout& l);

// Cross entropy's loss and lse; the target's shapes and values checked, `count` the positions it
// does not ignore.
kernels::CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                                   Reduction reduction, int64_t ignore_index,
                                                   double label_smoothing, int64_t count);
// dlogits; dloss, lse, target and count of the sizes the front checked.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count);

// nll's loss and total weight; the target's shapes and values and the weight's shape checked.
kernels::NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target,
                                         const Tensor& weight, Reduction reduction,
                                         int64_t ignore_index);
// dlog_probs of input_shape; dloss, target and weight of the sizes the front checked, every
// target value in range or ignore_index (as its forward checked).
Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight);

// (input - target)^2, reduced; input and target of one shape and dtype.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction);
// dinput; input and target of one size (target read as input's dtype), dloss checked.
Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction);

}  // namespace loom::cpu
