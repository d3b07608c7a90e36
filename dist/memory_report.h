// dist/memory_report.h — where a rank's device memory went after a training step, from loom's own
// count of the bytes its tensors hold and of the allocator's cache (memory_stats in
// tensor/storage.h), split into the model's fixed cost and what the step held at its peak, with
// the ZeRO paper's figure for each model state beside what was measured.
//
// Note [The memory report]
// --print-memory prints, after the second training step the optimizer takes (with --amp fp16 a
// step skipped for an overflow does not count), where this rank's device memory went. The
// second: the optimizer makes its state inside its first step, after that step's forward and
// backward, so only from the second on does the peak hold the state and the activations at
// once, as every later step does (and as loomplan's totals count them):
//   weights           the parameters: under ZeRO-3 this rank's shards (the gathered units come
//                     and go within the step, so they count in the step peak);
//   gradients         what holds them between backward and the step: DDP's bucket buffers (and
//                     ZeRO-1's), ZeRO-2's and ZeRO-3's gradient shards;
//   optimizer state   the optimizer's buffers (SGD's momentum: as large as the weights; Adam's
//                     two moments), under ZeRO those of this rank's pieces;
//   buffers           the modules' buffers (batch norm's running statistics);
//   other held        whatever else outlives the step: the batch and the running totals, and
//                     on the CPU the dataset (CIFAR-10 and Fashion-MNIST are held as tensors)
//                     and the batches the loader has ready;
//   step peak         the most the step held at once, beyond what outlives it: the activations
//                     autograd saved for backward, the temporaries alive with them, ZeRO-2's
//                     bucket buffers while they fill and ZeRO-3's gathered units. It grows with
//                     the batch; the lines above do not;
//   cached            freed blocks the allocator keeps for reuse (on a GPU the caching
//                     allocator's, which nvidia-smi counts as used; on the CPU large blocks).
// Beside weights, gradients and optimizer state stands the figure of Note [Model-state
// arithmetic] (dist/memory_plan.h) for the strategy, the parameters and the world size: the
// measured bytes exceed it only by the shards' padding (under N elements a bucket or unit).
#pragma once

#include <optional>
#include <string>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/zero.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/memory_limit.h"
#include "tensor/storage.h"

namespace loom::dist {

// What wraps the model for data parallelism: nothing, DDP, DDP with ZeroRedundancyOptimizer
// (stages 1 and 2), or FullyShardedDataParallel (stage 3).
struct DataParallelism {
  DistributedDataParallel* ddp = nullptr;
  ZeroRedundancyOptimizer* zero = nullptr;
  FullyShardedDataParallel* fsdp = nullptr;
  int stage() const { return fsdp ? 3 : zero ? zero->stage() : 0; }
  int world() const;  // 1 without data parallelism
};

// The model states this rank holds, measured in bytes (Note [The memory report]).
struct ModelStates {
  int64_t weights = 0, gradients = 0, optimizer_state = 0, buffers = 0;
  int64_t parameters = 0;             // Psi: the model's trainable elements
  std::string gradients_where;        // "in 3 DDP buckets", "ZeRO-2 shards", ...
  std::string optimizer_name;         // the optimizer that keeps the state (ZeRO's inner one)
  int bytes_per_weight = 4;           // w of Note [Model-state arithmetic]
  int state_bytes_per_parameter = 0;  // its K for that optimizer (-1: one it does not know)
};
ModelStates measure_model_states(const nn::Module& model, const optim::Optimizer& optimizer,
                                 const DataParallelism& parallel);

// The report as text, from `stats` taken after the step (its peak reset before it).
std::string memory_report(const nn::Module& model, const optim::Optimizer& optimizer,
                          const DataParallelism& parallel, Device device, const MemoryStats& stats);

// The report of the second step the optimizer took (Note [The memory report]): before_step
// resets the device's peak before it; after_step gives the report once, after it.
class StepMemoryReport {
 public:
  explicit StepMemoryReport(bool enabled) : due_(enabled) {}
  void before_step(Device device) const;
  std::optional<std::string> after_step(bool stepped, const nn::Module& model,
                                        const optim::Optimizer& optimizer,
                                        const DataParallelism& parallel, Device device);

 private:
  bool due_;
  int stepped_ = 0;  // steps the optimizer took so far
};

// Note [Out of memory in training]
// A training program registers a TrainingMemoryExplainer once its model, optimizer and
// data-parallel wrappers exist; an OutOfMemoryError on the job's device (Note [Device memory
// cap] in tensor/memory_limit.h) then goes on with three lines:
//   held      loom's tensors on the device by kind, measured as the memory report measures
//             them: weights, gradients, optimizer state, buffers, and other (the activations,
//             the batch, temporaries, on a CPU the data set);
//   needed    what the strategy's model states come to once all of them exist, by Note
//             [Model-state arithmetic] (the optimizer makes its state at its first step, so an
//             error before that finds less held than the step will need), against the cap;
//   advice    from the stage in use. Model states over the cap: shard them, the stages past the
//             one in use with the bytes each would keep on these ranks (DDP -> ZeRO-2 -> ZeRO-3)
//             and the fewest ranks at which ZeRO-3's fit. Model states within it: the rest is
//             activations, which grow with the batch: a smaller --batch-size (--accumulate keeps
//             the step's batch), activation checkpointing (a GPT: --checkpoint-activations),
//             ZeRO-3 to give the activations the model states' room. Then: raise the cap.
// This is the decision tree of Note [Choosing a strategy] (dist/memory_plan.h) told from the
// error's side, without a dry run; loomplan prints the whole plan.
std::string explain_memory_use(const nn::Module& model, const optim::Optimizer& optimizer,
                               const DataParallelism& parallel, Device device);

// Installs explain_memory_use over `model`, `optimizer` and `parallel` as the process's
// out-of-memory explainer for its lifetime (they must outlive it); the one it replaced after.
class TrainingMemoryExplainer {
 public:
  TrainingMemoryExplainer(const nn::Module& model, const optim::Optimizer& optimizer,
                          const DataParallelism& parallel);
  ~TrainingMemoryExplainer();
  TrainingMemoryExplainer(const TrainingMemoryExplainer&) = delete;
  TrainingMemoryExplainer& operator=(const TrainingMemoryExplainer&) = delete;

 private:
  OutOfMemoryExplainer previous_;
};

}  // namespace loom::dist
