// dist/fsdp.h — FullyShardedDataParallel: ZeRO stage 3 (Note [ZeRO stages], zero.h), the
// parameters sharded too. Each unit of the model (a Transformer block, a ResNet stage) keeps
// one flat shard of its parameters per rank; its full parameters exist only around its forward
// and its backward.
//
// Note [FSDP units]
// 1. Units. A policy picks modules (by default GPT-2's blocks and ResNet's stages); each becomes
//    a unit holding the parameters under it, and the root unit holds the rest (embeddings, the
//    last norm, the stem, the head). A unit's parameters are laid end to end in one flat buffer,
//    padded to a multiple of N; each parameter is a view of it. Rank r keeps piece r, its shard
//    (float32, the master copy the optimizer updates), and the flat buffer's memory is released
//    (Note [Released storage], tensor/storage.h): the parameters still point at it.
// 2. Forward. Before a unit's forward (a forward pre-hook, Module::operator()) its flat buffer is
//    restored and all-gathered from every rank's shard; the next unit's all-gather is started at
//    once (prefetch), so that it travels while this unit computes. After its forward the
//    memory is released again, although autograd saved aliases of the weights: they point at the
//    storage, which backward refills. The root is gathered for the whole forward and backward.
// 3. Backward. An identity node on each unit's output runs when its output's gradient arrives,
//    before any of the unit's backward: it all-gathers the unit again (waiting for the prefetch
//    started by the unit after it) and starts the previous unit's all-gather. Each parameter's
//    gradient goes into the unit's flat gradient buffer as it arrives; when the last has
//    arrived the buffer is reduce-scattered into this rank's gradient shard (asynchronously,
//    while backward goes on) and the unit's parameters are released. At the end of backward
//    the shards are divided by N and the flat gradient buffers freed. Backward passes add into
//    the shards (gradient accumulation over micro-batches, each reduce-scattered) until the
//    optimizer's zero_grad drops the pieces' gradients.
// 4. Traffic: an all-gather of each unit in forward and again in backward, a reduce-scatter in
//    backward: 3 (N-1)/N Psi bytes a rank, the paper's 1.5 times DDP's 2 (N-1)/N Psi; the root,
//    gathered once (as PyTorch's FSDP does: it is needed at both ends of backward), saves one
//    of its all-gathers.
// 5. A checkpointed unit (GPT::set_gradient_checkpointing) runs its forward again in backward:
//    that forward keeps its gather for the backward that follows at once.
//
// Note [FSDP mixed precision]
// With FSDPOptions::param_dtype (gpt_train and resnet18_cifar set it to bf16 or fp16 with
// --zero 3 --amp): each unit's shard is kept in float32, the master copy, and narrowed to the
// 16-bit dtype for its all-gather, so the gathered flat buffer, the parameters viewing it and
// their gradients are 16-bit; the unit's gradient buffer is reduce-scattered in 16 bits and the
// result widened into the float32 gradient shard, where the 1/N average is taken. The wire
// carries half the bytes; the model states are the ZeRO table's 16-bit column, 16 Psi / N a
// rank, held as a float32 shard, a float32 gradient shard and the optimizer's m and v (the
// shard is the master copy: 4 + 4 + 8 where the table counts 2 + 2 + 12). A forward under
// autocast then runs its float32-policy ops (norms, losses) on widened 16-bit weights. Writes
// made inside summon_full_params reach the shard (narrowed values) only for a unit whose
// gathered buffer was written: an untouched unit keeps its float32 master as it was.
// The optimizer takes this rank's pieces (ShardPiece, as ZeroRedundancyOptimizer's: one per
// parameter and unit), so per-parameter options carry over; any elementwise optimizer works.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "dist/zero.h"
#include "nn/module.h"

namespace loom::dist {

// Whether a module (named as in named_modules) is a unit of its own.
using UnitPolicy = std::function<bool(const std::string& name, const nn::Module& module)>;
// GPT-2's blocks ("GPT2Block") and the four stages of a ResNet ("layer1" .. "layer4").
bool transformer_block_or_resnet_stage(const std::string& name, const nn::Module& module);

struct FSDPOptions {
  UnitPolicy units = transformer_block_or_resnet_stage;
  bool prefetch = true;  // Note [FSDP units], steps 2 and 3
  // Rank 0's buffers (batch norm's running statistics) before each training forward, as
  // DDPOptions::broadcast_buffers: every rank then evaluates as DDP's would.
  bool broadcast_buffers = true;
  // Mixed precision as PyTorch's FSDP MixedPrecision(param_dtype = reduce_dtype): the gathered
  // parameters, hence the forward and backward, and the gradients' reduce-scatter in this dtype
  // (bfloat16 or float16); the shards stay in the parameters' own dtype, the master copy the
  // optimizer updates, with their gradients (Note [FSDP mixed precision]). Unset: the
  // parameters' dtype throughout.
  std::optional<DType> param_dtype = std::nullopt;
};

// What the last training step's collectives did, for reports and traces: each unit's all-gathers
// (forward, prefetches included, and backward) and reduce-scatter, from launch to completion, in
// seconds after the step's forward began (steady clock `start`), and when backward began and
// ended.
struct FSDPTimeline {
  struct Event {
    std::string what;  // "allgather layer1", "reduce_scatter layer1"
    double launched = 0, completed = 0;
  };
  double start = 0;  // steady-clock seconds at the training forward
  double backward_start = 0, backward_end = 0;
  std::vector<Event> events;
  double backward_seconds() const { return backward_end - backward_start; }
  // The share of the reduce-scatters' time that passed while backward still computed, as
  // ReducerTimeline::overlap.
  double overlap() const;
};

class FullyShardedDataParallel : public nn::Module {
 public:
  // Broadcasts rank 0's parameters and buffers (after checking the replicas agree, as DDP),
  // then shards every parameter that requires grad. ValueError when the policy picks nothing
  // that holds parameters, or picks a module inside another unit.
  FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                           FSDPOptions options = {});
  ~FullyShardedDataParallel() override;

  Tensor forward(const Tensor& input) override;
  nn::Module& module() { return *module_; }
  ProcessGroup& group() { return *group_; }

  // This rank's pieces of the parameters, for the optimizer (leaves of 1-D float tensors whose
  // gradients are views of the averaged gradient shards), and whose each is.
  const std::vector<Tensor>& optimizer_params() const { return piece_tensors_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }  // bucket = unit
  // The sharded parameters (those that require grad), in the module's order, and their names.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // clip_grad_norm_ over the whole model (the squares summed over ranks), as ZeRO's.
  double clip_grad_norm_(double max_norm);

  // While the guard lives every unit is gathered: the parameters can be read (to save or check
  // them, or to evaluate the model: a forward then releases nothing) and written back (written
  // values reach the shards when the last guard ends).
  class FullParams {
   public:
    explicit FullParams(FullyShardedDataParallel& fsdp);
    ~FullParams();
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
  };
  [[nodiscard]] std::unique_ptr<FullParams> summon_full_params() {
    return std::make_unique<FullParams>(*this);
  }

  // The units as a table: name, parameters, elements (padded), this rank's shard.
  std::string plan() const;
  const FSDPTimeline& timeline() const { return timeline_; }
  size_t num_units() const { return units_.size(); }
  // Bytes this rank keeps between steps: the parameter shards and the gradient shards, and
  // each alone.
  int64_t shard_bytes() const { return parameter_shard_bytes() + gradient_shard_bytes(); }
  int64_t parameter_shard_bytes() const;
  int64_t gradient_shard_bytes() const;
  // Each unit's elements (padded), the root last.
  std::vector<int64_t> unit_numels() const;

 private:
  struct Unit {
    std::string name;               // "" for the root
    nn::Module* module = nullptr;   // null for the root
    std::vector<size_t> params;     // indices into params_
    std::vector<int64_t> offsets;   // of each in the flat buffer
    int64_t numel = 0;              // padded to a multiple of N
    Tensor full;                    // the flat parameters, released when not gathered
    Tensor shard, shard_grad;       // this rank's piece: the master copy and its gradient
    Tensor shard_low;               // mixed precision: the shard narrowed, while it is gathered
    uint64_t gathered_version = 0;  // the flat buffer's version once summoned
    Tensor grad_full;               // during backward, until reduce-scattered
    Tensor reduced;  // its reduce-scatter's output: shard_grad, or a buffer to add into it
    std::shared_ptr<Work> gather, reduce;
    size_t gather_event = 0, reduce_event = 0;  // their places in the timeline
    bool gathered = false;
    size_t pending = 0;  // parameters whose gradient has not arrived in this backward
    std::vector<int> hook_handles;
  };

  void gather(size_t u, bool wait);
  void settle_gather(Unit& unit);  // waits for its gather, timed in the timeline
  void release(size_t u);
  void pre_backward(size_t u);
  void on_gradient(size_t i);
  void reduce_unit(size_t u);
  void finalize();
  Tensor attach_pre_backward(const Tensor& output, size_t u);
  void write_back_shards();   // FullParams: the gathered parameters into the shards
  void attach_shard_grads();  // each piece's .grad: its run of its unit's gradient shard

  nn::ModulePtr module_;
  std::shared_ptr<ProcessGroup> group_;
  FSDPOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (unit, position)
  std::vector<Unit> units_;                       // the root last
  std::vector<Tensor> piece_tensors_;
  std::vector<ShardPiece> pieces_;
  std::vector<int> param_hooks_;

  bool expecting_backward_ = false, callback_queued_ = false, accumulating_ = false;
  int summoned_ = 0;        // FullParams guards alive
  bool recording_ = false;  // a training step's collectives go into timeline_
  FSDPTimeline timeline_;
};

}  // namespace loom::dist
