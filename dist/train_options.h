// dist/train_options.h — the training options every training program shares (resnet18_cifar,
// gpt_train): the optimizer and its hyper-parameters, gradient accumulation, gradient clipping,
// the step limit and the device's memory cap; and the optimizer they describe. The command line
// that sets them is the apps' (apps/common/train_flags.h, CLI11): the library holds no parser.
//
// Note [Gradient accumulation]
// With accumulate = N one optimizer step takes N micro-batches of --batch-size each: the loss of
// each is divided by N and backpropagated, so the gradients add up to those of the mean loss over
// the N x batch images (without batch statistics in the model, e.g. with frozen batch norm, the
// step equals one on the large batch up to rounding). Under DDP the micro-batches before the
// last run inside no_sync(): their gradients stay local and the last backward averages the sum
// once. Schedules, --max-steps and the step counts in checkpoints count optimizer steps; the
// last step of an epoch may take fewer micro-batches (the loss is then divided by how many).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/device.h"

namespace loom::dist {

struct TrainOptions {
  std::string optimizer = "sgd";  // sgd | adam | adamw
  double lr = 0.1;
  double momentum = 0.9;              // SGD's (Adam's is beta1)
  bool nesterov = false;              // SGD
  double beta1 = 0.9, beta2 = 0.999;  // Adam, AdamW
  double weight_decay = 0;            // SGD and Adam: L2 on the gradient; AdamW: decoupled
  int64_t accumulate = 1;             // micro-batches per optimizer step (Note above)
  double grad_clip = 0;               // the gradients' total 2-norm is clipped to this; 0: off
  int64_t max_steps = -1;             // stop after this many optimizer steps in all (-1: none)
  int64_t max_memory = 0;  // bytes each rank's device may hold (0: LOOM_MAX_MEMORY's cap, if any)
};

// Caps `device` (the job's, in each rank) at o.max_memory where it is set, as set_memory_limit
// does under the name --max-memory (Note [Device memory cap] in tensor/memory_limit.h); leaves
// LOOM_MAX_MEMORY's cap otherwise.
void apply_max_memory(const TrainOptions& o, Device device);

// The optimizer `o` names over `params`, at learning rate `lr` (the options' lr, possibly
// scaled); `decay` says which parameters weight decay applies to (AdamOptions::decay; empty:
// every one). ValueError for an unknown name or bad hyper-parameters.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> params,
                                                 double lr, std::vector<bool> decay = {});

// "SGD lr 0.2 momentum 0.9 (nesterov) weight decay 0.0005", "AdamW lr 0.001 betas (0.9, 0.999)
// weight decay 0.01"; with ", gradients clipped to norm C" when clipping.
std::string describe_optimizer(const TrainOptions& o, double lr);

// Optimizer steps in an epoch of `batches` micro-batches: ceil(batches / accumulate).
int64_t optimizer_steps(int64_t batches, int64_t accumulate);

}  // namespace loom::dist
