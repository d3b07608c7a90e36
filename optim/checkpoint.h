// optim/checkpoint.h — training checkpoints: one safetensors file holding the model's state dict
// (under its own PyTorch key names, so the weights load in PyTorch as they are), the optimizer
// and schedule state, the random generator, the epoch and step, and metadata describing the
// model for readers that are not loom's app.
//
// Note [Checkpoint layout]
//   tensors   <model keys>                  "conv1.weight", "bn1.running_mean", ...
//             optimizer.state.<i>.<buffer>  (Note [Optimizer state in checkpoints])
//   metadata  format = "pt"; loom.checkpoint = "1"
//             loom.epoch                    epochs completed
//             loom.step                     optimizer steps taken in all
//             loom.batch                    batches of loom.epoch already trained (0 at the end
//                                           of an epoch; a run cut short resumes mid-epoch)
//             generator.seed, generator.offset   the default generator (dropout, init)
//             optimizer.*, schedule.*       their scalars
//             scaler.*                      the GradScaler, when one is passed (Note [Dynamic
//                                           loss scaling]): scaler.scale, .growth_tracker,
//                                           .growth_factor, .backoff_factor, .growth_interval,
//                                           .enabled; metadata only, no tensors
//             anything in `info`: model, width, in_channels, num_classes, mean, std, ...
// PyTorch reads the weights with the optimizer keys filtered out:
//   {k: v for k, v in load_file(path).items() if not k.startswith("optimizer.")}
// Writes are atomic (save_safetensors): a crash during a save leaves the previous file whole.
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace loom::optim {

struct TrainingProgress {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken
  int64_t batch = 0;  // batches of the current epoch already trained
};

// Writes the checkpoint (schedule and scaler may be null); `info` goes into the metadata as is.
void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer& optimizer,
                     const LRSchedule* schedule, const TrainingProgress& progress,
                     const Metadata& info = {}, const GradScaler* scaler = nullptr);

// Restores what the pointers designate (any may be null; the model is always loaded, strictly)
// and returns the progress. IOError for an unreadable or malformed file, ValueError (naming the
// key) for a checkpoint that does not fit the model, optimizer, schedule or scaler (a checkpoint
// saved without a scaler has no scaler.* keys: loading one into a scaler is refused). The
// progress, the generator's and the scaler's states are read and checked before anything else is
// loaded; the scaler is set last.
TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 Optimizer* optimizer = nullptr, LRSchedule* schedule = nullptr,
                                 bool restore_generator = true, GradScaler* scaler = nullptr);

// The metadata of a checkpoint (e.g. to rebuild the model it describes before loading).
Metadata read_checkpoint_metadata(const std::string& path);
// The integer a checkpoint's metadata holds under `key`, all of it; ValueError naming `path`
// when the key is missing or its value is not a whole integer.
int64_t checkpoint_int(const Metadata& meta, const std::string& key, const std::string& path);

}  // namespace loom::optim
