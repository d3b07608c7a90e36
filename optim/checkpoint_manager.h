// optim/checkpoint_manager.h — the checkpoints of a training run (Note [Checkpoint layout]): one
// file per epoch, epoch-NNN.safetensors, and last.safetensors, a second name of the newest (what
// a restarted job resumes from); only the writer (rank 0) writes, every save atomic; the oldest
// epoch files past keep_last are removed. Resuming picks the file (--resume, or last after a
// restart) and restores the state, at another world size where the state allows it.
//
// Note [Resuming at another world size]
// Under DDP every rank holds the same weights, optimizer, schedule and scaler state, so a
// checkpoint written by W1 ranks loads into any number of them. What depends on W is the
// position in the epoch: after b batches of B samples per rank, the job has taken the first
// b * B * W1 positions of the epoch's permutation (dist::DistributedSampler: rank r takes r,
// r + W, ...). W2 ranks continue exactly there when b * W1 is a multiple of W2 (they skip
// b * W1 / W2 of their batches); otherwise the checkpoint is refused, unless it ends an epoch
// (b = 0). The batch size per rank is taken to be the one the checkpoint was written with.
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "optim/checkpoint.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace loom::optim {

struct CheckpointManagerOptions {
  std::string dir;     // empty: no files are written
  bool writer = true;  // false on every rank but 0: saves are no-ops there
  int keep_last = 0;   // epoch files kept, the newest (0: all)
  int world_size = 1;  // written as metadata "world_size"; see Note [Resuming at another ...]
};

// What a resume restored.
struct Resumed {
  std::string path;  // empty: nothing to resume from
  TrainingProgress progress;
  bool scaler_restored = false;  // false when the checkpoint holds no loss scale
  int saved_world_size = 1;
};

class CheckpointManager {
 public:
  // The state a save writes: the model (not its DDP wrapper), the optimizer, and, when not null,
  // the schedule and the loss scaler; `info` goes into the metadata as is.
  CheckpointManager(CheckpointManagerOptions options, const nn::Module& model,
                    const Optimizer& optimizer, const LRSchedule* schedule,
                    const GradScaler* scaler, Metadata info);

  // <dir>/last.safetensors ("" without a dir).
  std::string last_path() const;
  // The file to resume from: `requested` when not empty; else, in a job the launcher restarted
  // (LOOM_RESTART_COUNT > 0, Note [Restarts] in dist/launch.h), last.safetensors when it exists;
  // else "".
  std::string resume_path(const std::string& requested) const;
  // Loads the checkpoint at resume_path(requested), when there is one, into `model` and (unless
  // model_only) the optimizer, schedule and scaler and the generator. A scaler is restored only
  // from a checkpoint that holds one (a run that turns fp16 on starts a new scale). The batch
  // is converted to this world size (Note [Resuming at another world size]): ValueError when
  // it cannot be.
  Resumed resume(const std::string& requested, nn::Module& model, Optimizer* optimizer,
                 LRSchedule* schedule, GradScaler* scaler, bool model_only = false) const;

  // A step changed the state: the newest file is no longer current.
  void changed() { current_ = false; }
  // <dir>/epoch-NNN.safetensors for `progress.epoch`, linked as last, then the epoch files past
  // keep_last removed.
  void save_epoch(const TrainingProgress& progress);
  // last.safetensors, unless the newest save holds the state as it is.
  void save_last(const TrainingProgress& progress);

 private:
  void save(const std::string& name, const TrainingProgress& progress);
  void remove_old_epochs() const;

  CheckpointManagerOptions options_;
  const nn::Module& model_;
  const Optimizer& optimizer_;
  const LRSchedule* schedule_;
  const GradScaler* scaler_;
  Metadata info_;
  bool current_ = false;
};

}  // namespace loom::optim
