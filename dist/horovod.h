// dist/horovod.h — data parallelism the way Horovod does it: no wrapper around the model, a
// wrapper around the optimizer. DistributedOptimizer averages the gradients across ranks inside
// step(), after backward, in fusion buffers (Horovod's tensor fusion); broadcast_parameters and
// broadcast_optimizer_state start every rank from rank 0's state.
//
// Note [Horovod-style averaging]
// step(), per rank:
//   1. every parameter of the optimizer, in order, gets a gradient (a zero one where backward
//      left none, as Horovod's synchronize() does, so that all ranks send the same tensors);
//   2. the gradients are copied into fusion buffers of at most fusion_bytes each (one dtype a
//      buffer; a gradient larger than the threshold travels alone), and each buffer's
//      allreduce starts as soon as it is packed, while the next is being packed;
//   3. each buffer is divided by the world size (Horovod's default op, Average) and copied back
//      into the gradients; then the wrapped optimizer steps.
// Horovod's defaults: a 128 MiB threshold (HOROVOD_FUSION_THRESHOLD, 64 MiB before v0.21), 0
// turning fusion off (a buffer per gradient). The bytes are DDP's, 2 (N-1)/N per gradient byte
// (Note [Bytes moved]); the difference is when they move. DDP starts each bucket's allreduce
// while backward is still computing earlier layers; here nothing moves until backward has
// ended, so the whole allreduce adds to the step (Horovod proper overlaps too, from its
// gradient hooks and a background thread; loom keeps this the after-backward form, the
// baseline that DDP's overlap is measured against). The fusion copies cost two passes over the
// gradients, which DDP's buckets avoid by being the gradients' own memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "optim/optimizer.h"

namespace loom::dist {

struct DistributedOptimizerOptions {
  int64_t fusion_bytes = int64_t{128} << 20;  // 0: no fusion
};

// What the last step's averaging did, for reports.
struct FusionReport {
  int64_t buffers = 0;  // allreduces
  int64_t bytes = 0;    // gradient bytes averaged
  double seconds = 0;   // from the first copy in to the last copy out
};

class DistributedOptimizer : public optim::Optimizer {
 public:
  // Wraps `inner`, whose parameters every rank must give alike (the same count, shapes, dtypes
  // and order: verify_replicas checks them here). ValueError for a null optimizer or group, a
  // negative fusion_bytes.
  DistributedOptimizer(std::unique_ptr<optim::Optimizer> inner, std::shared_ptr<ProcessGroup> group,
                       DistributedOptimizerOptions options = {});

  // Steps 1 to 3 of Note [Horovod-style averaging] (Horovod's optimizer.synchronize()). Call it
  // before anything that must read the averaged gradients, clipping or unscaling above all
  // (clipping each rank's own gradients and then averaging is another step); Horovod then
  // needs step() inside skip_synchronize(), here step() knows they were averaged.
  void synchronize();
  // synchronize() unless it was called since the last step, then the wrapped optimizer's step
  // at this optimizer's lr.
  void step() override;
  void zero_grad(bool set_to_none = true) override { inner_->zero_grad(set_to_none); }

  optim::Optimizer& inner() { return *inner_; }
  ProcessGroup& group() { return *group_; }
  const FusionReport& last_report() const { return report_; }
  double momentum() const override { return inner_->momentum(); }
  void set_momentum(double momentum) override { inner_->set_momentum(momentum); }
  int64_t state_bytes() const override { return inner_->state_bytes(); }
  // The wrapped optimizer's state, under its own name: a checkpoint loads into it alone too.
  void save_state(NamedTensors& tensors, optim::Metadata& meta,
                  const std::string& prefix) const override {
    inner_->save_state(tensors, meta, prefix);
  }
  void load_state(const SafetensorsFile& file, const std::string& prefix) override {
    inner_->load_state(file, prefix);
  }

 protected:
  std::vector<std::string> buffer_names() const override { return {}; }
  optim::Metadata hyper_parameters() const override { return {}; }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  std::shared_ptr<ProcessGroup> group_;
  DistributedOptimizerOptions options_;
  FusionReport report_;
  bool synchronized_ = false;  // since the last step
};

// Horovod's hvd.broadcast_parameters(model.state_dict(), root_rank=0): every tensor of `state`
// (a model's parameters and buffers) takes rank `root`'s values, in place. The ranks' states
// must be alike (verify_replicas checks them first).
void broadcast_parameters(ProcessGroup& group, const NamedTensors& state, int root = 0);

// Horovod's hvd.broadcast_optimizer_state: the optimizer's hyper-parameters, lr and per-parameter
// state (momentum buffers, Adam's moments and steps) become rank `root`'s, so that a run that
// resumed from a checkpoint on rank 0 alone goes on alike everywhere. Goes through the
// optimizer's checkpoint form (Note [Optimizer state in checkpoints]): one broadcast of its
// bytes.
void broadcast_optimizer_state(ProcessGroup& group, optim::Optimizer& optimizer, int root = 0);

}  // namespace loom::dist
