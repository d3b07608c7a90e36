// dist/host_staging_group.cpp — HostStagingGroup (Note [gloo with CUDA tensors]): CUDA tensors
// copied to the host for a host-memory transport, and the results copied back in wait().

#include "dist/host_staging_group.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/accelerator.h"
#include "tensor/copy.h"

namespace loom::dist {

namespace {

// Note [gloo with CUDA tensors]
// Gloo moves host memory. So that CUDA tensors work too (several ranks sharing one GPU in a
// test, or a machine without NCCL), the group loom hands out stages them: the device tensors
// are copied to host tensors (a synchronous copy, which also waits for the kernels that wrote
// them), the collective runs on those, and wait() copies the results back into the device
// tensors (as the transports write theirs: the tensors' versions unchanged). CPU tensors pass
// straight through. It is slower than nccl by two copies through
// PCIe per collective, and wait() is where the copy back happens: a caller that only polls
// is_completed() sees the host result, not yet the device one.
class HostStagingGroup : public ProcessGroup {
 public:
  explicit HostStagingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend() const override { return inner_->backend(); }
  std::string transport() const override { return inner_->transport(); }

  std::shared_ptr<Work> allreduce(Tensor t, ReduceOp op) override {
    if (!t.defined() || !t.is_cuda()) return inner_->allreduce(t, op);
    Tensor host = on_host(t);
    return staged(inner_->allreduce(host, op), {{t, host}});
  }
  std::shared_ptr<Work> broadcast(Tensor t, int root) override {
    if (!t.defined() || !t.is_cuda()) return inner_->broadcast(t, root);
    Tensor host = on_host(t);
    return staged(inner_->broadcast(host, root), {{t, host}});
  }
  std::shared_ptr<Work> allgather(std::vector<Tensor> out, Tensor input) override {
    if (!any_cuda(out) && !(input.defined() && input.is_cuda()))
      return inner_->allgather(std::move(out), input);
    std::vector<std::pair<Tensor, Tensor>> back;
    std::vector<Tensor> host_out = to_host(out, &back);
    return staged(inner_->allgather(host_out, on_host(input)), std::move(back));
  }
  std::shared_ptr<Work> reduce_scatter(Tensor out, std::vector<Tensor> inputs,
                                       ReduceOp op) override {
    if (!any_cuda(inputs) && !(out.defined() && out.is_cuda()))
      return inner_->reduce_scatter(out, std::move(inputs), op);
    std::vector<std::pair<Tensor, Tensor>> back;
    Tensor host_out = on_host(out);
    if (out.defined() && out.is_cuda()) back.emplace_back(out, host_out);
    std::vector<std::pair<Tensor, Tensor>> unused;
    return staged(inner_->reduce_scatter(host_out, to_host(inputs, &unused), op), std::move(back));
  }
  std::shared_ptr<Work> alltoall(Tensor out, Tensor input) override {
    if (!(out.defined() && out.is_cuda()) && !(input.defined() && input.is_cuda()))
      return inner_->alltoall(out, input);
    Tensor host_out = on_host(out);
    std::vector<std::pair<Tensor, Tensor>> back;
    if (out.defined() && out.is_cuda()) back.emplace_back(out, host_out);
    return staged(inner_->alltoall(host_out, on_host(input)), std::move(back));
  }
  std::shared_ptr<Work> barrier() override { return inner_->barrier(); }
  // The inner group counts what moved (Note [Bytes moved]).
  CollectiveCounters counters() const override { return inner_->counters(); }
  void reset_counters() override { inner_->reset_counters(); }
  std::shared_ptr<Work> send(Tensor t, int dst, int tag) override {
    return inner_->send(on_host(t), dst, tag);  // the host copy lives in the work
  }
  std::shared_ptr<Work> recv(Tensor t, int src, int tag) override {
    if (!t.defined() || !t.is_cuda()) return inner_->recv(t, src, tag);
    Tensor host = empty(t.sizes(), t.dtype(), kCPU);
    return staged(inner_->recv(host, src, tag), {{t, host}});
  }

 private:
  // Waits for the collective, then copies each host result into its device tensor, once.
  class StagedWork : public Work {
   public:
    StagedWork(std::shared_ptr<Work> inner, std::vector<std::pair<Tensor, Tensor>> back)
        : inner_(std::move(inner)), back_(std::move(back)) {}
    bool is_completed() const override { return inner_->is_completed(); }
    void wait(Milliseconds timeout) override {
      inner_->wait(timeout);
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [device, host] : back_) copy_back(device, host);
      back_.clear();
    }
    double started_at() const override { return inner_->started_at(); }
    double finished_at() const override { return inner_->finished_at(); }

   private:
    std::shared_ptr<Work> inner_;
    std::mutex mutex_;
    std::vector<std::pair<Tensor, Tensor>> back_;  // (device tensor, its host copy)
  };

  // The result lands as a transport writes its output, without a version bump (gloo and nccl
  // write memory, not tensors): FSDP gathers a unit again into the storage whose aliases
  // autograd saved (Note [Released storage]), and ZeRO bumps its parameters itself.
  static void copy_back(const Tensor& device, const Tensor& host) {
    const uint64_t version = device.version();
    kernels::copy_(device, host);
    device.storage()->version.store(version);
  }
  static bool any_cuda(const std::vector<Tensor>& ts) {
    return std::any_of(ts.begin(), ts.end(),
                       [](const Tensor& t) { return t.defined() && t.is_cuda(); });
  }
  // A deferred check of an earlier op (Note [Deferred device checks]) must not throw out of a
  // collective half enqueued: the copy to the host holds them.
  static Tensor on_host(const Tensor& t) {
    if (!t.defined() || !t.is_cuda()) return t;
    DeferredChecksHold hold;
    return t.to(kCPU);
  }
  static std::vector<Tensor> to_host(const std::vector<Tensor>& ts,
                                     std::vector<std::pair<Tensor, Tensor>>* back) {
    std::vector<Tensor> host;
    for (const Tensor& t : ts) {
      host.push_back(on_host(t));
      if (t.defined() && t.is_cuda()) back->emplace_back(t, host.back());
    }
    return host;
  }
  static std::shared_ptr<Work> staged(std::shared_ptr<Work> inner,
                                      std::vector<std::pair<Tensor, Tensor>> back) {
    return std::make_shared<StagedWork>(std::move(inner), std::move(back));
  }

  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace

std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner) {
  LOOM_CHECK(inner != nullptr, ValueError, "stage_through_host: the process group is null");
  return std::make_shared<HostStagingGroup>(std::move(inner));
}

}  // namespace loom::dist
