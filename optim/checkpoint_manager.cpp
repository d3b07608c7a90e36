// optim/checkpoint_manager.cpp — CheckpointManager (Note [Resuming at another world size]).

#include "optim/checkpoint_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "tensor/atomic_file.h"
#include "tensor/error.h"

namespace loom::optim {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLast = "last.safetensors";

std::string epoch_name(int64_t epoch) {
  char name[48];
  std::snprintf(name, sizeof name, "epoch-%03lld.safetensors", static_cast<long long>(epoch));
  return name;
}

// The world size a checkpoint names ("world_size"), or `otherwise` when it names none; a value
// that is not a positive integer is refused, as load_checkpoint refuses its other integers.
int64_t saved_world_size(const Metadata& meta, int64_t otherwise, const std::string& path) {
  if (!meta.count("world_size")) return otherwise;
  const int64_t world = checkpoint_int(meta, "world_size", path);
  LOOM_CHECK(world >= 1, ValueError, "resume: ", path, ": metadata 'world_size' must be >= 1; got ",
             world);
  return world;
}

}  // namespace

CheckpointManager::CheckpointManager(CheckpointManagerOptions options, const nn::Module& model,
                                     const Optimizer& optimizer, const LRSchedule* schedule,
                                     const GradScaler* scaler, Metadata info)
    : options_(std::move(options)),
      model_(model),
      optimizer_(optimizer),
      schedule_(schedule),
      scaler_(scaler),
      info_(std::move(info)) {
  LOOM_CHECK(options_.keep_last >= 0 && options_.world_size >= 1, ValueError,
             "CheckpointManager: expected keep_last >= 0 and world_size >= 1; got keep_last=",
             options_.keep_last, " world_size=", options_.world_size);
  info_["world_size"] = std::to_string(options_.world_size);
}

std::string CheckpointManager::last_path() const {
  return options_.dir.empty() ? std::string() : (fs::path(options_.dir) / kLast).string();
}

std::string CheckpointManager::resume_path(const std::string& requested) const {
  if (!requested.empty()) return requested;
  const char* restarts = std::getenv("LOOM_RESTART_COUNT");
  const std::string last = last_path();
  if (restarts && std::atoi(restarts) > 0 && !last.empty() && fs::exists(last)) return last;
  return {};
}

Resumed CheckpointManager::resume(const std::string& requested, nn::Module& model,
                                  Optimizer* optimizer, LRSchedule* schedule, GradScaler* scaler,
                                  bool model_only) const {
  Resumed r;
  r.path = resume_path(requested);
  if (r.path.empty()) return r;
  const Metadata meta = read_checkpoint_metadata(r.path);
  r.saved_world_size = static_cast<int>(saved_world_size(meta, options_.world_size, r.path));
  // A run that switches to --amp fp16 from a checkpoint without a loss scale starts a new one.
  GradScaler* resumed_scaler = scaler && meta.count("scaler.scale") ? scaler : nullptr;
  r.scaler_restored = resumed_scaler != nullptr;
  r.progress = model_only ? load_checkpoint(r.path, model)
                          : load_checkpoint(r.path, model, optimizer, schedule,
                                            /*restore_generator=*/true, resumed_scaler);
  const int64_t was = r.saved_world_size, now = options_.world_size;
  if (was != now && r.progress.batch > 0) {
    // Note [Resuming at another world size].
    LOOM_CHECK(r.progress.batch * was % now == 0, ValueError, "resume: ", r.path,
               " was written by ", was, " ranks after ", r.progress.batch, " batches of epoch ",
               r.progress.epoch + 1, ", which ", now, " ranks cannot continue exactly (",
               r.progress.batch, " x ", was, " is not a multiple of ", now,
               "); resume from an epoch's checkpoint, or with the world size it was written at");
    r.progress.batch = r.progress.batch * was / now;
  }
  return r;
}

void CheckpointManager::save(const std::string& name, const TrainingProgress& progress) {
  current_ = true;
  if (options_.dir.empty() || !options_.writer) return;
  fs::create_directories(options_.dir);
  const std::string path = (fs::path(options_.dir) / name).string();
  save_checkpoint(path, model_, optimizer_, schedule_, progress, info_, scaler_);
  const std::string last = last_path();
  if (path != last) link_atomically(path, last, "checkpoint");
}

void CheckpointManager::save_epoch(const TrainingProgress& progress) {
  save(epoch_name(progress.epoch), progress);
  if (options_.keep_last > 0 && options_.writer && !options_.dir.empty()) remove_old_epochs();
}

void CheckpointManager::save_last(const TrainingProgress& progress) {
  if (!current_) save(kLast, progress);
}

void CheckpointManager::remove_old_epochs() const {
  std::vector<fs::path> epochs;
  for (const auto& entry : fs::directory_iterator(options_.dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("epoch-", 0) == 0 && entry.path().extension() == ".safetensors")
      epochs.push_back(entry.path());
  }
  // epoch-NNN in epoch order: shorter names first (epoch-1000 after epoch-999), then by name.
  std::sort(epochs.begin(), epochs.end(), [](const fs::path& a, const fs::path& b) {
    const std::string x = a.filename().string(), y = b.filename().string();
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  const auto keep = static_cast<size_t>(options_.keep_last);
  // last.safetensors is a hard link (or a copy) of the newest: removing older names keeps it.
  for (size_t i = 0; i + keep < epochs.size(); ++i) fs::remove(epochs[i]);
}

}  // namespace loom::optim
