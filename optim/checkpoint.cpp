// optim/checkpoint.cpp — training checkpoints (Note [Checkpoint layout]).

#include "optim/checkpoint.h"

#include <charconv>
#include <optional>
#include <type_traits>
#include <utility>

#include "tensor/random.h"

namespace loom::optim {

namespace {

constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kScalerPrefix = "scaler.";

// The integer (int64_t or uint64_t) a metadata value holds, all of it; ValueError otherwise.
template <typename Int = int64_t>
Int read_int(const Metadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  LOOM_CHECK(it != meta.end(), ValueError, "load_checkpoint: ", path, " has no '", key,
             "' in its metadata: not a loom training checkpoint");
  const std::string& text = it->second;
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOOM_CHECK(error == std::errc() && end == text.data() + text.size(), ValueError,
             "load_checkpoint: ", path, ": metadata '", key, "' is not ",
             std::is_signed_v<Int> ? "an integer" : "a non-negative integer", ": '", text, "'");
  return value;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer& optimizer,
                     const LRSchedule* schedule, const TrainingProgress& progress,
                     const Metadata& info, const GradScaler* scaler) {
  NamedTensors tensors = model.state_dict();
  const Generator::State g = default_generator().state();
  Metadata meta = {{"format", "pt"},
                   {"loom.checkpoint", "1"},
                   {"loom.epoch", std::to_string(progress.epoch)},
                   {"loom.step", std::to_string(progress.step)},
                   {"loom.batch", std::to_string(progress.batch)},
                   {"generator.seed", std::to_string(g.seed)},
                   {"generator.offset", std::to_string(g.offset)}};
  for (const auto& [key, value] : info) meta.emplace(key, value);  // ours win on a clash
  optimizer.save_state(tensors, meta, kOptimizerPrefix);
  if (schedule) schedule->save_state(tensors, meta, "schedule.");
  if (scaler) scaler->save_state(tensors, meta, kScalerPrefix);
  save_safetensors(path, tensors, meta);
}

TrainingProgress load_checkpoint(const std::string& path, nn::Module& model, Optimizer* optimizer,
                                 LRSchedule* schedule, bool restore_generator, GradScaler* scaler) {
  const SafetensorsFile file = load_safetensors(path);
  const Metadata& meta = file.metadata;
  TrainingProgress progress;
  progress.epoch = read_int(meta, "loom.epoch", path);
  progress.step = read_int(meta, "loom.step", path);
  progress.batch = read_int(meta, "loom.batch", path);
  // The generator's and the scaler's states are read first: a checkpoint without them (or with
  // malformed ones) is refused before the model changes.
  Generator::State generator{};
  if (restore_generator)
    generator = {read_int<uint64_t>(meta, "generator.seed", path),
                 read_int<uint64_t>(meta, "generator.offset", path)};
  std::optional<GradScaler> loaded_scaler;
  if (scaler) {
    loaded_scaler.emplace(*scaler);
    loaded_scaler->load_state(file, kScalerPrefix);
  }

  NamedTensors weights;
  for (const auto& [name, t] : file.tensors)
    if (name.rfind(kOptimizerPrefix, 0) != 0) weights.emplace_back(name, t);
  model.load_state_dict(weights);
  if (optimizer) optimizer->load_state(file, kOptimizerPrefix);
  if (schedule) schedule->load_state(file, "schedule.");
  if (restore_generator) default_generator().set_state(generator);
  if (scaler) *scaler = std::move(*loaded_scaler);
  return progress;
}

int64_t checkpoint_int(const Metadata& meta, const std::string& key, const std::string& path) {
  return read_int(meta, key, path);
}

Metadata read_checkpoint_metadata(const std::string& path) {
  return load_safetensors(path).metadata;
}

}  // namespace loom::optim
