// dist/memory_plan.h — what each data-parallel strategy keeps on a rank: the ZeRO paper's
// arithmetic of model states (Note [ZeRO stages], dist/zero.h) as loom lays them out, for the
// memory report (which prints it beside what it measured), and the planner (loomplan) that adds
// the activations of a dry run and recommends a strategy for a device's memory.
//
// Note [Model-state arithmetic]
// Psi parameters over N ranks; w bytes a weight (4 in float32; 2 where the model itself is
// 16-bit), g bytes a gradient (as the weights), and K bytes of optimizer state a parameter:
// Adam's m and v 8, SGD's momentum 4 (0 without), plus 4 for a float32 master copy where the
// weights are 16-bit. Per rank:
//                 weights     gradients    optimizer state
//   DDP           w Psi       g Psi        K Psi
//   ZeRO-1        w Psi       g Psi        K Psi / N
//   ZeRO-2        w Psi       g Psi / N    K Psi / N
//   ZeRO-3        w Psi / N   g Psi / N    K Psi / N
// loom's shards cut the flat buckets (stages 1 and 2) or units (stage 3) into N equal pieces,
// each padded to a multiple of N elements: a shard is ceil(numel / N) elements, up to one
// element a bucket more than Psi / N. Under autocast (--amp bf16 or fp16) DDP keeps float32
// parameters and casts them as the ops run: its model states are the float32 column's; how the
// apps lay out the ZeRO stages in 16 bits is Note [The planner's dry runs]. FSDP's gathered
// units (stage 3) are transient and count in the step's peak (Note [The memory planner]), not
// here.
//
// Note [The memory planner]
// A rank's peak in a training step is its model states (above) plus the step's peak beyond
// them: the figure --print-memory measures as "weights + gradients + optimizer state + step
// peak" (Note [The memory report]), in a step after the first (in the first, the optimizer
// state does not exist yet during forward and backward). The planner estimates the step peak
// in two parts, on intervals of one step:
//   activations  what autograd saves for backward and the temporaries alive with it, from a
//                dry run: one forward and backward of the real model on this process's CPU,
//                float32 or under autocast as asked, its weights in the dtype the strategy keeps
//                them in (Note [The planner's dry runs]) and held with their gradients (as DDP's
//                buckets hold them), at two small batches (2 and 4). The counters of
//                tensor/storage.h give the peak above what was held before the step, interval
//                by interval: in forward before, during and after each FSDP unit; in backward
//                before each parameter's gradient arrives, and after the last. Each interval's
//                peak is a line through the two batches (a constant part: autocast's 16-bit
//                copies of the weights, a tied embedding's gradient; a part per sample:
//                everything else), evaluated at the per-rank batch, global batch / N. The
//                activations column is the largest interval.
//   transient    each strategy's own buffers, placed on the same intervals (by the order the
//                gradients arrived in the dry run) as ddp.cpp, zero.cpp and fsdp.cpp make them:
//                  DDP      none: the buckets are the gradients, and gloo's allreduce keeps its
//                           scratch outside loom's allocator;
//                  ZeRO-1   the ring reduce-scatter's two pieces (Note [Ring reduce-scatter]),
//                           2 b / N for a bucket of b bytes, from the bucket's launch to the next
//                           launch (the ring often ends sooner: an upper bound);
//                  ZeRO-2   that, and each bucket's full buffer from its first gradient to the
//                           launch after its own (the reducer frees a buffer there, once its
//                           reduce-scatter completed);
//                  ZeRO-3   the root unit's full parameters throughout; in forward unit 0
//                           (prefetched), then each unit and the next (prefetched) during its
//                           forward; in backward each unit from the pre-backward of the unit
//                           after it (which prefetches it; for a checkpointed unit that comes
//                           after its recomputation) to its last gradient, each unit's flat
//                           gradient buffer from its first gradient to the end of backward (4 Psi
//                           in all by then), the reduce-scatters' pieces as in ZeRO-1, and, in
//                           16 bits, each reduce-scatter's output until the end of backward.
//                The step peak is the largest interval of activations + transient; the
//                transient column is that peak less the activations.
// Activation checkpointing (GPT only: GPT::set_gradient_checkpointing) gets its own dry run.
// Left out, as the memory report counts them apart: batch norm's running statistics, the data
// set and the loader's batches. On real ranks (tests/dist/memory_plan_test.cpp) the totals
// come within a few percent of the measured peak; where the units are large beside the
// activations, the reduce-scatters' timing moves the measured ZeRO-3 peak by some 5-10% from
// run to run.
//
// Note [Choosing a strategy]
// The seeds' decision tree, on the per-rank totals at the device's memory M:
//   1. DDP fits (its total <= M): DDP, the least communication;
//   2. DDP over by less than 2x: ZeRO-2 (optimizer state and gradients sharded), if it fits;
//   3. otherwise ZeRO-3 with activation checkpointing (for a ResNet, ZeRO-3: loom checkpoints
//      only GPT's blocks), if it fits;
//   4. nothing fits: the plan says so, and what would: the fewest ranks that make step 3 fit at
//      the same global batch, and the largest per-rank batch that fits on these ranks (the
//      global batch then comes from gradient accumulation).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "nn/resnet.h"
#include "tensor/dtype.h"

namespace loom::dist {

struct ModelStateBytes {
  double weights = 0, gradients = 0, optimizer_state = 0;
  double total() const { return weights + gradients + optimizer_state; }
};

struct ModelStateShape {
  int64_t params = 0;    // Psi
  int world = 1;         // N
  int weight_bytes = 4;  // w (and g)
  int state_bytes = 8;   // K: optimizer state a parameter, the master copy included
};

// The table of Note [Model-state arithmetic] for a stage (0 is DDP, 1 to 3 ZeRO). ValueError for
// another stage, a world below 1 or negative sizes.
ModelStateBytes model_state_bytes(int stage, const ModelStateShape& shape);

// K for an optimizer by name ("sgd" with or without momentum, "adam", "adamw"), plus the
// float32 master copy when the weights are 16-bit. ValueError for an unknown name.
int optimizer_state_bytes(const std::string& optimizer, bool momentum, bool master_copy);

// "DDP", "ZeRO-1", ... for a stage.
std::string strategy_name(int stage);

// ------------------------------------------------------------------ the planner

enum class Precision { kFloat32, kBFloat16, kFloat16 };
// "fp32", "bf16" or "fp16" (ValueError otherwise), and back.
Precision parse_precision(const std::string& name);
std::string precision_name(Precision precision);

// "2GiB", "512MiB", "1.5GB", "1000000" (bytes), as parse_memory_size (tensor/memory_limit.h)
// reads LOOM_MAX_MEMORY. ValueError for anything else, or a size that is not positive.
int64_t parse_byte_size(const std::string& text);

// The model a plan is for: ResNet-18 (the CIFAR stem, as resnet18_cifar builds it) on square
// images, or a GPT.
struct PlanModel {
  enum class Kind { kResNet18, kGPT };
  Kind kind = Kind::kResNet18;
  nn::ResNetOptions resnet;  // width, in_channels, num_classes
  int64_t image_size = 32;   // resnet18_cifar's: CIFAR-10, and Fashion-MNIST padded to 32
  nn::GPTConfig gpt;
  // "ResNet-18 (width 16, 1 channel, 10 classes, 32x32 images)", "GPT (4 layers, ...)".
  std::string describe() const;
  // ValueError naming the bad size.
  void validate() const;
  // The model as the apps build it, in float32 from the default generator, with GPT's
  // activation checkpointing on when asked (ValueError for a ResNet).
  nn::ModulePtr build(bool checkpointing = false) const;
};

// The model a checkpoint describes: a GPT file (loom.gpt.config in its metadata, or a
// config.json beside it, as load_gpt reads) or a resnet18_cifar checkpoint (model, width,
// in_channels, num_classes). IOError for an unreadable file, ValueError for one that says
// neither.
PlanModel plan_model_from_checkpoint(const std::string& path);

struct PlanRequest {
  PlanModel model;
  int64_t global_batch = 0;  // samples (GPT: windows of block_size tokens) a step, all ranks
  int world = 1;             // N
  Precision precision = Precision::kFloat32;
  std::string optimizer = "adamw";  // sgd, adam, adamw
  bool momentum = true;             // SGD's
  int64_t device_memory = 0;        // bytes a rank may use
  // The dry run's two batches; {0, 0}: {2, 4} (at 1 some kernels take other paths).
  std::pair<int64_t, int64_t> probe_batches = {0, 0};
  // ValueError for a batch that does not split evenly over the ranks, a world below 1, memory
  // that is not positive, an unknown optimizer, probe batches that are not two distinct
  // positive numbers, or a bad model.
  void validate() const;
};

// The parameters as the strategies group them (those that require grad, in registration order).
struct ModelLayout {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  // FullyShardedDataParallel's units by its default policy (transformer_block_or_resnet_stage),
  // in forward order, the root last; unit_of[i] is parameter i's.
  std::vector<std::string> unit_names;
  std::vector<int> unit_of;
  // DistributedDataParallel's buckets (DDPOptions' caps, parameters in reverse registration
  // order), each a list of parameter indices.
  std::vector<std::vector<size_t>> buckets;
  int64_t params() const;
};
ModelLayout model_layout(nn::Module& model);

// One dry run (Note [The memory planner]): bytes above the held weights and gradients.
struct ActivationProfile {
  int64_t batch = 0;
  // The forward, cut at each FSDP unit's start and end: before unit 0, during unit 0, after
  // it, ..., after the last unit (and the loss): 2 U + 1 intervals for U units (the root apart).
  std::vector<double> forward;
  std::vector<double> backward;  // [k]: before the k-th gradient arrives; the last: after all
  std::vector<size_t> arrivals;  // parameter indices, in the order their gradients arrived
  double peak() const;
};

// The dry runs of a model at its two probe batches, and the line through them.
struct DryRun {
  ModelLayout layout;
  bool checkpointing = false;
  DType weights = kFloat32;  // the model's dtype in the run (Note [The planner's dry runs])
  ActivationProfile low, high;
  // The profile at any batch: each interval on the line through low and high (never below 0).
  ActivationProfile at(int64_t batch) const;
};

// Builds the model (from a fixed seed; the default generator's state is restored after) with
// `weights` of that dtype, and measures one step at `batch`: forward, loss, backward, on the
// CPU, under autocast for 16-bit precisions. Resets the CPU's peak counter (and leaves it
// reset). ValueError for checkpointing a ResNet, or 16-bit weights in float32 precision.
ActivationProfile measure_step(const PlanModel& model, Precision precision, bool checkpointing,
                               int64_t batch, DType weights = kFloat32);
DryRun dry_run(const PlanModel& model, Precision precision, bool checkpointing,
               std::pair<int64_t, int64_t> batches, DType weights = kFloat32);

// Note [The planner's dry runs]
// Each strategy's row takes the dry run of the model as loom's apps lay it out for it:
//   DDP                      float32 weights (autocast for bf16 and fp16);
//   ZeRO-1 and ZeRO-2        the same, but under bf16 the model itself is bfloat16, with
//                            float32 masters of each rank's pieces (Note [ZeRO with a 16-bit
//                            model]): weights and gradients 2 bytes, K + 4 of optimizer state;
//   ZeRO-3                   float32 shards; under bf16 and fp16 the units are gathered, and
//                            their gradients reduced, in 16 bits (Note [FSDP mixed precision]).
// The dry run of 16-bit weights differs in its activations too: autocast has no copies of the
// weights to make. Which dtype a row takes, by stage and precision:
DType plan_weights(int stage, Precision precision);

// One strategy's bytes on a rank.
struct StrategyRow {
  int stage = 0;  // 0 DDP, 1-3 ZeRO
  bool checkpointing = false;
  bool applicable = true;  // false: activation checkpointing of a ResNet (n/a)
  ModelStateBytes states;
  double activations = 0;  // the dry run's, at the per-rank batch
  double transient = 0;    // the strategy's own buffers at the step's peak
  bool fits = false;
  double total() const { return states.total() + activations + transient; }
};

// A strategy's row for a dry run (of plan_weights' dtype) at `world` ranks and `per_rank_batch`;
// K bytes of optimizer state a parameter (the optimizer's own: the master copy is added here).
// The arithmetic of Note [The memory planner], no measurement.
StrategyRow plan_strategy(const DryRun& run, int stage, int world, int64_t per_rank_batch,
                          int state_bytes, int64_t device_memory);

struct Recommendation {
  bool fits = false;
  int stage = 0;
  bool checkpointing = false;
  std::string reason;  // the branch of Note [Choosing a strategy] and the figures behind it
  std::string advice;  // when nothing fits: the ranks or the batch that would
};

struct MemoryPlan {
  PlanRequest request;
  int64_t params = 0;
  int64_t per_rank_batch = 0;
  int state_bytes = 0;  // K
  std::pair<int64_t, int64_t> probe_batches;
  std::vector<StrategyRow> rows;  // DDP, ZeRO-1, 2, 3; each without, then with checkpointing
  Recommendation recommendation;
  const StrategyRow& row(int stage, bool checkpointing) const;
};

// The plan: the dry runs (Note [The planner's dry runs], each also with checkpointing for a
// GPT), then the rows and the recommendation. Errors of PlanRequest::validate.
MemoryPlan plan_memory(const PlanRequest& request);
// The same from dry runs already made: no measurement. `runs` holds one for each (weights,
// checkpointing) the rows need (ValueError naming a missing one).
MemoryPlan plan_memory(const PlanRequest& request, const std::vector<DryRun>& runs);

// The table (MiB per kind and strategy) and the recommendation, as loomplan prints them.
std::string format_plan(const MemoryPlan& plan);

}  // namespace loom::dist
