// tensor/cuda/loss.h — the CUDA softmax family and losses behind tensor/loss.h: same names,
// signatures and results as the loom::kernels ones (the front, tensor/loss.cpp, checks the
// arguments, then switches here for CUDA tensors). Host-only header; kernels in tensor/cuda/loss.cu.
#pragma once

#include "tensor/loss.h"
#include "tensor/tensor.h"

namespace loom::cuda {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim);
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim);

// The value check of kernels::check_class_target (which has checked the shapes and dtype): reads
// the targets on the device and copies back two numbers (the count and the first bad position),
// so it waits for the stream: the range check and the count need the host.
int64_t check_class_target(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index);

// cross_entropy_forward keeps its count on the device and defers its range check (Note
// [Deferred device checks]): it does not wait for the stream. nll_loss_forward returns a host
// number (total_weight) and waits once.
kernels::CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                                   Reduction reduction, int64_t ignore_index,
                                                   double label_smoothing);
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count);

kernels::NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target,
                                         const Tensor& weight, Reduction reduction,
                                         int64_t ignore_index);
Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight);

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction);
Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction);

}  // namespace loom::cuda
