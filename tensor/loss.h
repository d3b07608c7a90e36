// tensor/loss.h — softmax, log_softmax and the loss kernels (cross entropy fused with its
// log_softmax, nll, mse), forward and backward. Not differentiable: autograd/ops/loss.cpp
// wraps them. tensor/loss.cpp checks the arguments and picks the device; tensor/cpu/loss.cpp
// and tensor/cuda/loss.cu hold the loops and the kernels. Shape legend for the class losses:
// input [N, C, *] seen as [N, C, S], target [N, *] seen as [N, S]; each of the N S positions has
// one target class.
#pragma once

#include "tensor/tensor.h"

namespace loom {

// How a loss turns per-sample values into its result (PyTorch's reduction=).
enum class Reduction { None, Mean, Sum };

}  // namespace loom

namespace loom::kernels {

// x seen as [outer, n, inner] around dim (a 0-d tensor as one element): the lines of n elements,
// inner apart, that the softmax kernels of both devices reduce. IndexError names `op` when dim
// is out of range.
struct DimLayout {
  int64_t outer = 1, n = 1, inner = 1;
};
DimLayout dim_layout(const Tensor& x, int64_t dim, const char* op);

// Along dim, max-subtracted: softmax = exp(x - max) / sum(exp(x - max)).
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// d softmax: dx = y (dy - sum(dy y)), y the softmax output.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim);
// d log_softmax: dx = dy - exp(y) sum(dy), y the log_softmax output.
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim);

// Cross entropy of logits [N, C, *] against class indices target [N, *] (int64 or int32):
// per position, with lse = logsumexp over classes and ls the label smoothing,
//   loss = (1 - ls) (lse - x_target) + ls sum_c (lse - x_c) / C,
// zero where target == ignore_index; Mean divides the sum by `count`, the number of
// positions not ignored (NaN when there are none, as PyTorch).
struct CrossEntropyForward {
  Tensor loss;  // [N, *] for None, 0-d otherwise
  Tensor lse;   // [N, S] float64, logsumexp per position (saved for the backward)
  // [] int64 on the logits' device. On CUDA it is counted there and never read back, and the
  // targets' range check is deferred (Note [Deferred device checks], tensor/cuda/runtime.h),
  // so the forward does not wait for the device.
  Tensor count;
};
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                          Reduction reduction, int64_t ignore_index,
                                          double label_smoothing);
// d cross_entropy: dlogits = g (softmax - (1 - ls) onehot(target) - ls / C), 0 where ignored;
// g = dloss per position (None), dloss (Sum) or dloss / count (Mean).
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count);

// nll of log_probs [N, C, *]: loss = -w[target] log_probs[target] per position (w = 1 without
// weight), zero where ignored; Mean divides by total_weight = sum of w[target] not ignored.
struct NllLossForward {
  Tensor loss;
  double total_weight = 0;
};
NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                                Reduction reduction, int64_t ignore_index);
// d nll_loss: dlog_probs = -g w[target] at the target class, 0 elsewhere.
// dlog_probs has input_shape and dloss's dtype.
Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight);

// A class loss's input [N, C, *] as [N, C, S] (its rank checked by the caller), on both
// devices.
struct ClassLayout {
  int64_t n = 0, c = 0, s = 1;
  int64_t positions() const { return n * s; }
};
ClassLayout class_layout(const Shape& input);

// Checks target against input [N, C, *] for a class loss (shapes, dtype, every value in
// [0, C) or ignore_index) and returns the number of positions not ignored. IndexError,
// ShapeError and DTypeError name `op` and both shapes.
int64_t check_class_target(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index);

// (input - target)^2, reduced; input and target of one shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction);
// d mse: dinput = 2 (input - target) g ; dtarget = -dinput.
Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction);

}  // namespace loom::kernels
