// dist/train_options.cpp — make_optimizer, describe_optimizer and the device's memory cap.

#include "dist/train_options.h"

#include <cstdio>

#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace loom::dist {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> params,
                                                 double lr, std::vector<bool> decay) {
  LOOM_CHECK(decay.empty() || o.optimizer != "sgd", ValueError,
             "make_optimizer: sgd applies weight decay to every parameter; a decay grouping is "
             "for adam and adamw");
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(std::move(params),
                                        optim::SGDOptions{.lr = lr,
                                                          .momentum = o.momentum,
                                                          .weight_decay = o.weight_decay,
                                                          .nesterov = o.nesterov});
  if (o.optimizer == "adam")
    return std::make_unique<optim::Adam>(std::move(params),
                                         optim::AdamOptions{.lr = lr,
                                                            .beta1 = o.beta1,
                                                            .beta2 = o.beta2,
                                                            .weight_decay = o.weight_decay,
                                                            .decay = std::move(decay)});
  LOOM_CHECK(o.optimizer == "adamw", ValueError, "unknown optimizer '", o.optimizer,
             "' (sgd, adam or adamw)");
  return std::make_unique<optim::AdamW>(std::move(params),
                                        optim::AdamWOptions{.lr = lr,
                                                            .beta1 = o.beta1,
                                                            .beta2 = o.beta2,
                                                            .weight_decay = o.weight_decay,
                                                            .decay = std::move(decay)});
}

std::string describe_optimizer(const TrainOptions& o, double lr) {
  char buf[256];
  if (o.optimizer == "sgd")
    std::snprintf(buf, sizeof buf, "SGD lr %g momentum %g%s weight decay %g", lr, o.momentum,
                  o.nesterov ? " (nesterov)" : "", o.weight_decay);
  else
    std::snprintf(buf, sizeof buf, "%s lr %g betas (%g, %g) weight decay %g",
                  o.optimizer == "adam" ? "Adam" : "AdamW", lr, o.beta1, o.beta2, o.weight_decay);
  std::string out = buf;
  if (o.grad_clip > 0) {
    std::snprintf(buf, sizeof buf, ", gradients clipped to norm %g", o.grad_clip);
    out += buf;
  }
  return out;
}

int64_t optimizer_steps(int64_t batches, int64_t accumulate) {
  LOOM_CHECK(accumulate >= 1, ValueError, "accumulate must be at least 1; got ", accumulate);
  return (batches + accumulate - 1) / accumulate;
}

void apply_max_memory(const TrainOptions& o, Device device) {
  LOOM_CHECK(o.max_memory >= 0, ValueError, "--max-memory: the cap cannot be negative; got ",
             o.max_memory, " bytes");
  if (o.max_memory > 0) set_memory_limit(device, o.max_memory, "--max-memory");
}

}  // namespace loom::dist
