// dist/memory_report.cpp — Note [The memory report].

#include "dist/memory_report.h"

#include <cctype>
#include <cstdio>
#include <set>

#include "dist/memory_plan.h"
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
  m.optimizer_name = keeper.name();
  if (!params.empty()) m.bytes_per_weight = static_cast<int>(params.front().itemsize());
  m.state_bytes_per_parameter = state_bytes_per_parameter(keeper, m.bytes_per_weight);
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
      "memory after the first step on %s, %s over %d rank(s) (MiB; Note [The memory report]):\n"
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

void FirstStepMemoryReport::before_step(Device device) const {
  if (due_) reset_peak_memory(device);
}

std::optional<std::string> FirstStepMemoryReport::after_step(bool stepped, const nn::Module& model,
                                                             const optim::Optimizer& optimizer,
                                                             const DataParallelism& parallel,
                                                             Device device) {
  if (!due_ || !stepped) return std::nullopt;
  due_ = false;
  return memory_report(model, optimizer, parallel, device, memory_stats(device));
}

}  // namespace loom::dist
