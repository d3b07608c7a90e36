// dist/ddp.cpp — the bucketed reducer and DistributedDataParallel (Note [The bucketed reducer]).

#include "dist/ddp.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_set>

#include "autograd/graph.h"
#include "tensor/accelerator.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/index.h"
#include "tensor/memory_limit.h"
#include "tensor/view.h"

namespace loom::dist {

namespace k = kernels;

namespace {

// ------------------------------------------------------------------ communication hooks

class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  PendingReduction start(ProcessGroup& group, GradBucket& bucket) override {
    return {group.allreduce(bucket.buffer, ReduceOp::Sum), nullptr, nullptr, false};
  }
};

// Note [16-bit gradient communication] (ddp.h).
class CompressHook : public CommHook {
 public:
  CompressHook(DType wire, CompressedSum sum) : wire_(wire), sum_(sum) {}
  std::string name() const override {
    return std::string(wire_ == kFloat16 ? "fp16" : "bf16") +
           (sum_ == CompressedSum::kFloat32 ? "_compress" : "_compress_allreduce");
  }
  PendingReduction start(ProcessGroup& group, GradBucket& bucket) override {
    return sum_ == CompressedSum::kFloat32 ? exchange(group, bucket.buffer)
                                           : allreduce(group, bucket.buffer);
  }

 private:
  // An all-to-all of 16-bit pieces, float32 sums, an all-gather of the 16-bit sums.
  PendingReduction exchange(ProcessGroup& group, const Tensor& buffer) const {
    const int64_t ranks = group.size(), numel = buffer.numel();
    const int64_t piece = (numel + ranks - 1) / ranks;
    Tensor sent = zeros({piece * ranks}, wire_, buffer.device());  // padded to N pieces
    k::copy_(sent.narrow(0, 0, numel), buffer);
    Tensor received = empty({piece * ranks}, wire_, buffer.device());
    auto work = group.alltoall(received, sent);
    auto gather = [&group, buffer, sent, received, piece, ranks, numel] {
      Tensor sum = k::to_dtype(received.narrow(0, 0, piece), kFloat32);
      for (int64_t r = 1; r < ranks; ++r)
        k::add_(sum, k::to_dtype(received.narrow(0, r * piece, piece), kFloat32));
      // This rank's piece of the result is its own piece of `sent`: an all-gather in place.
      Tensor mine = sent.narrow(0, group.rank() * piece, piece);
      k::copy_(mine, sum);
      PendingReduction last{group.allgather_into_tensor(sent, mine), nullptr, nullptr, false};
      last.finish = [buffer, sent, numel] { k::copy_(buffer, sent.narrow(0, 0, numel)); };
      return last;
    };
    return {std::move(work), nullptr, std::move(gather), false};
  }

  // PyTorch's: divide first, allreduce the 16-bit buffer.
  PendingReduction allreduce(ProcessGroup& group, const Tensor& buffer) const {
    Tensor scaled = k::clone(buffer);
    k::mul_scalar_(scaled, 1.0 / group.size());
    Tensor wire = k::to_dtype(scaled, wire_);
    auto work = group.allreduce(wire, ReduceOp::Sum);
    return {std::move(work), [buffer, wire] { k::copy_(buffer, wire); }, nullptr, true};
  }

  DType wire_;
  CompressedSum sum_;
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook(CompressedSum sum) {
  return std::make_shared<CompressHook>(kFloat16, sum);
}
std::shared_ptr<CommHook> bf16_compress_hook(CompressedSum sum) {
  return std::make_shared<CompressHook>(kBFloat16, sum);
}

std::function<bool(bool)> found_inf_agreement(std::shared_ptr<ProcessGroup> group, Device device) {
  LOOM_CHECK(group != nullptr, ValueError, "found_inf_agreement: the process group is null");
  return [group = std::move(group), device](bool found_inf) {
    if (group->size() == 1) return found_inf;
    DeferredChecksHold hold;  // every rank must get through the agreement
    Tensor flag = full({1}, found_inf ? 1.0 : 0.0, kFloat32, device);
    group->allreduce(flag, ReduceOp::Max)->wait();
    return flag.item() > 0.0;
  };
}

// ------------------------------------------------------------------ replicas

namespace {

// One step of FNV-1a over 64-bit words.
constexpr uint64_t kFnvStart = 1469598103934665603ull;
uint64_t fnv_step(uint64_t hash, int64_t word) {
  return (hash ^ static_cast<uint64_t>(word)) * 1099511628211ull;
}

// What a rank's replica holds, per tensor of its state: the fields the broadcast and the buckets
// rely on (whether a parameter takes gradients decides its place in them), and a hash of the
// shape.
constexpr int kFields = 6;
std::vector<int64_t> describe(const NamedTensors& state) {
  std::vector<int64_t> d;
  for (const auto& [name, t] : state) {
    uint64_t shape = kFnvStart;
    for (int64_t s : t.sizes()) shape = fnv_step(shape, s);
    d.insert(d.end(), {t.numel(), static_cast<int64_t>(t.dtype()),
                       static_cast<int64_t>(suggest_memory_format(t)), t.dim(),
                       static_cast<int64_t>(shape), int64_t{t.requires_grad()}});
  }
  return d;
}

// Rows of `values.size()` int64 from every rank, on the host.
std::vector<std::vector<int64_t>> gather_rows(ProcessGroup& group,
                                              const std::vector<int64_t>& values, Device device) {
  const int64_t n = static_cast<int64_t>(values.size());
  const Tensor mine = tensor<int64_t>(values, {n}).to(device);
  std::vector<Tensor> rows;
  for (int r = 0; r < group.size(); ++r) rows.push_back(empty({n}, kInt64, device));
  group.allgather(rows, mine)->wait();
  DeferredChecksHold hold;  // every rank must get through the comparison
  std::vector<std::vector<int64_t>> out;
  for (const Tensor& row : rows) out.push_back(row.to(kCPU).to_vector<int64_t>());
  return out;
}

}  // namespace

void verify_replicas(ProcessGroup& group, const NamedTensors& state) {
  if (group.size() == 1) return;
  const char* op = "DistributedDataParallel";
  // nccl moves CUDA tensors only: its rows go on this rank's GPU, whatever the state holds.
  const Device device = group.backend() == "nccl" ? current_cuda_device() : kCPU;
  const std::vector<int64_t> mine = describe(state);
  // First the count and a hash of the whole description, then (only where they differ, which
  // every rank sees alike) the descriptions themselves, to name the first tensor that differs.
  uint64_t hash = kFnvStart;
  for (int64_t v : mine) hash = fnv_step(hash, v);
  const auto summary =
      gather_rows(group, {static_cast<int64_t>(state.size()), static_cast<int64_t>(hash)}, device);
  for (int r = 1; r < group.size(); ++r)
    LOOM_CHECK(summary[r][0] == summary[0][0], ValueError, op, ": rank ", r, "'s model holds ",
               summary[r][0], " tensors (parameters and buffers) and rank 0's ", summary[0][0],
               ": every replica must be the same model");
  if (std::all_of(summary.begin(), summary.end(), [&](const auto& s) { return s == summary[0]; }))
    return;
  const auto all = gather_rows(group, mine, device);
  for (int r = 1; r < group.size(); ++r)
    for (size_t i = 0; i < state.size(); ++i) {
      const int64_t* a = all[0].data() + i * kFields;
      const int64_t* b = all[r].data() + i * kFields;
      if (std::equal(a, a + kFields, b)) continue;
      const auto format = [](int64_t f) {
        return f == static_cast<int64_t>(MemoryFormat::kChannelsLast) ? "channels-last"
                                                                      : "row-major";
      };
      const auto grad = [](int64_t g) { return g ? "requires grad" : "frozen"; };
      const std::string what =
          a[2] != b[2]   ? detail::str("memory format ", format(a[2]), " on rank 0, ", format(b[2]),
                                       " on rank ", r)
          : a[1] != b[1] ? detail::str("dtype ", static_cast<DType>(a[1]), " on rank 0, ",
                                       static_cast<DType>(b[1]), " on rank ", r)
          : a[0] != b[0]
              ? detail::str("shape (", a[0], " elements on rank 0, ", b[0], " on rank ", r, ")")
          : a[5] != b[5]
              ? detail::str(grad(a[5]), " on rank 0, ", grad(b[5]), " on rank ", r)
              : detail::str("shape (the same ", a[0], " elements in other sizes on rank ", r, ")");
      LOOM_CHECK(false, ValueError, op, ": '", state[i].first,
                 "' differs between the replicas: ", what,
                 "; every replica must be the same model, stored alike (convert it with ",
                 "to() on every rank, before DDP)");
    }
}

// ------------------------------------------------------------------ broadcast

void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  // One flat buffer per dtype: one collective instead of one per tensor.
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const Tensor& t : tensors)
    if (t.defined() && t.numel() > 0) by_dtype[t.dtype()].push_back(t);
  NoGradGuard no_grad;
  for (auto& [dtype, list] : by_dtype) {
    std::vector<Tensor> flat;
    for (const Tensor& t : list) flat.push_back(k::view(k::contiguous(t), {t.numel()}));
    Tensor buffer = flat.size() == 1 ? k::clone(flat[0]) : k::cat(flat, 0);
    group.broadcast(buffer, root)->wait();
    int64_t offset = 0;
    for (const Tensor& t : list) {
      k::copy_(t, k::view(k::narrow(buffer, 0, offset, t.numel()), t.sizes()));
      t.bump_version();
      offset += t.numel();
    }
  }
}

// ------------------------------------------------------------------ timeline

double ReducerTimeline::overlap() const {
  double total = 0, hidden = 0;
  for (size_t b = 0; b < launched.size(); ++b) {
    const double span = std::max(0.0, completed[b] - launched[b]);
    total += span;
    hidden += std::clamp(backward_seconds - launched[b], 0.0, span);
  }
  return total > 0 ? hidden / total : 0.0;
}

// ------------------------------------------------------------------ the reducer

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      hook_(allreduce_hook()) {
  LOOM_CHECK(group_ != nullptr, ValueError, "DistributedDataParallel: the process group is null");
  LOOM_CHECK(options_.first_bucket_bytes > 0 && options_.bucket_bytes > 0, ValueError,
             "DistributedDataParallel: bucket sizes must be positive; got first_bucket_bytes=",
             options_.first_bucket_bytes, " bucket_bytes=", options_.bucket_bytes);
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // reverse
  build_buckets(order);
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(
        params_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { mark_ready(i); }));
}

Reducer::~Reducer() {
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].remove_post_accumulate_grad_hook(hook_handles_[i]);
}

void Reducer::register_comm_hook(std::shared_ptr<CommHook> hook) {
  LOOM_CHECK(hook != nullptr, ValueError, "register_comm_hook: the hook is null");
  LOOM_CHECK(iterations_ == 0 && !expecting_backward_, ValueError,
             "register_comm_hook: register the hook before the first backward");
  LOOM_CHECK(zero_stage_ == 0, ValueError, "register_comm_hook: under ZeRO-", zero_stage_,
             " the buckets are reduce-scattered; comm hooks do not apply");
  hook_ = std::move(hook);
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  NoGradGuard no_grad;
  const AllocationLabel label("for the gradient buckets of ", "DistributedDataParallel");
  buckets_.clear();
  where_.assign(params_.size(), {0, 0});
  views_.assign(params_.size(), Tensor());
  // Close a bucket once it reaches its cap (the first one's is smaller); a dtype change closes
  // it too (one flat buffer has one dtype).
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = 0, cap = options_.first_bucket_bytes;
  for (size_t i : order) {
    const Tensor& p = params_[i];
    LOOM_CHECK(p.device() == params_[order.front()].device(), DeviceError,
               "DistributedDataParallel: parameters on ", params_[order.front()].device(), " and ",
               p.device(), " (", names_[i], "); each process's model must live on one device");
    if (groups.empty() || bytes >= cap || params_[groups.back().front()].dtype() != p.dtype()) {
      if (!groups.empty()) cap = options_.bucket_bytes;  // the first bucket is closed
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += static_cast<int64_t>(p.nbytes());
  }
  const int64_t world = group_->size();
  const int64_t rank = group_->rank();
  for (const std::vector<size_t>& members : groups) {
    Bucket bucket;
    bucket.params = members;
    for (size_t i : members) bucket.names.push_back(names_[i]);
    int64_t numel = 0;
    for (size_t i : members) {
      bucket.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    if (zero_stage_ > 0) numel = (numel + world - 1) / world * world;  // equal pieces
    bucket.numel = numel;
    bucket.dtype = params_[members.front()].dtype();
    for (size_t pos = 0; pos < members.size(); ++pos) where_[members[pos]] = {buckets_.size(), pos};
    if (zero_stage_ != 2) make_buffer(bucket);
    if (zero_stage_ == 1)
      bucket.shard = bucket.buffer.narrow(0, rank * numel / world, numel / world);
    if (zero_stage_ == 2)
      bucket.shard = zeros({numel / world}, bucket.dtype, params_[members.front()].device());
    buckets_.push_back(std::move(bucket));
  }
}

void Reducer::make_buffer(Bucket& bucket) {
  NoGradGuard no_grad;
  bucket.buffer = zeros({bucket.numel}, bucket.dtype, params_[bucket.params.front()].device());
  for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
    const size_t i = bucket.params[pos];
    Tensor& p = params_[i];
    // Stored as p is (Note [The bucketed reducer], step 1); row-major when p is not dense.
    views_[i] =
        k::as_strided(bucket.buffer, p.sizes(), format_strides(p.sizes(), suggest_memory_format(p)),
                      bucket.buffer.offset() + bucket.offsets[pos]);
    if (zero_stage_ == 2) continue;  // the gradient is copied in when it arrives
    if (Tensor g = p.grad(); g.defined()) k::copy_(views_[i], g);
    p.set_grad(views_[i]);
  }
}

void Reducer::release_reduced_buffers() {
  while (released_upto_ < inflight_.size() && inflight_[released_upto_].work->is_completed()) {
    Bucket& b = buckets_[released_upto_];
    for (size_t i : b.params) views_[i] = Tensor();
    b.buffer = Tensor();
    ++released_upto_;
  }
}

void Reducer::shard_gradients(int stage) {
  LOOM_CHECK(stage == 1 || stage == 2, ValueError,
             "ZeRO: the reducer shards gradients in stage 1 or 2; got stage ", stage,
             " (stage 3 is FullyShardedDataParallel)");
  LOOM_CHECK(iterations_ == 0 && !expecting_backward_, ValueError,
             "ZeRO: shard the gradients before the first backward");
  LOOM_CHECK(hook_->name() == "allreduce", ValueError, "ZeRO: the comm hook '", hook_->name(),
             "' cannot apply: sharded gradients are reduce-scattered");
  std::vector<size_t> order;
  for (const Bucket& b : buckets_) order.insert(order.end(), b.params.begin(), b.params.end());
  zero_stage_ = stage;
  rebuilt_ = true;  // every rank's shards must keep their place
  build_buckets(order);
}

void Reducer::prepare_for_backward(const Tensor& output) {
  expecting_backward_ = require_sync_;
  callback_queued_ = false;
  ready_.assign(params_.size(), false);
  pending_.clear();
  for (const Bucket& b : buckets_) pending_.push_back(b.params.size());
  next_launch_ = 0;
  released_upto_ = 0;
  inflight_.clear();
  unused_.clear();
  if (!expecting_backward_ || !options_.find_unused_parameters) return;

  // The parameters whose AccumulateGrad node the output's graph cannot reach.
  std::unordered_set<autograd::Node*> seen;
  std::vector<autograd::Node*> stack;
  if (autograd::Edge root = autograd::gradient_edge(output); root.valid()) {
    seen.insert(root.node.get());
    stack.push_back(root.node.get());
  }
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    for (const autograd::Edge& e : n->next_edges())
      if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    autograd::AutogradMeta* m = autograd::meta_or_null(params_[i]);
    const auto acc = m ? m->grad_accumulator.lock() : nullptr;
    if (!acc || !seen.count(acc.get())) unused_.push_back(i);
  }
}

void Reducer::mark_ready(size_t i) {
  if (!expecting_backward_ || ready_[i]) return;
  if (!callback_queued_) {
    callback_queued_ = true;
    backward_start_ = steady_seconds();
    timeline_.start = backward_start_;
    timeline_.launched.assign(buckets_.size(), 0.0);
    timeline_.completed.assign(buckets_.size(), 0.0);
    autograd::queue_callback([this] { finalize(); });
    for (size_t u : unused_) {  // they will get no gradient: zero, and ready now
      Bucket& b = buckets_[where_[u].first];
      if (!b.buffer.defined()) make_buffer(b);  // ZeRO-2: zeros already
      k::fill_(views_[u], 0.0);
      if (zero_stage_ != 2) params_[u].set_grad(views_[u]);
      ready_[u] = true;
      if (--pending_[where_[u].first] == 0) launch_ready_buckets();
    }
    if (ready_[i]) return;
  }
  if (options_.rebuild_buckets && !rebuilt_) arrival_.push_back(i);
  // The gradient must live in the bucket: it does unless zero_grad(set_to_none) dropped the
  // view and AccumulateGrad made a fresh tensor, which is then copied in (once per step).
  Tensor g = params_[i].grad();
  if (zero_stage_ == 2) {  // into the bucket, and no full gradient stays behind
    NoGradGuard no_grad;
    Bucket& b = buckets_[where_[i].first];
    if (!b.buffer.defined()) make_buffer(b);
    if (g.defined()) k::copy_(views_[i], g);
    params_[i].set_grad(Tensor());
  } else if (!(g.defined() && g.is_alias_of(views_[i]) && g.data() == views_[i].data())) {
    NoGradGuard no_grad;
    if (g.defined())
      k::copy_(views_[i], g);
    else
      k::fill_(views_[i], 0.0);
    params_[i].set_grad(views_[i]);
  }
  ready_[i] = true;
  if (--pending_[where_[i].first] == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) {
    Bucket& b = buckets_[next_launch_];
    timeline_.launched[next_launch_] = steady_seconds() - backward_start_;
    if (zero_stage_ > 0) {  // Note [ZeRO stages]: each rank keeps its piece of the sum
      inflight_.push_back(
          {group_->reduce_scatter_tensor(b.shard, b.buffer, ReduceOp::Sum), {}, {}, false});
    } else {
      GradBucket view{static_cast<int>(next_launch_),
                      static_cast<int>(buckets_.size()),
                      b.buffer,
                      &b.names,
                      {},
                      b.offsets};
      for (size_t i : b.params) view.gradients.push_back(views_[i]);
      inflight_.push_back(hook_->start(*group_, view));
    }
    ++next_launch_;
  }
  if (zero_stage_ == 2) release_reduced_buffers();
}

void Reducer::finalize() {
  expecting_backward_ = false;
  const double backward_end = steady_seconds();
  if (next_launch_ < buckets_.size()) {
    for (PendingReduction& r : inflight_) r.work->wait();  // leave no collective behind
    std::vector<std::string> missing;
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(names_[i]);
    std::ostringstream msg;
    msg << "DistributedDataParallel: " << missing.size()
        << " parameters received no gradient in this backward, so their buckets could not be "
           "reduced:";
    for (size_t k = 0; k < missing.size() && k < 10; ++k) msg << " " << missing[k];
    if (missing.size() > 10) msg << " ...";
    msg << ". If the model does not use every parameter in every step, construct DDP with "
           "find_unused_parameters = true.";
    throw ValueError(msg.str());
  }
  NoGradGuard no_grad;
  // Hooks of several rounds: each bucket's next round is launched once its round completed,
  // buckets in plan order (the same collectives in the same order on every rank).
  for (bool more = true; more;) {
    more = false;
    for (PendingReduction& r : inflight_)
      if (r.then) {
        r.work->wait();
        PendingReduction next = r.then();
        r = std::move(next);
        more = more || static_cast<bool>(r.then);
      }
  }
  const double average = 1.0 / group_->size();
  for (size_t b = 0; b < inflight_.size(); ++b) {
    inflight_[b].work->wait();
    if (inflight_[b].finish) inflight_[b].finish();
    // The sum over ranks, divided by their number: under ZeRO this rank's piece only.
    if (!inflight_[b].averaged)
      k::mul_scalar_(zero_stage_ > 0 ? buckets_[b].shard : buckets_[b].buffer, average);
    const double done = inflight_[b].work->finished_at();
    timeline_.completed[b] = (done > 0 ? done : steady_seconds()) - backward_start_;
  }
  timeline_.backward_seconds = backward_end - backward_start_;
  if (zero_stage_ == 2) release_reduced_buffers();  // every work completed: all of them
  inflight_.clear();
  ++iterations_;

  if (options_.rebuild_buckets && !rebuilt_) {
    // Rank 0's arrival order, for everyone; parameters that never arrived go last. Every rank
    // must rebuild: an earlier op's deferred check waits (Note [Deferred device checks]).
    DeferredChecksHold hold;
    rebuilt_ = true;
    std::vector<int64_t> order(params_.size());
    std::vector<bool> placed(params_.size(), false);
    size_t n = 0;
    for (size_t i : arrival_)
      if (!placed[i]) {
        placed[i] = true;
        order[n++] = static_cast<int64_t>(i);
      }
    for (size_t i = params_.size(); i-- > 0;)
      if (!placed[i]) order[n++] = static_cast<int64_t>(i);
    // On the parameters' device: nccl moves GPU tensors only.
    Tensor t = tensor<int64_t>(order, {static_cast<int64_t>(order.size())}).to(params_[0].device());
    group_->broadcast(t, 0)->wait();
    std::vector<size_t> agreed;
    for (int64_t v : t.to_vector<int64_t>()) agreed.push_back(static_cast<size_t>(v));
    build_buckets(agreed);
    arrival_.clear();
  }
}

std::string Reducer::plan() const {
  std::ostringstream out;
  int64_t total = 0;
  for (const Bucket& b : buckets_) total += b.bytes();
  char line[200];
  std::snprintf(
      line, sizeof line, "DDP bucket plan: %zu parameters in %zu buckets, %.2f MiB%s; %s\n",
      params_.size(), buckets_.size(), total / 1048576.0,
      rebuilt_ && zero_stage_ == 0 ? " (rebuilt from the order gradients arrived)" : "",
      zero_stage_ > 0
          ? detail::str("ZeRO-", zero_stage_, ": each bucket reduce-scattered, this rank ",
                        "keeping piece ", group_->rank(), " of ", group_->size())
                .c_str()
          : ("comm hook " + hook_->name()).c_str());
  out << line;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    std::snprintf(line, sizeof line, "  bucket %zu: %.2f MiB, %zu parameters\n", b,
                  bucket.bytes() / 1048576.0, bucket.params.size());
    out << line;
    for (size_t i : bucket.params) {
      const std::string shape = detail::str(params_[i].sizes());
      std::snprintf(line, sizeof line, "    %-40s %-18s %8.1f KiB\n", names_[i].c_str(),
                    shape.c_str(), params_[i].nbytes() / 1024.0);
      out << line;
    }
  }
  return out.str();
}

// ------------------------------------------------------------------ DistributedDataParallel

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : nn::Module("DistributedDataParallel"),
      module_(register_module("module", std::move(module))),
      group_(std::move(group)),
      options_(options) {
  LOOM_CHECK(group_ != nullptr, ValueError, "DistributedDataParallel: the process group is null");
  LOOM_CHECK(options_.comm_dtype == kFloat32 || is_16bit_float(options_.comm_dtype), ValueError,
             "DistributedDataParallel: comm_dtype must be float32, float16 or bfloat16; got ",
             options_.comm_dtype);
  // Every replica is the same model, stored alike, and starts from rank 0's weights and buffers.
  const NamedTensors named_state = module_->state_dict();
  verify_replicas(*group_, named_state);
  std::vector<Tensor> state;
  for (const auto& [name, t] : named_state) state.push_back(t);
  if (group_->size() > 1) broadcast_coalesced(*group_, state, 0);
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : module_->named_parameters())
    if (p.requires_grad()) {
      params.push_back(p);
      names.push_back(name);
    }
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), group_, options_);
  if (options_.comm_dtype == kFloat16) register_comm_hook(fp16_compress_hook());
  if (options_.comm_dtype == kBFloat16) register_comm_hook(bf16_compress_hook());
}

void DistributedDataParallel::sync_buffers() {
  broadcast_coalesced(*group_, module_->buffers(), 0);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (options_.broadcast_buffers && group_->size() > 1 && is_training()) sync_buffers();
  Tensor output = module_->forward(input);
  if (autograd::grad_enabled() && output.requires_grad()) reducer_->prepare_for_backward(output);
  return output;
}

}  // namespace loom::dist
