// dist/memory_report.cpp — Note [The memory report].

#include "dist/memory_report.h"

#include <cstdio>
#include <set>

#include "tensor/error.h"

namespace loom::dist {

std::string memory_report(const nn::Module& model, const optim::Optimizer& optimizer,
                          DistributedDataParallel* ddp, Device device, const MemoryStats& stats) {
  const int64_t held = stats.current_bytes, peak = stats.peak_bytes;
  int64_t weights = 0, gradients = 0, buffers = 0;
  std::set<const StorageImpl*> grad_storages;  // DDP's views share their bucket's
  for (const Tensor& p : model.parameters()) {
    weights += static_cast<int64_t>(p.nbytes());
    const Tensor g = p.grad();
    if (g.defined() && grad_storages.insert(g.storage().get()).second)
      gradients += static_cast<int64_t>(g.storage()->nbytes);
  }
  for (const Tensor& b : model.buffers()) buffers += static_cast<int64_t>(b.nbytes());
  const int64_t state = optimizer.state_bytes();
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const std::string where =
      ddp ? detail::str("in ", ddp->reducer().buckets().size(), " DDP buckets")
          : detail::str("one per parameter");
  char text[1024];
  std::snprintf(
      text, sizeof text,
      "memory after the first step on %s (MiB; Note [The memory report]):\n"
      "  weights          %9.2f  (%lld parameters)\n"
      "  gradients        %9.2f  (%s)\n"
      "  optimizer state  %9.2f  (%s)\n"
      "  buffers          %9.2f  (batch norm's running statistics)\n"
      "  other held       %9.2f\n"
      "  step peak        %9.2f  above what is held after it (activations saved for "
      "backward, temporaries)\n"
      "  cached           %9.2f  (freed blocks kept for reuse)\n",
      detail::str(device).c_str(), mib(weights), static_cast<long long>(model.num_parameters()),
      mib(gradients), where.c_str(), mib(state), optimizer.name().c_str(), mib(buffers),
      mib(held - weights - gradients - state - buffers), mib(peak - held), mib(stats.cached_bytes));
  return text;
}

void FirstStepMemoryReport::before_step(Device device) const {
  if (due_) reset_peak_memory(device);
}

std::optional<std::string> FirstStepMemoryReport::after_step(bool stepped, const nn::Module& model,
                                                             const optim::Optimizer& optimizer,
                                                             DistributedDataParallel* ddp,
                                                             Device device) {
  if (!due_ || !stepped) return std::nullopt;
  due_ = false;
  return memory_report(model, optimizer, ddp, device, memory_stats(device));
}

}  // namespace loom::dist
