// dist/sharded_checkpoint.cpp — Note [Sharded checkpoints] (sharded_checkpoint.h): each rank's
// shard file, the index, and the load that reassembles every parameter and optimizer buffer
// from the pieces of any number of ranks.
#include "dist/sharded_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/graph.h"
#include "tensor/atomic_file.h"
#include "tensor/copy.h"
#include "tensor/random.h"
#include "tensor/safetensors.h"
#include "tensor/view.h"

namespace loom::dist {

namespace fs = std::filesystem;
namespace k = kernels;

namespace {

constexpr const char* kFormat = "loom-sharded-checkpoint";
constexpr const char* kOptimizer = "optimizer.";  // the optimizer's keys in a shard file
constexpr const char* kUser = "user.";            // the caller's metadata

std::string shard_name(int rank, int world) {
  return detail::str("shard-", rank, "-of-", world, ".safetensors");
}

// A dense parameter's memory as one line of elements (the order pieces count in).
Tensor memory_line(const Tensor& p) { return k::as_strided(p, {p.numel()}, {1}, p.offset()); }

void check_state(const char* op, const ShardedState& s) {
  LOOM_CHECK(s.group && s.names && s.params && s.pieces && s.optimizer, ValueError, op,
             ": the sharded state is incomplete");
  LOOM_CHECK(s.piece_tensors.size() == s.pieces->size(), ValueError, op, ": ",
             s.piece_tensors.size(), " piece tensors for ", s.pieces->size(), " pieces");
}

struct PieceRef {
  std::string name;
  int64_t offset = 0, numel = 0;
};

// The folder's index.json, read and checked for its format (IOError naming `op` and the file).
nlohmann::json read_index(const std::string& dir, const char* op) {
  const std::string path = (fs::path(dir) / "index.json").string();
  std::ifstream in(path);
  LOOM_CHECK(in.good(), IOError, op, ": ", path,
             " does not exist: not a sharded checkpoint, or its save was interrupted");
  nlohmann::json index;
  try {
    in >> index;
  } catch (const std::exception& e) {
    throw IOError(detail::str(op, ": ", path, ": ", e.what()));
  }
  LOOM_CHECK(index.value("format", "") == kFormat && index.contains("world_size"), IOError, op,
             ": ", path, " is not a loom sharded checkpoint's index");
  return index;
}

PieceRef parse_piece(const std::string& text, const std::string& where) {
  std::istringstream in(text);
  PieceRef p;
  LOOM_CHECK(static_cast<bool>(in >> p.name >> p.offset >> p.numel) && p.offset >= 0 && p.numel > 0,
             IOError, "load_sharded_checkpoint: ", where, ": malformed piece '", text, "'");
  return p;
}

}  // namespace

ShardedState sharded_state(ZeroRedundancyOptimizer& zero) {
  Reducer& reducer = zero.reducer();
  return {.group = &reducer.group(),
          .names = &reducer.names(),
          .params = &reducer.params(),
          .pieces = &zero.pieces(),
          .piece_tensors = zero.params(),
          .optimizer = &zero.inner(),
          .params_replicated = true};
}

ShardedState sharded_state(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer) {
  return {.group = &fsdp.group(),
          .names = &fsdp.names(),
          .params = &fsdp.params(),
          .pieces = &fsdp.pieces(),
          .piece_tensors = fsdp.optimizer_params(),
          .optimizer = &optimizer,
          .params_replicated = false};
}

void save_sharded_checkpoint(const std::string& dir, const ShardedState& state,
                             const std::map<std::string, std::string>& metadata) {
  check_state("save_sharded_checkpoint", state);
  ProcessGroup& group = *state.group;
  const int rank = group.rank(), world = group.size();
  std::error_code error;
  fs::create_directories(dir, error);
  LOOM_CHECK(!error, IOError, "save_sharded_checkpoint: cannot make the folder ", dir, ": ",
             error.message());
  NamedTensors tensors;
  optim::Metadata meta;
  for (const auto& [key, value] : metadata) meta[kUser + key] = value;
  for (size_t p = 0; p < state.pieces->size(); ++p) {
    const ShardPiece& piece = (*state.pieces)[p];
    tensors.emplace_back(detail::str("param.", p), state.piece_tensors[p]);
    meta[detail::str("piece.", p)] =
        detail::str((*state.names)[piece.param], " ", piece.param_offset, " ", piece.numel);
  }
  meta["num_pieces"] = std::to_string(state.pieces->size());
  meta["rank"] = std::to_string(rank);
  meta["world_size"] = std::to_string(world);
  state.optimizer->save_state(tensors, meta, kOptimizer);
  save_safetensors((fs::path(dir) / shard_name(rank, world)).string(), tensors, meta);

  group.barrier()->wait();  // every shard is on disk
  if (rank == 0) {
    nlohmann::json index;
    index["format"] = kFormat;
    index["world_size"] = world;
    for (int r = 0; r < world; ++r) index["files"].push_back(shard_name(r, world));
    for (size_t i = 0; i < state.params->size(); ++i) {
      const Tensor& p = (*state.params)[i];
      index["parameters"].push_back(
          {{"name", (*state.names)[i]}, {"shape", p.sizes()}, {"dtype", detail::str(p.dtype())}});
    }
    const std::string text = index.dump(1);
    AtomicFile out((fs::path(dir) / "index.json").string(), "save_sharded_checkpoint");
    out.write(text.data(), text.size());
    out.commit();
  }
  group.barrier()->wait();  // nobody reads the folder before its index exists
}

std::map<std::string, std::string> load_sharded_checkpoint(const std::string& dir,
                                                           const ShardedState& state) {
  check_state("load_sharded_checkpoint", state);
  const nlohmann::json index = read_index(dir, "load_sharded_checkpoint");

  // The same model: every parameter by name, shape and dtype, in order.
  const std::vector<std::string>& names = *state.names;
  const std::vector<Tensor>& params = *state.params;
  const auto& listed = index.at("parameters");
  LOOM_CHECK(listed.size() == params.size(), ValueError, "load_sharded_checkpoint: ", dir,
             " holds ", listed.size(), " parameters; this model has ", params.size(),
             ": the checkpoint is of another model");
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = listed[i].at("name");
    const Shape shape = listed[i].at("shape").get<Shape>();
    const std::string dtype = listed[i].at("dtype");
    LOOM_CHECK(
        name == names[i] && shape == params[i].sizes() && dtype == detail::str(params[i].dtype()),
        ValueError, "load_sharded_checkpoint: the checkpoint is of another model: its ",
        "parameter ", i, " is ", name, " ", shape, " ", dtype, ", this model's is ", names[i], " ",
        params[i].sizes(), " ", params[i].dtype());
    by_name[name] = i;
  }

  // Every shard, read and checked before anything changes.
  const int world = index.at("world_size");
  std::vector<SafetensorsFile> shards;
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(dir) / shard_name(r, world)).string();
    LOOM_CHECK(fs::exists(path), IOError, "load_sharded_checkpoint: shard ", r, " of ", world,
               " is missing: ", path);
    shards.push_back(load_safetensors(path));
    const auto& m = shards.back().metadata;
    LOOM_CHECK(m.count("rank") && m.at("rank") == std::to_string(r) && m.count("world_size") &&
                   m.at("world_size") == std::to_string(world) && m.count("num_pieces"),
               IOError, "load_sharded_checkpoint: ", path, " is not shard ", r, " of ", world);
  }

  // Each parameter and each of its optimizer buffers, whole, from the pieces (memory order).
  NoGradGuard no_grad;
  struct Whole {
    Tensor values;
    std::map<std::string, Tensor> buffers;
    int64_t steps = -1;  // -1: no optimizer state
    int64_t covered = 0;
    char decay = 0;  // the per-parameter decay flag, where the optimizer has one
  };
  std::vector<Whole> whole(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    whole[i].values = empty({params[i].numel()}, params[i].dtype());
  for (int r = 0; r < world; ++r) {
    const SafetensorsFile& file = shards[r];
    const std::string where = shard_name(r, world);
    const int64_t count = std::stoll(file.metadata.at("num_pieces"));
    const auto decay = file.metadata.find(std::string(kOptimizer) + "decay");
    for (int64_t p = 0; p < count; ++p) {
      const auto found = file.metadata.find(detail::str("piece.", p));
      LOOM_CHECK(found != file.metadata.end(), IOError, "load_sharded_checkpoint: ", where,
                 " lacks piece.", p);
      const PieceRef ref = parse_piece(found->second, where);
      const auto param = by_name.find(ref.name);
      LOOM_CHECK(param != by_name.end(), ValueError, "load_sharded_checkpoint: ", where,
                 " has a piece of ", ref.name, ", which this model lacks");
      Whole& w = whole[param->second];
      LOOM_CHECK(ref.offset + ref.numel <= w.values.numel(), IOError,
                 "load_sharded_checkpoint: ", where, ": piece ", p, " runs past the end of ",
                 ref.name);
      k::copy_(k::narrow(w.values, 0, ref.offset, ref.numel), file.at(detail::str("param.", p)));
      w.covered += ref.numel;
      if (decay != file.metadata.end() && static_cast<int64_t>(decay->second.size()) == count)
        w.decay = decay->second[static_cast<size_t>(p)];
      const std::string base = detail::str(kOptimizer, "state.", p, ".");
      for (const auto& [key, t] : file.tensors) {
        if (!key.starts_with(base)) continue;
        const std::string buffer = key.substr(base.size());
        if (buffer == "step") {
          w.steps = t.item<int64_t>();
          continue;
        }
        Tensor& full = w.buffers[buffer];
        if (!full.defined()) full = zeros({w.values.numel()}, t.dtype());
        k::copy_(k::narrow(full, 0, ref.offset, ref.numel), t);
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i)
    LOOM_CHECK(whole[i].covered == params[i].numel(), ValueError, "load_sharded_checkpoint: ", dir,
               "'s pieces cover ", whole[i].covered, " of the ", params[i].numel(), " elements of ",
               names[i]);

  // This rank's optimizer state, in its own pieces; its options from the file.
  SafetensorsFile mine;
  for (const auto& [key, value] : shards[0].metadata)
    if (key.starts_with(kOptimizer)) mine.metadata[key] = value;
  const std::vector<ShardPiece>& pieces = *state.pieces;
  mine.metadata[std::string(kOptimizer) + "num_params"] = std::to_string(pieces.size());
  if (mine.metadata.count(std::string(kOptimizer) + "decay")) {
    NamedTensors unused;
    optim::Metadata own;
    state.optimizer->save_state(unused, own, kOptimizer);
    std::string decay;
    for (const ShardPiece& piece : pieces) decay.push_back(whole[piece.param].decay);
    LOOM_CHECK(own.count(std::string(kOptimizer) + "decay") &&
                   own.at(std::string(kOptimizer) + "decay") == decay,
               ValueError,
               "load_sharded_checkpoint: the checkpoint applies weight decay to other "
               "parameters than this optimizer does");
    mine.metadata[std::string(kOptimizer) + "decay"] = decay;
  }
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Whole& w = whole[pieces[p].param];
    if (w.steps < 0) continue;
    const std::string base = detail::str(kOptimizer, "state.", p, ".");
    for (const auto& [buffer, full] : w.buffers)
      mine.tensors.emplace_back(
          base + buffer, k::clone(k::narrow(full, 0, pieces[p].param_offset, pieces[p].numel)));
    mine.tensors.emplace_back(base + "step", scalar_tensor(static_cast<double>(w.steps), kInt64));
  }
  state.optimizer->load_state(mine, kOptimizer);  // checks everything before it changes

  // The weights: every parameter where each rank holds them all, else this rank's pieces.
  if (state.params_replicated)
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i];
      k::copy_(memory_line(p), whole[i].values);
      p.bump_version();
    }
  for (size_t p = 0; p < pieces.size(); ++p) {
    Tensor run = state.piece_tensors[p];
    k::copy_(run,
             k::narrow(whole[pieces[p].param].values, 0, pieces[p].param_offset, pieces[p].numel));
    run.bump_version();
  }

  std::map<std::string, std::string> user;
  for (const auto& [key, value] : shards[0].metadata)
    if (key.starts_with(kUser)) user[key.substr(std::string(kUser).size())] = value;
  return user;
}

namespace {

// Every metadata key of a training checkpoint that is not the caller's `info`.
constexpr const char* kTrainingKeys[] = {"loom.checkpoint", "loom.epoch",     "loom.step",
                                         "loom.batch",      "generator.seed", "generator.offset"};

int64_t metadata_int(const std::map<std::string, std::string>& meta, const std::string& key,
                     const std::string& dir) {
  const auto found = meta.find(key);
  LOOM_CHECK(found != meta.end(), ValueError, "load_sharded_training_checkpoint: ", dir,
             " has no '", key, "': not a sharded training checkpoint");
  try {
    size_t used = 0;
    const int64_t value = std::stoll(found->second, &used);
    if (used == found->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw ValueError(detail::str("load_sharded_training_checkpoint: ", dir, ": '", key,
                               "' is not an integer: '", found->second, "'"));
}

}  // namespace

void save_sharded_training_checkpoint(const std::string& dir, const ShardedState& state,
                                      const optim::LRSchedule* schedule,
                                      const optim::TrainingProgress& progress,
                                      const optim::Metadata& info,
                                      const optim::GradScaler* scaler) {
  const Generator::State g = default_generator().state();
  std::map<std::string, std::string> meta(info.begin(), info.end());
  meta["loom.checkpoint"] = "sharded";
  meta["loom.epoch"] = std::to_string(progress.epoch);
  meta["loom.step"] = std::to_string(progress.step);
  meta["loom.batch"] = std::to_string(progress.batch);
  meta["generator.seed"] = std::to_string(g.seed);
  meta["generator.offset"] = std::to_string(g.offset);
  NamedTensors tensors;  // schedules and scalers keep scalars: metadata only
  if (schedule) schedule->save_state(tensors, meta, "schedule.");
  if (scaler) scaler->save_state(tensors, meta, "scaler.");
  LOOM_ASSERT(tensors.empty(), "a schedule or scaler saved tensors");
  save_sharded_checkpoint(dir, state, meta);
}

optim::TrainingProgress load_sharded_training_checkpoint(const std::string& dir,
                                                         const ShardedState& state,
                                                         optim::LRSchedule* schedule,
                                                         bool restore_generator,
                                                         optim::GradScaler* scaler) {
  // Everything read and checked before the shards change the model.
  const std::map<std::string, std::string> meta = read_sharded_checkpoint_metadata(dir);
  for (const char* key : kTrainingKeys)
    LOOM_CHECK(meta.count(key), ValueError, "load_sharded_training_checkpoint: ", dir, " has no '",
               key, "': a sharded checkpoint, but not a training one");
  optim::TrainingProgress progress{.epoch = metadata_int(meta, "loom.epoch", dir),
                                   .step = metadata_int(meta, "loom.step", dir),
                                   .batch = metadata_int(meta, "loom.batch", dir)};
  const Generator::State generator{
      static_cast<uint64_t>(metadata_int(meta, "generator.seed", dir)),
      static_cast<uint64_t>(metadata_int(meta, "generator.offset", dir))};
  SafetensorsFile scalars;
  scalars.metadata = meta;
  if (scaler) {
    const bool saved = std::any_of(meta.begin(), meta.end(),
                                   [](const auto& kv) { return kv.first.starts_with("scaler."); });
    LOOM_CHECK(saved, ValueError, "load_sharded_training_checkpoint: ", dir,
               " was saved without a loss scaler");
  }
  load_sharded_checkpoint(dir, state);
  if (schedule) schedule->load_state(scalars, "schedule.");
  if (restore_generator) default_generator().set_state(generator);
  if (scaler) scaler->load_state(scalars, "scaler.");
  return progress;
}

std::map<std::string, std::string> read_sharded_checkpoint_metadata(const std::string& dir) {
  const nlohmann::json index = read_index(dir, "read_sharded_checkpoint_metadata");
  const std::string shard0 =
      (fs::path(dir) / shard_name(0, index.at("world_size").get<int>())).string();
  LOOM_CHECK(fs::exists(shard0), IOError,
             "read_sharded_checkpoint_metadata: shard 0 is missing: ", shard0);
  std::map<std::string, std::string> user;
  for (const auto& [key, value] : optim::read_checkpoint_metadata(shard0))
    if (key.starts_with(kUser)) user[key.substr(std::string(kUser).size())] = value;
  return user;
}

bool is_sharded_checkpoint(const std::string& path) {
  return fs::is_directory(path) && fs::exists(fs::path(path) / "index.json");
}

}  // namespace loom::dist
