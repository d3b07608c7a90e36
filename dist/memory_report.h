// dist/memory_report.h — where a rank's device memory went after a training step, from loom's own
// count of the bytes its tensors hold and of the allocator's cache (memory_stats in
// tensor/storage.h), split into the model's fixed cost and what the step held at its peak.
//
// Note [The memory report]
// --print-memory prints, after the first training step the optimizer takes (with --amp fp16 a
// step skipped for an overflow does not count), where this rank's device memory went:
//   weights           the parameters;
//   gradients         their .grad tensors: under DDP the bucket buffers, which hold them;
//   optimizer state   the optimizer's buffers (SGD's momentum: as large as the weights);
//   buffers           the modules' buffers (batch norm's running statistics);
//   other held        whatever else outlives the step: the batch and the running totals, and
//                     on the CPU the dataset (CIFAR-10 and Fashion-MNIST are held as tensors)
//                     and the batches the loader has ready;
//   step peak         the most the step held at once, beyond what outlives it: the activations
//                     autograd saved for backward, and the temporaries alive with them. It
//                     grows with the batch; the lines above do not;
//   cached            freed blocks the allocator keeps for reuse (on a GPU the caching
//                     allocator's, which nvidia-smi counts as used; on the CPU large blocks).
// The first four are the model's fixed cost (with momentum SGD, three times the weights; with
// Adam, four); mixed precision shrinks the activations, not them.
#pragma once

#include <optional>
#include <string>

#include "dist/ddp.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/storage.h"

namespace loom::dist {

// The report as text, from `stats` taken after the step (its peak reset before it); `ddp` is
// null without data parallelism.
std::string memory_report(const nn::Module& model, const optim::Optimizer& optimizer,
                          DistributedDataParallel* ddp, Device device, const MemoryStats& stats);

// The report of the first step the optimizer took: before_step resets the device's peak while
// a report is still due; after_step gives the report once, for the first step that stepped.
class FirstStepMemoryReport {
 public:
  explicit FirstStepMemoryReport(bool enabled) : due_(enabled) {}
  void before_step(Device device) const;
  std::optional<std::string> after_step(bool stepped, const nn::Module& model,
                                        const optim::Optimizer& optimizer,
                                        DistributedDataParallel* ddp, Device device);

 private:
  bool due_;
};

}  // namespace loom::dist
