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
// element a bucket more than Psi / N. Under autocast (--amp bf16 or fp16) loom keeps float32
// parameters and casts them as the ops run: its model states are the float32 column's; FSDP's
// gathered units (stage 3) are transient and count as activations (the step's peak), not here.
//
// Note [The memory planner]
// A rank's peak in a training step is its model states (above) plus the step's peak beyond
// them: the figure --print-memory measures as "weights + gradients + optimizer state + step
// peak" (Note [The memory report]), in a step after the first (the optimizer state exists).
// The planner estimates that step peak in two parts:
//   activations  what autograd saves for backward and the temporaries alive with it, from a
//                dry run: one forward and backward of the real model on this process's CPU,
//                float32 or under autocast as asked, with the weights and the gradients held
//                (as DDP's buckets hold them), at two small batches. The counters of
//                tensor/storage.h give the peak above what was held before it, in intervals:
//                the forward, then the time before each parameter's gradient arrives, then the
//                rest of backward. Each interval's peak is a line through the two batches (a
//                constant part: autocast's 16-bit copies of the weights, the embedding's
//                gradient; a part per sample: everything else), evaluated at the per-rank batch,
//                global batch / N. The activations are the largest interval.
//   transient    the strategy's own buffers, placed on the same intervals from the order the
//                gradients arrived in the dry run, as ddp.cpp, zero.cpp and fsdp.cpp make them:
//                  DDP      none (the buckets are the gradients; gloo's allreduce keeps its
//                           scratch outside loom's allocator);
//                  ZeRO-1   the running reduce-scatter's two pieces (Note [Ring reduce-scatter]),
//                           2 b / N for a bucket of b bytes, from the bucket's launch to the next;
//                  ZeRO-2   that, and each bucket's full buffer from its first gradient until the
//                           reduce-scatter after its own has been launched (a bucket is released
//                           once its reduce-scatter completed, checked at each launch);
//                  ZeRO-3   the root unit's full parameters all along; in forward the largest
//                           unit; in backward each unit from its pre-backward gather (the unit
//                           after it in forward order prefetches it) to its last gradient, its
//                           flat gradient buffer from its first gradient to the end of backward,
//                           and its reduce-scatter's two pieces.
//                The step peak is the largest interval of activations + transient; the
//                transient column is that peak less the activations.
// Activation checkpointing (GPT only: GPT::set_gradient_checkpointing) gets its own dry run.
// The planner leaves out what the memory report calls buffers and other held: batch norm's
// running statistics, the data set and the loader's batches.
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

// "2GiB", "512MiB", "1.5GB", "1000000" (bytes): binary units KiB, MiB, GiB, TiB, decimal kB, MB,
// GB, TB, case-insensitive. ValueError for anything else, or a size that is not positive.
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
  // The dry run's two batches; {0, 0}: ResNet {2, 4}, GPT {1, 2}.
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
  double forward = 0;            // the peak of forward and loss
  std::vector<double> backward;  // [k]: before the k-th gradient arrives; the last: after all
  std::vector<size_t> arrivals;  // parameter indices, in the order their gradients arrived
  double peak() const;
};

// The dry runs of a model at its two probe batches, and the line through them.
struct DryRun {
  ModelLayout layout;
  bool checkpointing = false;
  ActivationProfile low, high;
  // The profile at any batch: each interval on the line through low and high (never below 0).
  ActivationProfile at(int64_t batch) const;
};

// Builds the model (from a fixed seed; the default generator's state is restored after) and
// measures one step at `batch`: forward, loss, backward, on the CPU, under autocast for 16-bit
// precisions. Resets the CPU's peak counter (and leaves it reset). ValueError for checkpointing
// a ResNet.
ActivationProfile measure_step(const PlanModel& model, Precision precision, bool checkpointing,
                               int64_t batch);
DryRun dry_run(const PlanModel& model, Precision precision, bool checkpointing,
               std::pair<int64_t, int64_t> batches);

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

// A strategy's row for a dry run at `world` ranks and `per_rank_batch`; K bytes of optimizer
// state a parameter. The arithmetic of Note [The memory planner], no measurement.
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

// The plan: the dry runs (the model's own, and with checkpointing for a GPT), then the rows and
// the recommendation. Errors of PlanRequest::validate.
MemoryPlan plan_memory(const PlanRequest& request);
// The same from dry runs already made (`checkpointed` null for a ResNet): no measurement.
MemoryPlan plan_memory(const PlanRequest& request, const DryRun& plain, const DryRun* checkpointed);

// The table (MiB per kind and strategy) and the recommendation, as loomplan prints them.
std::string format_plan(const MemoryPlan& plan);

}  // namespace loom::dist
