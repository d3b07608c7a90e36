// nn/loss.cpp — the loss modules of nn/loss.h.

#include "nn/loss.h"

namespace loom::nn {

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyOptions opt)
    : Module("CrossEntropyLoss"), options(opt) {
  LOOM_CHECK(opt.label_smoothing >= 0 && opt.label_smoothing <= 1, ValueError,
             "CrossEntropyLoss: label_smoothing must be in [0, 1]; got ", opt.label_smoothing);
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  return cross_entropy(logits, target, options.reduction, options.ignore_index,
                       options.label_smoothing);
}

std::string CrossEntropyLoss::extra_repr() const {
  return options.label_smoothing == 0 ? ""
                                      : detail::str("label_smoothing=", options.label_smoothing);
}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return mse_loss(input, target, reduction);
}

}  // namespace loom::nn
