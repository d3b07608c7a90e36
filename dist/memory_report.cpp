// dist/memory_report.cpp — Note [The memory report].

#include "dist/memory_report.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "dist/memory_plan.h"
#include "nn/gpt.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

// K of Note [Model-state arithmetic] for an optimizer, scaled to its parameters' dtype; -1 for
// one the arithmetic does not know.
int state_bytes_per_parameter(const optim::Optimizer& optimizer, int64_t itemsize) {
  std::string name = optimizer.name();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name != "sgd" && name != "adam" && name != "adamw") return -1;
  const bool momentum = name != "sgd" || optimizer.momentum() != 0;
  return static_cast<int>(optimizer_state_bytes(name, momentum, false) * itemsize / 4);
}

// The bytes of the distinct storages behind `tensors` (views of one buffer count once).
int64_t storage_bytes(const std::vector<Tensor>& tensors) {
  std::set<const StorageImpl*> seen;
  int64_t bytes = 0;
  for (const Tensor& t : tensors)
    if (t.defined() && seen.insert(t.storage().get()).second)
      bytes += static_cast<int64_t>(t.storage()->nbytes);
  return bytes;
}

}  // namespace

int DataParallelism::world() const {
  if (fsdp) return fsdp->group().size();
  if (ddp) return ddp->reducer().group().size();
  return 1;
}

ModelStates measure_model_states(const nn::Module& model, const optim::Optimizer& optimizer,
                                 const DataParallelism& parallel) {
  ModelStates m;
  std::vector<Tensor> params, grads;
  for (const Tensor& p : model.parameters()) {
    params.push_back(p);
    grads.push_back(p.grad());
    if (p.requires_grad()) m.parameters += p.numel();
  }
  for (const Tensor& b : model.buffers()) m.buffers += static_cast<int64_t>(b.nbytes());
  if (parallel.fsdp) {
    m.weights = parallel.fsdp->parameter_shard_bytes();
    m.gradients = parallel.fsdp->gradient_shard_bytes();
    m.gradients_where = "ZeRO-3 shards";
  } else {
    m.weights = storage_bytes(params);
    if (parallel.ddp) {
      std::vector<Tensor> held;
      for (const Bucket& b : parallel.ddp->reducer().buckets()) {
        held.push_back(b.buffer);
        held.push_back(b.shard);
      }
      m.gradients = storage_bytes(held);
      m.gradients_where =
          parallel.stage() == 2
              ? "ZeRO-2 shards"
              : detail::str("in ", parallel.ddp->reducer().buckets().size(), " DDP buckets");
    } else {
      m.gradients = storage_bytes(grads);
      m.gradients_where = "one per parameter";
    }
  }
  const optim::Optimizer& keeper = parallel.zero ? parallel.zero->inner() : optimizer;
  m.optimizer_state = keeper.state_bytes();
  const bool masters = parallel.zero && parallel.zero->has_master_copy();
  if (masters) m.optimizer_state += parallel.zero->master_bytes();
  m.optimizer_name = keeper.name();
  // w: the weights' bytes as kept between steps (FSDP: its shards, the master copy).
  if (parallel.fsdp && !parallel.fsdp->optimizer_params().empty())
    m.bytes_per_weight = static_cast<int>(parallel.fsdp->optimizer_params().front().itemsize());
  else if (!params.empty())
    m.bytes_per_weight = static_cast<int>(params.front().itemsize());
  // K counts a float32 master copy (4 bytes) where ZeRO keeps one (Note [ZeRO with a 16-bit
  // model]); the inner optimizer's buffers are float32 there, whatever the model's dtype.
  const int k = state_bytes_per_parameter(keeper, masters ? 4 : m.bytes_per_weight);
  m.state_bytes_per_parameter = masters && k >= 0 ? k + 4 : k;
  return m;
}

std::string memory_report(const nn::Module& model, const optim::Optimizer& optimizer,
                          const DataParallelism& parallel, Device device,
                          const MemoryStats& stats) {
  const int64_t held = stats.current_bytes, peak = stats.peak_bytes;
  const ModelStates m = measure_model_states(model, optimizer, parallel);
  const auto mib = [](double bytes) { return bytes / (1 << 20); };
  const bool known = m.state_bytes_per_parameter >= 0;
  const ModelStateBytes formula =
      model_state_bytes(parallel.stage(), {.params = m.parameters,
                                           .world = parallel.world(),
                                           .weight_bytes = m.bytes_per_weight,
                                           .state_bytes = known ? m.state_bytes_per_parameter : 0});
  const std::string state_note =
      known ? detail::str(m.optimizer_name, ", ", m.state_bytes_per_parameter, " bytes a parameter")
            : detail::str(m.optimizer_name, ": no formula for it, 0 counted");
  char text[2048];
  std::snprintf(
      text, sizeof text,
      "memory after the second step on %s, %s over %d rank(s) (MiB; Note [The memory report]):\n"
      "                   measured   formula\n"
      "  weights          %9.2f  %8.2f  (%lld parameters)\n"
      "  gradients        %9.2f  %8.2f  (%s)\n"
      "  optimizer state  %9.2f  %8.2f  (%s)\n"
      "  model states     %9.2f  %8.2f  (Note [Model-state arithmetic])\n"
      "  buffers          %9.2f            (batch norm's running statistics)\n"
      "  other held       %9.2f\n"
      "  step peak        %9.2f            above what is held after it (activations saved for "
      "backward, temporaries)\n"
      "  cached           %9.2f            (freed blocks kept for reuse)\n",
      detail::str(device).c_str(), strategy_name(parallel.stage()).c_str(), parallel.world(),
      mib(m.weights), mib(formula.weights), static_cast<long long>(m.parameters), mib(m.gradients),
      mib(formula.gradients), m.gradients_where.c_str(), mib(m.optimizer_state),
      mib(formula.optimizer_state), state_note.c_str(),
      mib(m.weights + m.gradients + m.optimizer_state), mib(formula.total()), mib(m.buffers),
      mib(held - m.weights - m.gradients - m.optimizer_state - m.buffers), mib(peak - held),
      mib(stats.cached_bytes));
  return text;
}

void StepMemoryReport::before_step(Device device) const {
  if (due_ && stepped_ >= 1) reset_peak_memory(device);
}

std::optional<std::string> StepMemoryReport::after_step(bool stepped, const nn::Module& model,
                                                        const optim::Optimizer& optimizer,
                                                        const DataParallelism& parallel,
                                                        Device device) {
  if (!due_ || !stepped || ++stepped_ < 2) return std::nullopt;
  due_ = false;
  return memory_report(model, optimizer, parallel, device, memory_stats(device));
}

// ---------------------------------------------------------------- out of memory

namespace {

// "ZeRO-2 (--zero 2)": a strategy as the training programs' flag names it.
std::string with_flag(int stage) {
  return detail::str(strategy_name(stage), " (--zero ", stage, ")");
}

}  // namespace

std::string explain_memory_use(const nn::Module& model, const optim::Optimizer& optimizer,
                               const DataParallelism& parallel, Device device) {
  const int64_t held = memory_stats(device).current_bytes;
  const int64_t cap = memory_limit(device);
  const ModelStates m = measure_model_states(model, optimizer, parallel);
  const int64_t other = held - m.weights - m.gradients - m.optimizer_state - m.buffers;
  std::ostringstream os;
  os << "held on " << device << " by kind: weights " << format_bytes(m.weights) << ", gradients "
     << format_bytes(m.gradients) << " (" << m.gradients_where << "), optimizer state "
     << format_bytes(m.optimizer_state) << " (" << m.optimizer_name << "), buffers "
     << format_bytes(m.buffers) << ", other (activations, the batch, temporaries) "
     << format_bytes(other) << " (Note [The memory report])";
  if (m.state_bytes_per_parameter < 0) {
    os << "\nneeded: no formula for " << m.optimizer_name << "'s state";
    return os.str();
  }

  // Note [Out of memory in training]: the strategy's model states once all exist, and advice.
  const int stage = parallel.stage(), world = parallel.world();
  const auto states_at = [&](int s, int n) {
    return model_state_bytes(s, {.params = m.parameters,
                                 .world = n,
                                 .weight_bytes = m.bytes_per_weight,
                                 .state_bytes = m.state_bytes_per_parameter})
        .total();
  };
  const double needed = states_at(stage, world);
  const bool over = cap > 0 && needed > static_cast<double>(cap);
  const std::string where =
      world == 1 ? std::string("in one process")
                 : detail::str("under ", strategy_name(stage), " on ", world, " ranks");
  os << "\nneeded: " << where << " the model states come to "
     << format_bytes(static_cast<int64_t>(needed)) << " a rank (" << m.parameters << " parameters, "
     << m.bytes_per_weight << " bytes of weight, " << m.bytes_per_weight << " of gradient and "
     << m.state_bytes_per_parameter << " of " << m.optimizer_name << " state a parameter"
     << (stage > 0 ? ", sharded as the stage shards them" : "")
     << "; Note [Model-state arithmetic])";
  if (cap > 0) os << ", " << (over ? "over" : "within") << " the cap of " << format_bytes(cap);

  const auto* gpt = dynamic_cast<const nn::GPT*>(&model);
  const bool can_checkpoint = gpt != nullptr && !gpt->gradient_checkpointing();
  // The fewest ranks at which ZeRO-3's model states fit the cap.
  const int fewest =
      cap > 0 ? static_cast<int>(std::ceil(states_at(3, 1) / static_cast<double>(cap))) : 0;
  os << "\nadvice: ";
  if (over) {
    os << "the model states alone do not fit: shard them";
    if (world > 1 && stage < 3) {
      os << " (";
      for (int s = std::max(stage + 1, 2); s <= 3; ++s)
        os << (s > std::max(stage + 1, 2) ? ", " : "") << with_flag(s) << " keeps "
           << format_bytes(static_cast<int64_t>(states_at(s, world))) << " a rank on " << world;
      os << ")";
    }
    if (fewest > world || world == 1)
      os << "; ZeRO-3 fits them from " << fewest << " ranks (--zero 3 with --nproc N or --gpus N)";
    else if (stage == 3)
      os << "; they should fit ZeRO-3 on " << world << " ranks: the rest is the gathered units";
    if (can_checkpoint) os << "; --checkpoint-activations frees the activations' share";
  } else {
    os << "the model states fit; the rest is activations and temporaries, which grow with the "
          "batch: a smaller --batch-size (--accumulate keeps the step's batch)";
    if (can_checkpoint) os << ", --checkpoint-activations (each block recomputed in backward)";
    if (stage < 3 && world > 1)
      os << ", or " << with_flag(3) << ", whose model states take "
         << format_bytes(static_cast<int64_t>(states_at(3, world))) << " a rank on " << world;
  }
  os << "; or a larger cap (--max-memory, " << kMaxMemoryVariable << ")";
  return os.str();
}

TrainingMemoryExplainer::TrainingMemoryExplainer(const nn::Module& model,
                                                 const optim::Optimizer& optimizer,
                                                 const DataParallelism& parallel)
    : previous_(set_out_of_memory_explainer([&model, &optimizer, parallel](Device device) {
        return explain_memory_use(model, optimizer, parallel, device);
      })) {}

TrainingMemoryExplainer::~TrainingMemoryExplainer() {
  set_out_of_memory_explainer(std::move(previous_));
}

}  // namespace loom::dist
