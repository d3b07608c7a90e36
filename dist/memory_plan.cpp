// dist/memory_plan.cpp — Note [Model-state arithmetic], Note [The memory planner] and Note
// [Choosing a strategy]: the bytes of each strategy on a rank, the dry run that measures the
// activations, and the table loomplan prints.

#include "dist/memory_plan.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>

#include "autograd/autocast.h"
#include "autograd/graph.h"
#include "autograd/ops.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory_limit.h"
#include "tensor/random.h"
#include "tensor/safetensors.h"
#include "tensor/storage.h"

namespace loom::dist {

ModelStateBytes model_state_bytes(int stage, const ModelStateShape& shape) {
  LOOM_CHECK(stage >= 0 && stage <= 3, ValueError, "model_state_bytes: stage ", stage,
             ": the strategies are 0 (DDP), 1, 2 and 3 (ZeRO)");
  LOOM_CHECK(
      shape.world >= 1 && shape.params >= 0 && shape.weight_bytes > 0 && shape.state_bytes >= 0,
      ValueError, "model_state_bytes: got ", shape.params, " parameters, world ", shape.world, ", ",
      shape.weight_bytes, " bytes a weight, ", shape.state_bytes, " of optimizer state");
  const double psi = static_cast<double>(shape.params), n = shape.world;
  const double w = shape.weight_bytes * psi, k = shape.state_bytes * psi;
  ModelStateBytes bytes;
  bytes.weights = stage == 3 ? w / n : w;
  bytes.gradients = stage >= 2 ? w / n : w;
  bytes.optimizer_state = stage >= 1 ? k / n : k;
  return bytes;
}

int optimizer_state_bytes(const std::string& optimizer, bool momentum, bool master_copy) {
  const bool adam = optimizer == "adam" || optimizer == "adamw";
  LOOM_CHECK(adam || optimizer == "sgd", ValueError, "optimizer_state_bytes: unknown optimizer '",
             optimizer, "' (sgd, adam or adamw)");
  const int k = adam ? 8 : (momentum ? 4 : 0);
  return k + (master_copy ? 4 : 0);
}

std::string strategy_name(int stage) {
  LOOM_CHECK(stage >= 0 && stage <= 3, ValueError, "strategy_name: stage ", stage,
             ": the strategies are 0 (DDP), 1, 2 and 3 (ZeRO)");
  return stage == 0 ? "DDP" : "ZeRO-" + std::to_string(stage);
}

// ------------------------------------------------------------------ requests

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  throw ValueError(detail::str("precision '", name, "': expected fp32, bf16 or fp16"));
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return "fp32";
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
  }
  LOOM_ASSERT(false, "precision_name: unknown precision");
  return "";
}

int64_t parse_byte_size(const std::string& text) {
  const int64_t bytes = parse_memory_size(text, "memory size");
  LOOM_CHECK(bytes > 0, ValueError, "memory size '", text, "': the size must be positive");
  return bytes;
}

std::string PlanModel::describe() const {
  if (kind == Kind::kGPT)
    return detail::str("GPT (", gpt.n_layer, " layers, ", gpt.n_head, " heads, ", gpt.n_embd,
                       " channels, block ", gpt.block_size, ", vocabulary ", gpt.vocab_size,
                       gpt.bias ? "" : ", no biases",
                       gpt.dropout > 0 ? detail::str(", dropout ", gpt.dropout) : "", ")");
  return detail::str("ResNet-18 (width ", resnet.width, ", ", resnet.in_channels,
                     resnet.in_channels == 1 ? " channel, " : " channels, ", resnet.num_classes,
                     " classes, ", image_size, "x", image_size, " images)");
}

nn::ModulePtr PlanModel::build(bool checkpointing) const {
  validate();
  if (kind == Kind::kResNet18) {
    LOOM_CHECK(!checkpointing, ValueError,
               "activation checkpointing: loom checkpoints GPT's blocks only, not a ResNet's");
    return nn::resnet18(resnet);
  }
  auto model = std::make_shared<nn::GPT>(gpt);
  model->set_gradient_checkpointing(checkpointing);
  return model;
}

void PlanModel::validate() const {
  if (kind == Kind::kGPT) {
    gpt.validate();
    return;
  }
  LOOM_CHECK(resnet.depth == 18, ValueError, "the planner knows ResNet-18; got depth ",
             resnet.depth);
  LOOM_CHECK(resnet.width > 0 && resnet.in_channels > 0 && resnet.num_classes > 0, ValueError,
             "ResNet-18: width, channels and classes must be positive; got width ", resnet.width,
             ", channels ", resnet.in_channels, ", classes ", resnet.num_classes);
  // Four stride-2 stages after the stem: at least 8x8 keeps a pixel in layer4.
  LOOM_CHECK(image_size >= 8, ValueError, "ResNet-18: images of ", image_size, "x", image_size,
             " are too small; at least 8x8");
}

namespace {

int64_t metadata_int(const std::map<std::string, std::string>& meta, const std::string& key,
                     const std::string& path) {
  const auto it = meta.find(key);
  LOOM_CHECK(it != meta.end(), ValueError, "checkpoint '", path, "': its metadata names a ",
             meta.at("model"), " but has no '", key, "'");
  try {
    size_t end = 0;
    const int64_t value = std::stoll(it->second, &end);
    if (end == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw ValueError(detail::str("checkpoint '", path, "': metadata '", key, "' is '", it->second,
                               "', not a whole number"));
}

}  // namespace

PlanModel plan_model_from_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  LOOM_CHECK(!fs::is_directory(path), ValueError, "checkpoint '", path,
             "' is a folder: give a model file (a sharded checkpoint's folder has "
             "model.safetensors beside it)");
  LOOM_CHECK(fs::is_regular_file(path), IOError, "checkpoint '", path, "': no such file");
  const SafetensorsFile file = load_safetensors(path);
  PlanModel model;
  const std::optional<nn::GPTConfig> config =
      nn::read_gpt_metadata(file.metadata, "'" + path + "'").first;
  if (config) {
    model.kind = PlanModel::Kind::kGPT;
    model.gpt = *config;
    return model;
  }
  const auto named = file.metadata.find("model");
  if (named != file.metadata.end() && named->second == "resnet18") {
    model.kind = PlanModel::Kind::kResNet18;
    model.resnet.width = metadata_int(file.metadata, "width", path);
    model.resnet.in_channels = metadata_int(file.metadata, "in_channels", path);
    model.resnet.num_classes = metadata_int(file.metadata, "num_classes", path);
    model.validate();
    return model;
  }
  const fs::path beside = fs::path(path).parent_path() / "config.json";
  if (fs::is_regular_file(beside)) {
    model.kind = PlanModel::Kind::kGPT;
    model.gpt = nn::read_hf_config(beside.string());
    return model;
  }
  throw ValueError(detail::str(
      "checkpoint '", path,
      "' does not say which model it holds: expected a GPT file "
      "(loom.gpt.config in its metadata, or a config.json beside it) or a resnet18_cifar "
      "checkpoint (model = resnet18)",
      named != file.metadata.end() ? detail::str("; its metadata names model '", named->second, "'")
                                   : std::string()));
}

void PlanRequest::validate() const {
  model.validate();
  LOOM_CHECK(world >= 1, ValueError, "world ", world, ": at least one rank");
  LOOM_CHECK(global_batch >= 1, ValueError, "global batch ", global_batch,
             ": at least one sample a step");
  LOOM_CHECK(global_batch % world == 0, ValueError, "global batch ", global_batch,
             " does not split evenly over ", world, " ranks: give a multiple of ", world);
  LOOM_CHECK(device_memory > 0, ValueError, "device memory ", device_memory,
             " bytes: it must be positive");
  optimizer_state_bytes(optimizer, momentum, false);  // the optimizer's name
  const auto [low, high] = probe_batches;
  LOOM_CHECK((low == 0 && high == 0) || (low >= 1 && high > low), ValueError, "probe batches ", low,
             " and ", high, ": two positive batches, the second larger");
}

// ------------------------------------------------------------------ layout

int64_t ModelLayout::params() const {
  int64_t n = 0;
  for (int64_t numel : numels) n += numel;
  return n;
}

ModelLayout model_layout(nn::Module& model) {
  ModelLayout layout;
  std::vector<int64_t> bytes;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    layout.names.push_back(name);
    layout.numels.push_back(p.numel());
    bytes.push_back(static_cast<int64_t>(p.nbytes()));
  }
  // FSDP's units, as its constructor picks them (none inside another), the root last.
  std::vector<std::string> picked;
  for (const auto& [name, m] : model.named_modules()) {
    if (name.empty() || !transformer_block_or_resnet_stage(name, *m)) continue;
    const bool nested = std::any_of(picked.begin(), picked.end(), [&](const std::string& outer) {
      return name.starts_with(outer + ".");
    });
    if (!nested) picked.push_back(name);
  }
  layout.unit_names = picked;
  layout.unit_names.push_back("");  // the root
  layout.unit_of.assign(layout.names.size(), static_cast<int>(picked.size()));
  for (size_t i = 0; i < layout.names.size(); ++i)
    for (size_t u = 0; u < picked.size(); ++u)
      if (layout.names[i].starts_with(picked[u] + ".")) layout.unit_of[i] = static_cast<int>(u);
  // DDP's buckets (Reducer::build_buckets): reverse registration order, a bucket closed once it
  // reaches its cap, the first cap smaller.
  const DDPOptions caps;
  int64_t filled = 0, cap = caps.first_bucket_bytes;
  for (size_t k = layout.names.size(); k-- > 0;) {
    if (layout.buckets.empty() || filled >= cap) {
      if (!layout.buckets.empty()) cap = caps.bucket_bytes;
      layout.buckets.emplace_back();
      filled = 0;
    }
    layout.buckets.back().push_back(k);
    filled += bytes[k];
  }
  return layout;
}

// ------------------------------------------------------------------ the dry run

double ActivationProfile::peak() const {
  double p = 0;
  for (double f : forward) p = std::max(p, f);
  for (double b : backward) p = std::max(p, b);
  return p;
}

ActivationProfile DryRun::at(int64_t batch) const {
  LOOM_ASSERT(low.arrivals == high.arrivals && low.backward.size() == high.backward.size() &&
                  low.forward.size() == high.forward.size(),
              "DryRun::at: the two probes saw the gradients arrive in different orders");
  const double t =
      static_cast<double>(batch - low.batch) / static_cast<double>(high.batch - low.batch);
  const auto line = [t](double a, double b) { return std::max(0.0, a + (b - a) * t); };
  ActivationProfile profile;
  profile.batch = batch;
  for (size_t k = 0; k < low.forward.size(); ++k)
    profile.forward.push_back(line(low.forward[k], high.forward[k]));
  profile.arrivals = low.arrivals;
  for (size_t k = 0; k < low.backward.size(); ++k)
    profile.backward.push_back(line(low.backward[k], high.backward[k]));
  return profile;
}

namespace {

// The default generator's state, restored when the dry run ends: planning changes no draw of
// the program that plans.
class GeneratorState {
 public:
  GeneratorState() : saved_(default_generator().state()) { default_generator().set_state({0, 0}); }
  ~GeneratorState() { default_generator().set_state(saved_); }
  GeneratorState(const GeneratorState&) = delete;
  GeneratorState& operator=(const GeneratorState&) = delete;

 private:
  Generator::State saved_;
};

// The hooks the dry run puts on the parameters, removed however it ends.
class ArrivalHooks {
 public:
  ArrivalHooks(const std::vector<Tensor>& params, const std::function<void(size_t)>& on_arrival)
      : params_(params) {
    for (size_t i = 0; i < params_.size(); ++i)
      handles_.push_back(params_[i].register_post_accumulate_grad_hook(
          [on_arrival, i](Tensor&) { on_arrival(i); }));
  }
  ~ArrivalHooks() {
    for (size_t i = 0; i < handles_.size(); ++i)
      params_[i].remove_post_accumulate_grad_hook(handles_[i]);
  }
  ArrivalHooks(const ArrivalHooks&) = delete;
  ArrivalHooks& operator=(const ArrivalHooks&) = delete;

 private:
  std::vector<Tensor> params_;
  std::vector<int> handles_;
};

// The hooks around each FSDP unit's forward that cut the dry run's forward into intervals.
class UnitHooks {
 public:
  UnitHooks(nn::Module& model, const std::vector<std::string>& units,
            const std::function<void()>& on_boundary) {
    for (const auto& [name, m] : model.named_modules()) {
      if (std::find(units.begin(), units.end(), name) == units.end() || name.empty()) continue;
      modules_.push_back(m.get());
      handles_.push_back(m->register_forward_pre_hook(
          [on_boundary](nn::Module&, const Tensor&) { on_boundary(); }));
      modules_.push_back(m.get());
      handles_.push_back(
          m->register_forward_hook([on_boundary](nn::Module&, const Tensor&, const Tensor& output) {
            on_boundary();
            return output;
          }));
    }
  }
  ~UnitHooks() {
    for (size_t i = 0; i < handles_.size(); ++i) modules_[i]->remove_hook(handles_[i]);
  }
  UnitHooks(const UnitHooks&) = delete;
  UnitHooks& operator=(const UnitHooks&) = delete;

 private:
  std::vector<nn::Module*> modules_;
  std::vector<int> handles_;
};

// measure_step, and the layout of the model it built when `layout` is given.
ActivationProfile measure(const PlanModel& model, Precision precision, bool checkpointing,
                          int64_t batch, DType weights, ModelLayout* layout) {
  model.validate();
  LOOM_CHECK(batch >= 1, ValueError, "measure_step: batch ", batch, ": at least 1");
  LOOM_CHECK(weights == kFloat32 || (weights == kBFloat16 && precision == Precision::kBFloat16) ||
                 (weights == kFloat16 && precision == Precision::kFloat16),
             ValueError, "measure_step: ", weights, " weights in ", precision_name(precision),
             " precision; 16-bit weights go with autocast to their own dtype");
  const bool gpt = model.kind == PlanModel::Kind::kGPT;
  GeneratorState generator;
  const nn::ModulePtr net = model.build(checkpointing);
  net->train();
  if (weights != kFloat32) net->to(weights);
  const ModelLayout units = model_layout(*net);
  if (layout) *layout = units;
  std::vector<Tensor> params;
  for (const auto& [name, p] : net->named_parameters())
    if (p.requires_grad()) params.push_back(p);
  {
    // The gradients held as DDP's buckets hold them: backward adds into them.
    NoGradGuard no_grad;
    for (Tensor& p : params) p.set_grad(zeros_like(p));
  }

  ActivationProfile profile;
  profile.batch = batch;
  reset_peak_memory(kCPU);
  const int64_t held = memory_stats(kCPU).current_bytes;
  const auto close_interval = [held] {
    const double peak = static_cast<double>(memory_stats(kCPU).peak_bytes - held);
    reset_peak_memory(kCPU);
    return peak;
  };
  ArrivalHooks hooks(params, [&](size_t i) {
    profile.backward.push_back(close_interval());
    profile.arrivals.push_back(i);
  });
  bool in_forward = true;  // a checkpointed block's recomputation in backward is not forward's
  UnitHooks boundaries(*net, units.unit_names, [&] {
    if (in_forward) profile.forward.push_back(close_interval());
  });
  {
    Tensor loss;
    {
      const DType dtype = precision == Precision::kFloat16 ? kFloat16 : kBFloat16;
      autocast::Guard amp(dtype, precision != Precision::kFloat32);
      if (gpt) {
        const int64_t T = model.gpt.block_size, V = model.gpt.vocab_size;
        const Tensor idx = randint(0, V, {batch, T});
        const Tensor targets = randint(0, V, {batch, T});
        const Tensor logits = net->forward(idx);
        loss = cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
      } else {
        const int64_t side = model.image_size;
        const Tensor images = randn({batch, model.resnet.in_channels, side, side});
        const Tensor labels = randint(0, model.resnet.num_classes, {batch});
        loss = cross_entropy(net->forward(images), labels);
      }
    }
    profile.forward.push_back(close_interval());
    in_forward = false;
    loss.backward();
  }
  profile.backward.push_back(close_interval());
  return profile;
}

}  // namespace

ActivationProfile measure_step(const PlanModel& model, Precision precision, bool checkpointing,
                               int64_t batch, DType weights) {
  return measure(model, precision, checkpointing, batch, weights, nullptr);
}

DryRun dry_run(const PlanModel& model, Precision precision, bool checkpointing,
               std::pair<int64_t, int64_t> batches, DType weights) {
  LOOM_CHECK(batches.first >= 1 && batches.second > batches.first, ValueError,
             "dry_run: probe batches ", batches.first, " and ", batches.second,
             ": two positive batches, the second larger");
  DryRun run;
  run.checkpointing = checkpointing;
  run.weights = weights;
  run.low = measure(model, precision, checkpointing, batches.first, weights, &run.layout);
  run.high = measure(model, precision, checkpointing, batches.second, weights, nullptr);
  LOOM_CHECK(run.low.arrivals == run.high.arrivals, InternalError, "dry_run: the gradients of ",
             model.describe(), " arrived in another order at batch ", batches.second,
             " than at batch ", batches.first);
  return run;
}

DType plan_weights(int stage, Precision precision) {
  LOOM_CHECK(stage >= 0 && stage <= 3, ValueError, "plan_weights: stage ", stage,
             ": the strategies are 0 (DDP), 1, 2 and 3 (ZeRO)");
  if (precision == Precision::kFloat32 || stage == 0) return kFloat32;
  if (stage == 3) return precision == Precision::kBFloat16 ? kBFloat16 : kFloat16;
  return precision == Precision::kBFloat16 ? kBFloat16 : kFloat32;
}

// ------------------------------------------------------------------ strategies

namespace {

// When the gradients of a group of parameters arrived: the event of the first and of the last
// (indices into ActivationProfile::arrivals).
struct Span {
  size_t first = 0, last = 0;
};

std::vector<Span> spans(const ModelLayout& layout, const std::vector<size_t>& arrivals,
                        const std::vector<std::vector<size_t>>& groups) {
  std::vector<size_t> first(layout.names.size(), arrivals.size()), last(layout.names.size(), 0);
  for (size_t e = 0; e < arrivals.size(); ++e) {
    first[arrivals[e]] = std::min(first[arrivals[e]], e);
    last[arrivals[e]] = e;
  }
  std::vector<Span> out;
  for (const std::vector<size_t>& group : groups) {
    Span s{arrivals.size(), 0};
    for (size_t i : group) {
      s.first = std::min(s.first, first[i]);
      s.last = std::max(s.last, last[i]);
    }
    if (s.first > s.last) s = {arrivals.size(), arrivals.size()};  // no gradient: at the end
    out.push_back(s);
  }
  return out;
}

// Adds `bytes` to intervals [from, to] (clamped to the profile).
void add_bytes(std::vector<double>& transient, size_t from, size_t to, double bytes) {
  for (size_t k = from; k <= to && k < transient.size(); ++k) transient[k] += bytes;
}

// Per group: the event at which its reduction is launched (all its gradients in, and the
// groups before it launched: the reducer launches buckets in order) — or, for FSDP's units,
// just its last gradient.
std::vector<size_t> launches(const std::vector<Span>& spans, bool in_order) {
  std::vector<size_t> at;
  for (const Span& s : spans)
    at.push_back(in_order && !at.empty() ? std::max(s.last, at.back()) : s.last);
  return at;
}

// The reduce-scatters' two pieces each (Note [Ring reduce-scatter]), one collective at a time on
// the worker: group g's from the interval after its launch to the next launch (in time).
void add_reduce_scatters(std::vector<double>& transient, const std::vector<size_t>& launched,
                         const std::vector<double>& group_bytes, double world) {
  if (world <= 1) return;  // one rank copies, no ring
  std::vector<size_t> order(launched.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return launched[a] < launched[b]; });
  for (size_t j = 0; j < order.size(); ++j) {
    const size_t g = order[j];
    const size_t until = j + 1 < order.size() ? launched[order[j + 1]] : transient.size() - 1;
    add_bytes(transient, launched[g] + 1, until, 2 * group_bytes[g] / world);
  }
}

}  // namespace

StrategyRow plan_strategy(const DryRun& run, int stage, int world, int64_t per_rank_batch,
                          int state_bytes, int64_t device_memory) {
  LOOM_CHECK(world >= 1 && per_rank_batch >= 1, ValueError, "plan_strategy: world ", world,
             " and per-rank batch ", per_rank_batch, " must be positive");
  const ModelLayout& layout = run.layout;
  StrategyRow row;
  row.stage = stage;
  row.checkpointing = run.checkpointing;
  // Note [The planner's dry runs]: 16-bit weights under ZeRO-1 and 2 are the model's own, with
  // float32 masters; under ZeRO-3 they are only the gathered units', over float32 shards.
  const bool low = run.weights != kFloat32;
  LOOM_CHECK(!low || stage > 0, ValueError,
             "plan_strategy: DDP keeps float32 weights (autocast); got a dry run of ", run.weights,
             " weights");
  const bool model_low = low && stage < 3;
  row.states = model_state_bytes(stage, {.params = layout.params(),
                                         .world = world,
                                         .weight_bytes = model_low ? 2 : 4,
                                         .state_bytes = state_bytes + (model_low ? 4 : 0)});
  const ActivationProfile act = run.at(per_rank_batch);
  const double n = world;
  const double element = static_cast<double>(itemsize(run.weights));
  // Bytes of a flat buffer of these parameters (buckets, units, their gradients), padded to a
  // multiple of N under ZeRO.
  const auto flat_bytes = [&](const std::vector<size_t>& members) {
    int64_t numel = 0;
    for (size_t i : members) numel += layout.numels[i];
    if (stage > 0) numel = (numel + world - 1) / world * world;
    return element * static_cast<double>(numel);
  };
  const size_t end = act.backward.size() - 1;  // the interval after the last gradient
  std::vector<double> transient(act.backward.size(), 0.0);
  std::vector<double> forward_transient(act.forward.size(), 0.0);

  if (stage == 1 || stage == 2) {
    const std::vector<Span> in = spans(layout, act.arrivals, layout.buckets);
    const std::vector<size_t> launched = launches(in, /*in_order=*/true);
    std::vector<double> bytes;
    for (const auto& bucket : layout.buckets) bytes.push_back(flat_bytes(bucket));
    add_reduce_scatters(transient, launched, bytes, n);
    if (stage == 2)  // each buffer, until the launch after its own finds it completed
      for (size_t b = 0; b < in.size(); ++b)
        add_bytes(transient, in[b].first + 1, b + 1 < in.size() ? launched[b + 1] : end, bytes[b]);
  } else if (stage == 3) {
    const size_t units = layout.unit_names.size(), root = units - 1;
    std::vector<std::vector<size_t>> members(units);
    for (size_t i = 0; i < layout.unit_of.size(); ++i) members[layout.unit_of[i]].push_back(i);
    const std::vector<Span> in = spans(layout, act.arrivals, members);
    std::vector<double> bytes;
    for (const auto& unit : members) bytes.push_back(flat_bytes(unit));
    // The root all along. In forward (intervals: before unit 0, then during and after each
    // unit): unit 0 prefetched at the start; during unit u, u and u + 1 (prefetched); after
    // it, u + 1. Without that split (a hand-made profile), the two largest units throughout.
    add_bytes(transient, 0, end, bytes[root]);
    forward_transient.assign(act.forward.size(), bytes[root]);
    if (act.forward.size() == 2 * root + 1) {
      for (size_t u = 0; u < root; ++u) {
        forward_transient[2 * u] += bytes[u];  // before it: prefetched
        forward_transient[2 * u + 1] += bytes[u] + (u + 1 < root ? bytes[u + 1] : 0.0);
      }
    } else {
      std::vector<double> sizes(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(root));
      std::sort(sizes.rbegin(), sizes.rend());
      const double two = (sizes.size() > 0 ? sizes[0] : 0.0) + (sizes.size() > 1 ? sizes[1] : 0.0);
      for (double& f : forward_transient) f += two;
    }
    for (size_t u = 0; u < root; ++u) {
      // Gathered by its pre-backward, or earlier by the prefetch of the unit after it (the
      // root's pre-backward prefetches the last), until its last gradient. A checkpointed unit's
      // pre-backward comes after its recomputation, which makes the peak of the interval before
      // its first gradient: the prefetch it starts counts from the interval after that.
      const size_t prefetched = in[u + 1].first + (run.checkpointing ? 1 : 0);
      const size_t from = u + 1 == root ? 0 : std::min(in[u].first, prefetched);
      add_bytes(transient, from, in[u].last, bytes[u]);
    }
    for (size_t u = 0; u < units; ++u)  // the flat gradient buffers, freed at the end
      if (!members[u].empty()) add_bytes(transient, in[u].first + 1, end, bytes[u]);
    const std::vector<size_t> launched = launches(in, /*in_order=*/false);
    add_reduce_scatters(transient, launched, bytes, n);
    if (low)  // the 16-bit shard each reduce-scatter writes, widened at the end of backward
      for (size_t u = 0; u < units; ++u)
        if (!members[u].empty()) add_bytes(transient, launched[u] + 1, end, bytes[u] / n);
  }

  double step_peak = 0;
  for (size_t k = 0; k < act.forward.size(); ++k)
    step_peak = std::max(step_peak, act.forward[k] + forward_transient[k]);
  for (size_t k = 0; k < transient.size(); ++k)
    step_peak = std::max(step_peak, act.backward[k] + transient[k]);
  row.activations = act.peak();
  row.transient = step_peak - row.activations;
  row.fits = row.total() <= static_cast<double>(device_memory);
  return row;
}

// ------------------------------------------------------------------ the plan

const StrategyRow& MemoryPlan::row(int stage, bool checkpointing) const {
  for (const StrategyRow& r : rows)
    if (r.stage == stage && r.checkpointing == checkpointing) return r;
  throw ValueError(detail::str("MemoryPlan::row: no row for ", strategy_name(stage),
                               checkpointing ? " with" : " without", " checkpointing"));
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", bytes / kMiB);
  return text;
}

std::string strategy_label(int stage, bool checkpointing) {
  return strategy_name(stage) + (checkpointing ? " with activation checkpointing" : "");
}

// Note [Choosing a strategy], step 4: what would make the last step of the tree fit.
std::string advice(const MemoryPlan& plan, const DryRun& last) {
  const PlanRequest& r = plan.request;
  std::string text;
  const auto fits = [&](int world, int64_t batch) {
    return plan_strategy(last, 3, world, batch, plan.state_bytes, r.device_memory);
  };
  // More ranks, the same global batch (a world that divides it), up to one sample a rank.
  constexpr int64_t kMostRanks = 1 << 16;
  int64_t ranks = 0;
  for (int64_t w = r.world + 1; w <= std::min(r.global_batch, kMostRanks) && ranks == 0; ++w)
    if (r.global_batch % w == 0 && fits(static_cast<int>(w), r.global_batch / w).fits) ranks = w;
  if (ranks > 0) {
    const StrategyRow row = fits(static_cast<int>(ranks), r.global_batch / ranks);
    text += detail::str("    more ranks: ", ranks, " ranks (", r.global_batch / ranks,
                        " samples a rank) need ", mib(row.total()), " each\n");
  } else {
    text +=
        detail::str("    more ranks: no world size up to ", std::min(r.global_batch, kMostRanks),
                    " that divides the global batch ", r.global_batch, " makes it fit\n");
  }
  // A smaller batch on these ranks: the largest that fits (the totals grow with the batch).
  int64_t lo = 0, hi = plan.per_rank_batch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(r.world, mid).fits)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo >= 1) {
    const int64_t steps = (plan.per_rank_batch + lo - 1) / lo;
    text += detail::str("    a smaller batch: ", lo, " samples a rank (", lo * r.world,
                        " a step on ", r.world, " ranks) need ", mib(fits(r.world, lo).total()),
                        "; accumulating the gradients of ", steps, " micro-batches (--accumulate ",
                        steps, ") keeps about the global batch\n");
  } else {
    text +=
        detail::str("    a smaller batch: even one sample a rank does not fit on ", r.world,
                    r.world == 1 ? " rank" : " ranks", " (", mib(fits(r.world, 1).total()), ")\n");
  }
  return text;
}

Recommendation recommend(const MemoryPlan& plan, const DryRun& last) {
  const double memory = static_cast<double>(plan.request.device_memory);
  const bool gpt = plan.request.model.kind == PlanModel::Kind::kGPT;
  const StrategyRow& ddp = plan.row(0, false);
  const StrategyRow& zero2 = plan.row(2, false);
  const StrategyRow& zero3 = plan.row(3, gpt);
  Recommendation rec;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", ddp.total() / memory);
  if (ddp.fits) {
    rec = {true, 0, false,
           detail::str("DDP fits: ", mib(ddp.total()), " a rank of the device's ", mib(memory),
                       "; it communicates the least (Note [Choosing a strategy], step 1)"),
           ""};
  } else if (ddp.total() < 2 * memory && zero2.fits) {
    rec = {true, 2, false,
           detail::str("DDP needs ", mib(ddp.total()), " a rank, ", ratio, " the device's ",
                       mib(memory),
                       " (over by less than 2x): ZeRO-2 shards the optimizer state "
                       "and the gradients, ",
                       mib(zero2.total()), " (step 2)"),
           ""};
  } else {
    const std::string why =
        ddp.total() < 2 * memory
            ? detail::str("DDP needs ", mib(ddp.total()), " a rank, ", ratio, " the device's ",
                          mib(memory), ", but ZeRO-2 still needs ", mib(zero2.total()))
            : detail::str("DDP needs ", mib(ddp.total()), " a rank, ", ratio, " the device's ",
                          mib(memory), " (over by 2x or more)");
    const std::string what =
        gpt ? "ZeRO-3 with activation checkpointing"
            : "ZeRO-3 (loom checkpoints the activations of GPT's blocks only, not a ResNet's)";
    rec.stage = 3;
    rec.checkpointing = gpt;
    rec.fits = zero3.fits;
    if (zero3.fits) {
      rec.reason = detail::str(why, ": ", what, " needs ", mib(zero3.total()), " (step 3)");
    } else {
      rec.reason = detail::str("nothing fits: ", why, "; even ", what, " needs ",
                               mib(zero3.total()), " a rank (step 4)");
      rec.advice = advice(plan, last);
    }
  }
  return rec;
}

}  // namespace

MemoryPlan plan_memory(const PlanRequest& request, const std::vector<DryRun>& runs) {
  request.validate();
  const bool gpt = request.model.kind == PlanModel::Kind::kGPT;
  const auto run_for = [&](int stage, bool checkpointing) -> const DryRun& {
    const DType weights = plan_weights(stage, request.precision);
    for (const DryRun& run : runs)
      if (run.weights == weights && run.checkpointing == checkpointing) return run;
    throw ValueError(detail::str("plan_memory: no dry run of ", weights, " weights",
                                 checkpointing ? " with activation checkpointing" : "", " for ",
                                 strategy_name(stage), " in ", precision_name(request.precision)));
  };
  MemoryPlan plan;
  plan.request = request;
  plan.params = run_for(0, false).layout.params();
  plan.per_rank_batch = request.global_batch / request.world;
  plan.state_bytes = optimizer_state_bytes(request.optimizer, request.momentum, false);
  plan.probe_batches = {run_for(0, false).low.batch, run_for(0, false).high.batch};
  for (int stage = 0; stage <= 3; ++stage)
    for (bool checkpointing : {false, true}) {
      if (checkpointing && !gpt) {
        StrategyRow none;
        none.stage = stage;
        none.checkpointing = true;
        none.applicable = false;
        plan.rows.push_back(none);
        continue;
      }
      plan.rows.push_back(plan_strategy(run_for(stage, checkpointing), stage, request.world,
                                        plan.per_rank_batch, plan.state_bytes,
                                        request.device_memory));
    }
  plan.recommendation = recommend(plan, run_for(3, gpt));
  return plan;
}

MemoryPlan plan_memory(const PlanRequest& request) {
  request.validate();
  const bool gpt = request.model.kind == PlanModel::Kind::kGPT;
  std::pair<int64_t, int64_t> batches = request.probe_batches;
  if (batches.first == 0) batches = {2, 4};
  // One dry run for each dtype of weights the rows need (Note [The planner's dry runs]).
  std::vector<DType> weights;
  for (int stage = 0; stage <= 3; ++stage) {
    const DType w = plan_weights(stage, request.precision);
    if (std::find(weights.begin(), weights.end(), w) == weights.end()) weights.push_back(w);
  }
  std::vector<DryRun> runs;
  for (DType w : weights) {
    runs.push_back(dry_run(request.model, request.precision, false, batches, w));
    if (gpt) runs.push_back(dry_run(request.model, request.precision, true, batches, w));
  }
  return plan_memory(request, runs);
}

std::string format_plan(const MemoryPlan& plan) {
  const PlanRequest& r = plan.request;
  std::ostringstream out;
  char line[256];
  const std::string optimizer = r.optimizer == "sgd"
                                    ? (r.momentum ? "SGD with momentum" : "SGD without momentum")
                                : r.optimizer == "adam" ? "Adam"
                                                        : "AdamW";
  std::snprintf(line, sizeof line, "%s: %.2fM parameters (Psi = %lld)\n",
                r.model.describe().c_str(), static_cast<double>(plan.params) / 1e6,
                static_cast<long long>(plan.params));
  out << line;
  out << "global batch " << r.global_batch << " on " << r.world
      << (r.world == 1 ? " rank" : " ranks") << ": " << plan.per_rank_batch << " a rank; "
      << (r.precision == Precision::kFloat32 ? std::string("float32")
                                             : precision_name(r.precision) + " autocast")
      << "; " << optimizer << ", K = " << plan.state_bytes << " bytes a parameter; device "
      << mib(static_cast<double>(r.device_memory)) << "\n";
  if (r.precision == Precision::kBFloat16)
    out << "bf16 as loom's apps lay it out: DDP autocasts float32 weights; ZeRO-1 and 2 keep a "
           "bfloat16 model with float32 masters (K + 4); ZeRO-3 gathers its units in bf16 "
           "(Note [The planner's dry runs])\n";
  if (r.precision == Precision::kFloat16)
    out << "fp16 as loom's apps lay it out: DDP, ZeRO-1 and 2 autocast float32 weights; ZeRO-3 "
           "gathers its units in fp16 (Note [The planner's dry runs])\n";
  out << "activations: a dry run of one step on this CPU at batches " << plan.probe_batches.first
      << " and " << plan.probe_batches.second << ", scaled to " << plan.per_rank_batch
      << " a rank; transient: each strategy's own buffers at the step's peak\n"
      << "(Note [The memory planner] in dist/memory_plan.h)\n\n";
  const char* const kRow = "%-14s %-13s %9s %10s %10s %12s %10s %10s  %s\n";
  std::snprintf(line, sizeof line, kRow, "MiB a rank", "checkpointing", "weights", "gradients",
                "optimizer", "activations", "transient", "total", "fits");
  out << line;
  for (const StrategyRow& row : plan.rows) {
    const std::string name = strategy_name(row.stage);
    if (!row.applicable) {
      std::snprintf(line, sizeof line, "%-14s %-13s %9s\n", name.c_str(), "on", "n/a");
    } else {
      const auto cell = [](double bytes) {
        char text[32];
        std::snprintf(text, sizeof text, "%.2f", bytes / kMiB);
        return std::string(text);
      };
      std::snprintf(line, sizeof line, kRow, name.c_str(), row.checkpointing ? "on" : "off",
                    cell(row.states.weights).c_str(), cell(row.states.gradients).c_str(),
                    cell(row.states.optimizer_state).c_str(), cell(row.activations).c_str(),
                    cell(row.transient).c_str(), cell(row.total()).c_str(),
                    row.fits ? "yes" : "no");
    }
    out << line;
  }
  if (r.model.kind != PlanModel::Kind::kGPT)
    out << "(n/a: loom checkpoints the activations of GPT's blocks only)\n";
  const Recommendation& rec = plan.recommendation;
  out << "\n";
  if (rec.fits)
    out << "recommendation: " << strategy_label(rec.stage, rec.checkpointing) << "\n";
  else
    out << "recommendation: none fits on " << r.world << (r.world == 1 ? " rank" : " ranks")
        << " of " << mib(static_cast<double>(r.device_memory)) << "\n";
  out << "  why: " << rec.reason << "\n";
  if (rec.fits) {  // the tree picks one; a reader may prefer another that fits too
    std::string others;
    for (const StrategyRow& row : plan.rows)
      if (row.applicable && row.fits &&
          !(row.stage == rec.stage && row.checkpointing == rec.checkpointing))
        others += (others.empty() ? "" : ", ") + strategy_label(row.stage, row.checkpointing);
    if (!others.empty()) out << "  also fits: " << others << "\n";
  }
  if (!rec.fits) out << "  what would:\n" << rec.advice;
  return out.str();
}

}  // namespace loom::dist
