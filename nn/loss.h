// nn/loss.h — loss modules over the differentiable loss ops: CrossEntropyLoss (label smoothing,
// ignore_index) and MSELoss. They take (input, target), so they are called with forward(a, b)
// or operator()(a, b) rather than through Sequential.
#pragma once

#include "autograd/ops/loss.h"
#include "nn/module.h"

namespace loom::nn {

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {});
  // logits [N, C] (or [N, C, d...]), target int64 class indices [N] (or [N, d...]).
  Tensor forward(const Tensor& logits, const Tensor& target);
  Tensor operator()(const Tensor& logits, const Tensor& target) { return forward(logits, target); }
  std::string extra_repr() const override;
  const CrossEntropyOptions options;
};

class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean)
      : Module("MSELoss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  const Reduction reduction;
};

}  // namespace loom::nn
