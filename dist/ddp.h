// dist/ddp.h — DistributedDataParallel: every rank holds a replica of the model, computes the
// gradients of its own share of the batch, and the bucketed reducer averages the gradients
// across ranks while backward is still running, as PyTorch's DDP does.
//
// Note [The bucketed reducer]
// 1. Plan. Parameters are taken in reverse order of registration (the order backward tends to
//    produce their gradients: the last layer first) and packed into buckets: the first bucket
//    holds about first_bucket_bytes (1 MiB: a small bucket gets communication going early), the
//    others about bucket_bytes (25 MiB). Each bucket owns one flat buffer; each parameter's .grad
//    is a view into it, so AccumulateGrad writes gradients straight into the buffer that gets
//    reduced (no copy; gradient_as_bucket_view in PyTorch). A view is stored as its parameter
//    is: a channels-last weight (nn::Module::to(MemoryFormat::kChannelsLast)) gets a
//    channels-last view, the layout its convolution's gradient and AccumulateGrad use, so the
//    gradient is added into the bucket as it comes and the optimizer updates the weight where it
//    lies (Note [Update layouts]). The buffer is the bytes as they lie: ranks agree on them
//    because their replicas share one layout, which the constructor checks (verify_replicas).
// 2. Hooks. A post-accumulate-grad hook on every parameter marks it ready. When the last
//    parameter of a bucket is ready, the bucket's allreduce starts at once, asynchronously, and
//    backward goes on computing the gradients of earlier layers while it travels: that is the
//    overlap. Buckets are launched strictly in plan order (bucket b waits for b - 1), so every
//    rank issues the same collectives in the same order, whatever order its hooks fire in.
// 3. Finish. The first hook of an iteration queues a callback that runs when backward ends
//    (autograd::queue_callback): it waits for every bucket, divides by the world size, and the
//    gradients are in place for the optimizer. A parameter that got no gradient leaves its
//    bucket unlaunched: with find_unused_parameters the forward pass traced which parameters
//    the loss can reach and the others are marked ready (with zero gradients) up front; without
//    it, the callback raises an error naming them.
// 4. Rebuild. After the first iteration the plan is rebuilt once from the order in which
//    gradients really arrived on rank 0 (broadcast, so all ranks agree).
// no_sync() skips steps 2-3: gradients accumulate locally until a synchronised backward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "nn/module.h"

namespace loom::dist {

// A bucket as a communication hook sees it: the flat gradients of its parameters.
struct GradBucket {
  int index = 0;
  int count = 1;  // buckets in the plan: index count - 1 is the iteration's last
  Tensor buffer;  // 1-D, the parameters' gradients back to back
  const std::vector<std::string>* names = nullptr;  // the parameters, in buffer order
  std::vector<Tensor> gradients;  // the parameters' .grad: views of `buffer`, stored as they are
  std::vector<int64_t> offsets;   // where each starts in `buffer`
  bool is_last() const { return index == count - 1; }
};

// What a hook started: the communication's handle, and what to do once it completed so that
// `buffer` holds the sum over ranks of every rank's buffer (finish may be empty). The reducer
// then divides by the world size (Note [The bucketed reducer], step 3), unless `averaged` says
// that finish left the average already. A hook of several rounds (the 16-bit exchange, PowerSGD)
// sets `then` instead of finish: once `work` completed, the reducer calls it to launch the next
// round and takes the round it returns in this one's place, until a round has no `then`.
struct PendingReduction {
  std::shared_ptr<Work> work;
  std::function<void()> finish;
  std::function<PendingReduction()> then;
  bool averaged = false;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual PendingReduction start(ProcessGroup& group, GradBucket& bucket) = 0;
};

// allreduce(sum) in the buffer's dtype: the default.
std::shared_ptr<CommHook> allreduce_hook();

// Note [16-bit gradient communication]
// The gradients travel in float16 or bfloat16, half float32's bytes, summed one of two ways:
// - kFloat32 (the default): an all-to-all hands rank r piece r of every rank's 16-bit buffer;
//   rank r sums its N pieces in float32 and rounds the sum to 16 bits once; an all-gather of
//   the 16-bit sums gives every rank all of them. Each rank sends (N-1)/N of its 16-bit buffer
//   twice, (N-1)/N x 2 bytes per gradient in all: half of a float32 allreduce's 2 (N-1)/N x 4.
//   Two roundings per element whatever N: each gradient's to 16 bits, and the sum's.
// - kWire (PyTorch's fp16_compress_hook and bf16_compress_hook): each rank divides by N in
//   float32, rounds to 16 bits, and the 16-bit buffer is allreduced, the sums rounded to 16 bits
//   at every step of the ring: the same bytes, N roundings per element, and small gradients
//   divided by N sink into float16's subnormals (bfloat16 keeps float32's range).
// tests/dist/ddp_test.cpp measures both against the exact float64 average at 4 ranks: kFloat32's
// error is the smaller; docs/decisions.md has the figures.
enum class CompressedSum { kFloat32, kWire };
std::shared_ptr<CommHook> fp16_compress_hook(CompressedSum sum = CompressedSum::kFloat32);
std::shared_ptr<CommHook> bf16_compress_hook(CompressedSum sum = CompressedSum::kFloat32);

// For GradScaler::set_found_inf_agreement under DDP: an allreduce(max) of each rank's found-inf
// flag, so that every rank skips the same steps. `device` is where the flag travels (the
// parameters' device: a CUDA device for nccl).
std::function<bool(bool)> found_inf_agreement(std::shared_ptr<ProcessGroup> group,
                                              Device device = kCPU);

struct DDPOptions {
  int64_t first_bucket_bytes = int64_t{1} << 20;
  int64_t bucket_bytes = int64_t{25} << 20;
  bool broadcast_buffers = true;  // rank 0's buffers (running statistics) before each forward
  bool find_unused_parameters = false;
  bool rebuild_buckets = true;  // Note [The bucketed reducer], step 4
  // The dtype gradients travel in: float32 (allreduce_hook), or float16 / bfloat16 for half the
  // bytes (fp16_compress_hook / bf16_compress_hook: sums in float32). register_comm_hook
  // replaces the hook this chooses.
  DType comm_dtype = kFloat32;
};

// One bucket of the plan.
struct Bucket {
  std::vector<size_t> params;      // indices into the parameter list
  std::vector<std::string> names;  // their names, for comm hooks
  std::vector<int64_t> offsets;
  int64_t numel = 0;  // the buffer's elements: under ZeRO padded to a multiple of the world size
  DType dtype = kFloat32;
  Tensor buffer;  // under ZeRO-2 only while a backward fills it (Note [ZeRO stages])
  // Under ZeRO: this rank's piece of the averaged gradients, numel / world size elements (a view
  // of piece `rank` of the buffer in stage 1, a buffer of its own in stage 2).
  Tensor shard;
  int64_t bytes() const { return numel * static_cast<int64_t>(itemsize(dtype)); }
};

// What the last synchronised backward did, for reports: per bucket, when its allreduce was
// launched and when it completed, relative to the start of backward (the first hook).
struct ReducerTimeline {
  double start = 0;             // the first hook, in steady-clock seconds
  double backward_seconds = 0;  // first hook to the end-of-backward callback
  std::vector<double> launched, completed;
  // The share of the communication time that passed while backward was still computing.
  double overlap() const;
};

class Reducer {
 public:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> group, DDPOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by DDP's forward when a backward will follow: resets the iteration and, with
  // find_unused_parameters, finds the parameters `output` does not depend on.
  void prepare_for_backward(const Tensor& output);
  void set_require_sync(bool on) { require_sync_ = on; }
  bool require_sync() const { return require_sync_; }
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  const CommHook& comm_hook() const { return *hook_; }

  // ZeRO-1 and ZeRO-2 (Note [ZeRO stages], dist/zero.h; ZeroRedundancyOptimizer calls it): from
  // now on every bucket is padded to a multiple of the world size and reduce-scattered instead
  // of allreduced, so that after backward each rank holds only its piece of the averaged
  // gradients, in Bucket::shard (the rest of a stage-1 buffer keeps this rank's own gradients).
  // Stage 2 also keeps no full gradient: a bucket's buffer exists from its first gradient until
  // its reduce-scatter completed, and the parameters' .grad are left undefined. The plan is not
  // rebuilt from the arrival order, and comm hooks do not apply. ValueError for another stage,
  // after the first backward, or with a comm hook registered.
  void shard_gradients(int stage);
  int zero_stage() const { return zero_stage_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  ProcessGroup& group() const { return *group_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The plan as a table: bucket, size, parameters (names and shapes).
  std::string plan() const;
  const ReducerTimeline& timeline() const { return timeline_; }
  int64_t iterations() const { return iterations_; }

 private:
  void build_buckets(const std::vector<size_t>& order);
  void make_buffer(Bucket& bucket);  // the flat buffer and its parameters' .grad views
  void release_reduced_buffers();    // ZeRO-2: the buffers whose reduce-scatter completed
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void finalize();

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<CommHook> hook_;
  std::vector<int> hook_handles_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, position in bucket)
  std::vector<Tensor> views_;                     // param -> its view into a bucket buffer

  // The iteration in flight.
  bool require_sync_ = true;
  bool expecting_backward_ = false, callback_queued_ = false;
  std::vector<bool> ready_;
  std::vector<size_t> pending_;  // per bucket: parameters not yet ready
  size_t next_launch_ = 0;
  std::vector<PendingReduction> inflight_;
  size_t released_upto_ = 0;  // ZeRO-2: buckets before this one have freed their buffers
  int zero_stage_ = 0;
  std::vector<size_t> unused_;
  std::vector<size_t> arrival_;  // the order of the first iteration's gradients
  int64_t iterations_ = 0;
  bool rebuilt_ = false;
  double backward_start_ = 0;
  ReducerTimeline timeline_;
};

class DistributedDataParallel : public nn::Module {
 public:
  // Broadcasts rank 0's parameters and buffers, plans the buckets and hooks the parameters.
  DistributedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});

  Tensor forward(const Tensor& input) override;
  nn::Module& module() { return *module_; }
  const nn::ModulePtr& module_ptr() const { return module_; }
  ProcessGroup& group() { return *group_; }
  Reducer& reducer() { return *reducer_; }

  // While the guard lives, backward passes accumulate gradients locally (no communication);
  // the next backward outside it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(Reducer& r) : reducer_(r), previous_(r.require_sync()) {
      r.set_require_sync(false);
    }
    ~NoSync() { reducer_.set_require_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] std::unique_ptr<NoSync> no_sync() { return std::make_unique<NoSync>(*reducer_); }

  void register_comm_hook(std::shared_ptr<CommHook> hook) {
    reducer_->register_comm_hook(std::move(hook));
  }
  std::string bucket_plan() const { return reducer_->plan(); }

 private:
  void sync_buffers();

  nn::ModulePtr module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

// Every tensor of `tensors` from rank `root`, coalesced into one flat buffer per dtype.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root = 0);

// Checks that every rank's `state` (a model's parameters and buffers) holds as many tensors as
// rank 0's, each with the same shape, dtype, memory format and requires_grad: the broadcast of
// rank 0's state and the buckets read them as flat bytes, and the buckets hold the parameters
// that take gradients, so replicas stored differently would exchange permuted values without an
// error, and replicas frozen differently would plan different buckets. One allgather of a count and
// a hash (a second, of each tensor's description, only where they differ); every rank raises the
// same ValueError, naming the first tensor that differs. DistributedDataParallel's constructor
// calls it, as PyTorch's verifies the parameters' shapes across processes.
void verify_replicas(ProcessGroup& group, const NamedTensors& state);

}  // namespace loom::dist
