// dist/horovod.cpp — DistributedOptimizer and the start-up broadcasts (Note [Horovod-style
// averaging], horovod.h).

#include "dist/horovod.h"

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "dist/ddp.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"

namespace loom::dist {

namespace k = kernels;

namespace {

NamedTensors named(const std::vector<Tensor>& params) {
  NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back("param." + std::to_string(i), params[i]);
  return out;
}

// The wrapped optimizer, checked before the base class is given its parameters and lr (in
// either order: arguments are evaluated in an unspecified one).
const optim::Optimizer& checked(const std::unique_ptr<optim::Optimizer>& inner) {
  LOOM_CHECK(inner != nullptr, ValueError, "DistributedOptimizer: the optimizer is null");
  return *inner;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<optim::Optimizer> inner,
                                           std::shared_ptr<ProcessGroup> group,
                                           DistributedOptimizerOptions options)
    : optim::Optimizer("DistributedOptimizer", checked(inner).params(), checked(inner).lr()),
      inner_(std::move(inner)),
      group_(std::move(group)),
      options_(options) {
  LOOM_CHECK(group_ != nullptr, ValueError, "DistributedOptimizer: the process group is null");
  LOOM_CHECK(options_.fusion_bytes >= 0, ValueError,
             "DistributedOptimizer: fusion_bytes must be 0 (no fusion) or more; got ",
             options_.fusion_bytes);
  verify_replicas(*group_, named(params()));
}

void DistributedOptimizer::synchronize() {
  NoGradGuard no_grad;
  const double start = steady_seconds();
  report_ = {};
  struct Fusion {
    std::vector<size_t> params;
    Tensor buffer;
    std::shared_ptr<Work> work;
  };
  std::vector<Fusion> fusions;
  const std::vector<Tensor>& ps = params();
  // 1. A gradient for every parameter.
  for (Tensor p : ps)  // a handle: the parameter itself gets the gradient
    if (!p.grad().defined()) p.set_grad(zeros(p.sizes(), p.dtype(), p.device()));
  // 2. Pack in order; a buffer's allreduce starts once it is full (or its dtype ends).
  auto launch = [&](std::vector<size_t> members) {
    if (members.empty()) return;
    int64_t numel = 0;
    for (size_t i : members) numel += ps[i].numel();
    const Tensor& first = ps[members.front()];
    Tensor buffer = empty({numel}, first.dtype(), first.device());
    int64_t at = 0;
    for (size_t i : members) {
      const Tensor& g = ps[i].grad();
      k::copy_(buffer.narrow(0, at, g.numel()).view(g.sizes()), g);
      at += g.numel();
    }
    report_.bytes += buffer.nbytes();
    auto work = group_->allreduce(buffer, ReduceOp::Sum);
    fusions.push_back({std::move(members), buffer, std::move(work)});
  };
  std::vector<size_t> members;
  int64_t bytes = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t size = ps[i].nbytes();
    const bool other_dtype = !members.empty() && ps[members.front()].dtype() != ps[i].dtype();
    if (!members.empty() && (other_dtype || bytes + size > options_.fusion_bytes)) {
      launch(std::move(members));
      members.clear();
      bytes = 0;
    }
    members.push_back(i);
    bytes += size;
  }
  launch(std::move(members));
  // 3. Average and copy back.
  const double average = 1.0 / group_->size();
  for (Fusion& f : fusions) {
    f.work->wait();
    k::mul_scalar_(f.buffer, average);
    int64_t at = 0;
    for (size_t i : f.params) {
      const Tensor& g = ps[i].grad();
      k::copy_(g, f.buffer.narrow(0, at, g.numel()).view(g.sizes()));
      at += g.numel();
    }
  }
  report_.buffers = static_cast<int64_t>(fusions.size());
  report_.seconds = steady_seconds() - start;
  synchronized_ = true;
}

void DistributedOptimizer::step() {
  if (!synchronized_) synchronize();
  synchronized_ = false;
  inner_->set_lr(lr());
  inner_->step();
}

void broadcast_parameters(ProcessGroup& group, const NamedTensors& state, int root) {
  verify_replicas(group, state);
  std::vector<Tensor> tensors;
  for (const auto& [name, t] : state) tensors.push_back(t);
  if (group.size() > 1) broadcast_coalesced(group, tensors, root);
}

void broadcast_optimizer_state(ProcessGroup& group, optim::Optimizer& optimizer, int root) {
  LOOM_CHECK(root >= 0 && root < group.size(), ValueError, "broadcast_optimizer_state: root ", root,
             " is not a rank of this group of ", group.size());
  if (group.size() == 1) return;
  NoGradGuard no_grad;
  const Device device = optimizer.params().empty() ? kCPU : optimizer.params()[0].device();
  // The root's checkpoint form: a header (names, dtypes, shapes, metadata), then each tensor.
  NamedTensors tensors;
  optim::Metadata meta;
  std::string header;
  if (group.rank() == root) {
    optimizer.save_state(tensors, meta, "");
    nlohmann::json j;
    j["metadata"] = meta;
    for (const auto& [name, t] : tensors)
      j["tensors"].push_back(
          {{"name", name}, {"dtype", static_cast<int>(t.dtype())}, {"sizes", t.sizes()}});
    header = j.dump();
  }
  Tensor length = tensor<int64_t>({static_cast<int64_t>(header.size())}, {1}).to(device);
  group.broadcast(length, root)->wait();
  const int64_t n = length.to(kCPU).item<int64_t>();
  Tensor bytes = empty({n}, kUInt8);
  if (group.rank() == root) std::memcpy(bytes.data(), header.data(), header.size());
  bytes = bytes.to(device);
  group.broadcast(bytes, root)->wait();
  bytes = bytes.to(kCPU);
  const auto j = nlohmann::json::parse(
      std::string(static_cast<const char*>(bytes.data()), static_cast<size_t>(n)));
  SafetensorsFile file;
  file.metadata = j["metadata"].get<std::map<std::string, std::string>>();
  // The root's live buffers, or tensors shaped as the header says; then one coalesced broadcast
  // per dtype (broadcast_coalesced), as DDP's start does.
  std::vector<Tensor> received;
  size_t index = 0;
  for (const auto& entry : j.value("tensors", nlohmann::json::array())) {
    received.push_back(group.rank() == root
                           ? tensors[index].second
                           : empty(entry["sizes"].get<std::vector<int64_t>>(),
                                   static_cast<DType>(entry["dtype"].get<int>()), device));
    file.tensors.emplace_back(entry["name"].get<std::string>(), received.back());
    ++index;
  }
  broadcast_coalesced(group, received, root);
  if (group.rank() != root) optimizer.load_state(file, "");
}

}  // namespace loom::dist
