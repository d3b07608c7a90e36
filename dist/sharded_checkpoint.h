// dist/sharded_checkpoint.h — checkpoints of the sharded stages: each rank writes its own
// pieces of the parameters and of the optimizer state, and a checkpoint written by N ranks
// loads on any number of ranks (resharding), as PyTorch's distributed checkpoint does.
//
// Note [Sharded checkpoints]
// A checkpoint is a folder:
//   shard-<r>-of-<N>.safetensors, one per rank, atomic: tensors param.<k> (piece k's values)
//       and the optimizer's save_state under "optimizer." (its state per piece, Note [Optimizer
//       state in checkpoints]); metadata piece.<k> = "<parameter name> <first element> <count>"
//       (elements in the parameter's memory order), the rank, the world size and the caller's
//       metadata (steps, epochs);
//   index.json, written by rank 0 once every shard is on disk (a barrier): the world size, the
//       shard files and every parameter's name, shape and dtype. A folder without it is an
//       interrupted save and does not load.
// Loading on M ranks: each rank reads the index and checks the model against it (same names,
// shapes and dtypes: ValueError naming the first that differs), then every shard file (IOError
// naming one that is missing), assembles each parameter and each of its optimizer buffers
// whole from the pieces that cover it (every element exactly once, or ValueError), and takes
// its own new pieces of them. The optimizer's options come from the file (as load_state);
// its per-parameter decay flags are checked against the optimizer's own.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dist/fsdp.h"
#include "dist/zero.h"
#include "optim/checkpoint.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace loom::dist {

// What a sharded strategy hands a checkpoint: the group, the parameters (names and shapes),
// this rank's pieces, their tensors and the optimizer over them.
struct ShardedState {
  ProcessGroup* group = nullptr;
  const std::vector<std::string>* names = nullptr;
  const std::vector<Tensor>* params = nullptr;
  const std::vector<ShardPiece>* pieces = nullptr;
  std::vector<Tensor> piece_tensors;
  optim::Optimizer* optimizer = nullptr;
  bool params_replicated = false;  // ZeRO-1/2: every rank holds every parameter whole
};
ShardedState sharded_state(ZeroRedundancyOptimizer& zero);
ShardedState sharded_state(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer);

// Every rank calls it (collective: a barrier before rank 0 writes the index). The folder is
// made if needed. `metadata` goes into every shard file.
void save_sharded_checkpoint(const std::string& dir, const ShardedState& state,
                             const std::map<std::string, std::string>& metadata = {});
// Every rank calls it; returns shard 0's caller metadata. Refuses (before changing anything) a
// folder without index.json, a missing or foreign shard, another model.
std::map<std::string, std::string> load_sharded_checkpoint(const std::string& dir,
                                                           const ShardedState& state);

// Training checkpoints in that form, what save_checkpoint's one file holds beside the model and
// optimizer (Note [Checkpoint layout]) carried in every shard's metadata: the progress
// (loom.epoch, loom.step, loom.batch), the default generator, the schedule's and the scaler's
// scalars, and `info`; loom.checkpoint = "sharded". Every rank calls them. The load restores
// what the pointers designate (each may be null) and returns the progress; a checkpoint saved
// without a scaler refuses one, as load_checkpoint does.
void save_sharded_training_checkpoint(const std::string& dir, const ShardedState& state,
                                      const optim::LRSchedule* schedule,
                                      const optim::TrainingProgress& progress,
                                      const optim::Metadata& info = {},
                                      const optim::GradScaler* scaler = nullptr);
optim::TrainingProgress load_sharded_training_checkpoint(const std::string& dir,
                                                         const ShardedState& state,
                                                         optim::LRSchedule* schedule,
                                                         bool restore_generator = true,
                                                         optim::GradScaler* scaler = nullptr);
// The caller's metadata of a sharded checkpoint folder (shard 0's), read without its tensors'
// values checked against a model: to rebuild the model it describes before loading. IOError for
// a folder that is not a complete sharded checkpoint.
std::map<std::string, std::string> read_sharded_checkpoint_metadata(const std::string& dir);
// Whether `path` is a folder holding a sharded checkpoint's index.
bool is_sharded_checkpoint(const std::string& path);

}  // namespace loom::dist
