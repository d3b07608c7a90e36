// optim/sgd.h — stochastic gradient descent with momentum, dampening, weight decay and Nesterov
// momentum: torch.optim.SGD's algorithm, same numbers step by step.
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

struct SGDOptions {
  double lr;  // required (as in PyTorch 1.13)
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2: added to the gradient, wd * p
  bool nesterov = false;    // needs momentum > 0 and dampening == 0
};

// Per parameter p with gradient g, as torch.optim.SGD:
//   d = g + weight_decay * p
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d    (when momentum != 0)
//   d = nesterov ? d + momentum * buf : buf                                  (when momentum != 0)
//   p = p - lr * d
// State: momentum_buffer (only when momentum != 0).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);

  void step() override;
  void load_state(const SafetensorsFile& file, const std::string& prefix) override;
  SGDOptions options() const;  // .lr is the current lr()
  double momentum() const override { return options_.momentum; }
  void set_momentum(double momentum) override;  // ValueError outside [0, 1]

 protected:
  std::vector<std::string> buffer_names() const override;
  Metadata hyper_parameters() const override;

 private:
  SGDOptions options_;
};

}  // namespace loom::optim
