// autograd/ops/loss.h — softmax family and classification losses.
#pragma once

#include "tensor/loss.h"  // loom::Reduction
#include "tensor/tensor.h"

namespace loom {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// logits [N,C] (or [N,C,d...]), target int64 class indices [N] (or [N,d...]). Mean reduction
// divides by the number of targets that are not ignore_index, as PyTorch. label_smoothing
// mixes the one-hot target with the uniform distribution.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
// log_probs [N,C] (or [N,C,d...]), target as above; optional class weights [C].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight = Tensor(),
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace loom
