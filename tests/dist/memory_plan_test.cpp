// tests/dist/memory_plan_test.cpp — the planner (Note [The memory planner], Note [Choosing a
// strategy]): the model-state table, each strategy's row on a hand-made dry run (exact), the
// decision tree at its boundaries, the dry run's activations linear in the batch and close to a
// step measured directly, checkpoints that name their model, bad input; and, on 2 and 4 real
// ranks, each strategy's total against the peak a rank measures in its training steps.

#include "dist/memory_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/multiprocess.h"
#include "dist/zero.h"
#include "loom.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace loom::dist {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// ------------------------------------------------------------------ model states

TEST(MemoryPlan, ModelStatesFollowTheZeroTable) {
  // Psi = 1000 float32 parameters on 4 ranks, Adam (K = 8).
  const ModelStateShape shape{.params = 1000, .world = 4, .weight_bytes = 4, .state_bytes = 8};
  const double expected[4][3] = {
      {4000, 4000, 8000}, {4000, 4000, 2000}, {4000, 1000, 2000}, {1000, 1000, 2000}};
  for (int stage = 0; stage <= 3; ++stage) {
    const ModelStateBytes b = model_state_bytes(stage, shape);
    EXPECT_EQ(b.weights, expected[stage][0]) << strategy_name(stage);
    EXPECT_EQ(b.gradients, expected[stage][1]) << strategy_name(stage);
    EXPECT_EQ(b.optimizer_state, expected[stage][2]) << strategy_name(stage);
  }
  // Mixed precision with a 16-bit model (the paper's 16 Psi at DDP, 16 Psi / N at stage 3).
  const ModelStateShape half{.params = 1000, .world = 4, .weight_bytes = 2, .state_bytes = 12};
  EXPECT_EQ(model_state_bytes(0, half).total(), 16000);
  EXPECT_EQ(model_state_bytes(3, half).total(), 4000);
  EXPECT_EQ(optimizer_state_bytes("adamw", false, false), 8);
  EXPECT_EQ(optimizer_state_bytes("adam", true, true), 12);
  EXPECT_EQ(optimizer_state_bytes("sgd", true, false), 4);
  EXPECT_EQ(optimizer_state_bytes("sgd", false, false), 0);
  EXPECT_THROW(optimizer_state_bytes("lamb", true, false), ValueError);
  EXPECT_THROW(model_state_bytes(4, shape), ValueError);
  EXPECT_THROW(model_state_bytes(0, {.params = 10, .world = 0}), ValueError);
}

// ------------------------------------------------------------------ rows of a hand-made run

// Three parameters: p0 in unit h.0 (1000 elements), p1 in unit h.1 (1000), p2 in the root (500);
// buckets {p2, p1} and {p0}; gradients arriving p2, p1, p0. Activations at batch b: forward
// intervals (before, during and after h.0, during and after h.1) 100 b, 900 b, 300 b, 1000 b,
// 500 b; backward intervals 1000 b + 200, 800 b, 400 b, 100 b.
DryRun three_parameter_run() {
  DryRun run;
  run.layout.names = {"h.0.w", "h.1.w", "head.w"};
  run.layout.numels = {1000, 1000, 500};
  run.layout.unit_names = {"h.0", "h.1", ""};
  run.layout.unit_of = {0, 1, 2};
  run.layout.buckets = {{2, 1}, {0}};
  run.low = {.batch = 1,
             .forward = {100, 900, 300, 1000, 500},
             .backward = {1200, 800, 400, 100},
             .arrivals = {2, 1, 0}};
  run.high = {.batch = 2,
              .forward = {200, 1800, 600, 2000, 1000},
              .backward = {2200, 1600, 800, 200},
              .arrivals = {2, 1, 0}};
  return run;
}

TEST(MemoryPlan, EachStrategysRowIsItsArithmetic) {
  const DryRun run = three_parameter_run();
  const ActivationProfile at4 = run.at(4);
  EXPECT_EQ(at4.forward, (std::vector<double>{400, 3600, 1200, 4000, 2000}));
  EXPECT_EQ(at4.backward, (std::vector<double>{4200, 3200, 1600, 400}));
  // Psi = 2500 on 2 ranks, K = 8, batch 4 a rank: activations 4200 (the first interval).
  const int64_t lots = int64_t{1} << 40;
  struct Expected {
    double weights, gradients, state, transient;
  };
  const Expected expected[4] = {
      // DDP: nothing beyond the gradients it holds.
      {10000, 10000, 20000, 0},
      // ZeRO-1: the ring's two pieces of bucket {p2, p1} (6000 B / 2 ranks, twice) after its
      // launch at p1's gradient: interval 2, 1600 + 6000 = 7600.
      {10000, 10000, 10000, 7600 - 4200},
      // ZeRO-2: also the buffers: {p2, p1} (6000) in intervals 1-2, {p0} (4000) in 3; interval
      // 2 holds 6000 + 6000 over 1600.
      {10000, 5000, 10000, 13600 - 4200},
      // ZeRO-3: the root (2000) all along; backward interval 2 holds h.0 gathered (4000), the
      // flat gradients of h.1 and the root (6000) and h.1's reduce-scatter (4000): 1600 +
      // 16000, above forward's most, 3600 + 10000 during h.0 (h.1 prefetched).
      {5000, 5000, 10000, 17600 - 4200},
  };
  for (int stage = 0; stage <= 3; ++stage) {
    const StrategyRow row = plan_strategy(run, stage, 2, 4, 8, lots);
    SCOPED_TRACE(strategy_name(stage));
    EXPECT_EQ(row.states.weights, expected[stage].weights);
    EXPECT_EQ(row.states.gradients, expected[stage].gradients);
    EXPECT_EQ(row.states.optimizer_state, expected[stage].state);
    EXPECT_EQ(row.activations, 4200);
    EXPECT_EQ(row.transient, expected[stage].transient);
    EXPECT_EQ(row.total(), expected[stage].weights + expected[stage].gradients +
                               expected[stage].state + 4200 + expected[stage].transient);
    EXPECT_TRUE(row.fits);
    EXPECT_FALSE(plan_strategy(run, stage, 2, 4, 8, static_cast<int64_t>(row.total()) - 1).fits);
  }
  // One rank: no ring, no pieces; the buckets' buffers still come and go in ZeRO-2.
  EXPECT_EQ(plan_strategy(run, 1, 1, 4, 8, lots).transient, 0);
  EXPECT_EQ(plan_strategy(run, 2, 1, 4, 8, lots).transient, 6000 + 3200 - 4200);
}

// ------------------------------------------------------------------ the decision tree

// Ten parameters of 160 elements, each its own bucket and (under FSDP) its own unit, arriving
// last to first; the activations `activations` bytes at the start of backward and none after
// (half of it throughout forward), at any batch.
DryRun ten_parameter_run(double activations, bool checkpointing) {
  DryRun run;
  run.checkpointing = checkpointing;
  for (int i = 0; i < 10; ++i) {
    run.layout.names.push_back("u" + std::to_string(i) + ".w");
    run.layout.numels.push_back(160);
    run.layout.unit_names.push_back("u" + std::to_string(i));
    run.layout.unit_of.push_back(i);
    run.layout.buckets.push_back({static_cast<size_t>(9 - i)});
  }
  run.layout.unit_names.push_back("");
  ActivationProfile profile{.batch = 1,
                            .forward = std::vector<double>(21, activations / 2),
                            .backward = {activations},
                            .arrivals = {}};
  for (int e = 0; e < 10; ++e) {
    profile.arrivals.push_back(static_cast<size_t>(9 - e));
    profile.backward.push_back(0);
  }
  run.low = run.high = profile;
  run.high.batch = 2;
  return run;
}

PlanRequest request_for(int world, int64_t memory, bool gpt = false) {
  PlanRequest r;
  if (gpt) {
    r.model.kind = PlanModel::Kind::kGPT;
    r.model.gpt = {.vocab_size = 16, .block_size = 8, .n_embd = 8, .n_layer = 1, .n_head = 2};
  }
  r.global_batch = 64;
  r.world = world;
  r.optimizer = "adamw";
  r.device_memory = memory;
  return r;
}

TEST(MemoryPlan, TheDecisionTreeAtItsBoundaries) {
  // 16 ranks: DDP 16 x 1600 + 1000 = 26600; ZeRO-2 7600 + 1000 = 8600 (a bucket's buffer and
  // pieces, 720, stay under the activations); ZeRO-3 1600 + 6480 (every unit's flat gradient
  // buffer at the end of backward, and the last reduce-scatter's pieces) = 8080.
  const DryRun run = ten_parameter_run(1000, false);
  EXPECT_EQ(plan_strategy(run, 0, 16, 4, 8, 1).total(), 26600);
  EXPECT_EQ(plan_strategy(run, 2, 16, 4, 8, 1).total(), 8600);
  EXPECT_EQ(plan_strategy(run, 3, 16, 4, 8, 1).total(), 8080);

  // Everything fits, to the byte: DDP.
  MemoryPlan plan = plan_memory(request_for(16, 26600), {run});
  EXPECT_TRUE(plan.recommendation.fits);
  EXPECT_EQ(plan.recommendation.stage, 0);
  // A byte short, over by less than 2x: ZeRO-2.
  plan = plan_memory(request_for(16, 26599), {run});
  EXPECT_EQ(plan.recommendation.stage, 2);
  EXPECT_FALSE(plan.recommendation.checkpointing);
  plan = plan_memory(request_for(16, 13301), {run});  // 1.99992x
  EXPECT_EQ(plan.recommendation.stage, 2);
  // Over by exactly 2x: ZeRO-3 (a ResNet: without checkpointing, which loom cannot do to it).
  plan = plan_memory(request_for(16, 13300), {run});
  EXPECT_TRUE(plan.recommendation.fits);
  EXPECT_EQ(plan.recommendation.stage, 3);
  EXPECT_FALSE(plan.recommendation.checkpointing);
  EXPECT_NE(plan.recommendation.reason.find("2x or more"), std::string::npos)
      << plan.recommendation.reason;
  // A GPT: ZeRO-3 with activation checkpointing.
  const DryRun checkpointed = ten_parameter_run(100, true);
  plan = plan_memory(request_for(16, 13300, true), {run, checkpointed});
  EXPECT_EQ(plan.recommendation.stage, 3);
  EXPECT_TRUE(plan.recommendation.checkpointing);
  EXPECT_FALSE(plan.row(0, true).fits);  // the table still has every row
  EXPECT_TRUE(plan.row(3, false).applicable);
  // Not even ZeRO-3: says so, and what would (more ranks shrink the states; its flat gradient
  // buffers stay 6400 + pieces, so 32 ranks fit 8079 B; one sample a rank does not help).
  plan = plan_memory(request_for(16, 8079), {run});
  EXPECT_FALSE(plan.recommendation.fits);
  EXPECT_NE(plan.recommendation.advice.find("32 ranks"), std::string::npos)
      << plan.recommendation.advice;
  EXPECT_NE(plan.recommendation.advice.find("even one sample"), std::string::npos)
      << plan.recommendation.advice;
  EXPECT_NE(format_plan(plan).find("none fits on 16 ranks"), std::string::npos);
  EXPECT_FALSE(plan_memory(request_for(64, 10), {run}).recommendation.fits);
}

TEST(MemoryPlan, UnderTwoXButZeroTwoTooBigGoesToZeroThree) {
  // 2 ranks, activations 10000: DDP 35600; ZeRO-2 16000 + 10000 = 26000; ZeRO-3 12800 + 11280.
  const DryRun run = ten_parameter_run(10000, false);
  const MemoryPlan plan = plan_memory(request_for(2, 25000), {run});  // 1.42x
  EXPECT_FALSE(plan.row(2, false).fits);
  EXPECT_TRUE(plan.recommendation.fits);
  EXPECT_EQ(plan.recommendation.stage, 3);
  EXPECT_NE(plan.recommendation.reason.find("ZeRO-2 still needs"), std::string::npos)
      << plan.recommendation.reason;
}

TEST(MemoryPlan, AResNetHasNoCheckpointedRows) {
  const DryRun run = ten_parameter_run(1000, false);
  const MemoryPlan plan = plan_memory(request_for(4, int64_t{1} << 30), {run});
  ASSERT_EQ(plan.rows.size(), 8u);
  for (int stage = 0; stage <= 3; ++stage) EXPECT_FALSE(plan.row(stage, true).applicable);
  const std::string text = format_plan(plan);
  EXPECT_NE(text.find("n/a"), std::string::npos) << text;
  EXPECT_NE(text.find("recommendation: DDP"), std::string::npos) << text;
}

// Note [The planner's dry runs]: 16-bit weights are the model's under ZeRO-1 and 2 (2 bytes of
// weight and gradient, float32 masters in the optimizer state), only the gathered units' under
// ZeRO-3 (float32 shards); the buffers are 16-bit either way.
TEST(MemoryPlan, SixteenBitRowsFollowTheAppsLayouts) {
  DryRun run = three_parameter_run();
  run.weights = kBFloat16;
  const int64_t lots = int64_t{1} << 40;
  // ZeRO-2: buffers {p2, p1} 3000 B in intervals 1-2, {p0} 2000 in 3; the pieces 3000 in 2 and
  // 2000 in 3: interval 2 holds 6000 over 1600.
  StrategyRow row = plan_strategy(run, 2, 2, 4, 8, lots);
  EXPECT_EQ(row.states.weights, 5000);
  EXPECT_EQ(row.states.gradients, 2500);
  EXPECT_EQ(row.states.optimizer_state, 15000);  // (8 + 4) x 2500 / 2
  EXPECT_EQ(row.transient, 7600 - 4200);
  // ZeRO-3: float32 shards; 16-bit units (2000, 2000, root 1000), their gradient buffers, the
  // pieces, and each reduce-scatter's 16-bit output until the end: interval 2 holds 9500.
  row = plan_strategy(run, 3, 2, 4, 8, lots);
  EXPECT_EQ(row.states.weights, 5000);
  EXPECT_EQ(row.states.gradients, 5000);
  EXPECT_EQ(row.states.optimizer_state, 10000);
  EXPECT_EQ(row.transient, 1600 + 9500 - 4200);
  EXPECT_THROW(plan_strategy(run, 0, 2, 4, 8, lots), ValueError);  // DDP autocasts float32
  EXPECT_EQ(plan_weights(0, Precision::kBFloat16), kFloat32);
  EXPECT_EQ(plan_weights(1, Precision::kBFloat16), kBFloat16);
  EXPECT_EQ(plan_weights(2, Precision::kFloat16), kFloat32);
  EXPECT_EQ(plan_weights(3, Precision::kFloat16), kFloat16);
  EXPECT_EQ(plan_weights(3, Precision::kFloat32), kFloat32);
  // A plan without the dry run a row needs names it.
  try {
    plan_memory(request_for(2, lots), {three_parameter_run()});
  } catch (const ValueError& e) {
    ADD_FAILURE() << "a float32 plan needs only float32 runs: " << e.what();
  }
  PlanRequest bf16 = request_for(2, lots);
  bf16.precision = Precision::kBFloat16;
  EXPECT_THROW(plan_memory(bf16, {three_parameter_run()}), ValueError);
  EXPECT_NO_THROW(plan_memory(bf16, {three_parameter_run(), run}));
}

// ------------------------------------------------------------------ the dry run

PlanModel small_gpt() {
  PlanModel m;
  m.kind = PlanModel::Kind::kGPT;
  m.gpt = {.vocab_size = 128, .block_size = 32, .n_embd = 64, .n_layer = 2, .n_head = 4};
  return m;
}

PlanModel small_resnet() {
  PlanModel m;
  m.resnet.width = 8;
  m.resnet.in_channels = 1;
  m.resnet.num_classes = 10;
  return m;
}

TEST(MemoryPlan, ActivationsAreLinearInTheBatch) {
  for (const PlanModel& model : {small_gpt(), small_resnet()}) {
    SCOPED_TRACE(model.describe());
    const double p1 = measure_step(model, Precision::kFloat32, false, 2).peak();
    const double p2 = measure_step(model, Precision::kFloat32, false, 4).peak();
    const double p3 = measure_step(model, Precision::kFloat32, false, 6).peak();
    EXPECT_GT(p2, p1);
    EXPECT_NEAR(p3 - p2, p2 - p1, 0.02 * (p2 - p1));
  }
}

// The estimate at a batch against one step measured at it, within 10%: float32, bf16, and
// with activation checkpointing.
TEST(MemoryPlan, TheScaledEstimateMatchesAStepMeasuredDirectly) {
  struct Case {
    PlanModel model;
    Precision precision;
    bool checkpointing;
    std::pair<int64_t, int64_t> probes;
    int64_t batch;
  };
  const Case cases[] = {{small_gpt(), Precision::kFloat32, false, {2, 4}, 16},
                        {small_gpt(), Precision::kBFloat16, false, {2, 4}, 16},
                        {small_gpt(), Precision::kFloat32, true, {2, 4}, 16},
                        {small_resnet(), Precision::kFloat32, false, {2, 4}, 32},
                        {small_resnet(), Precision::kFloat16, false, {2, 4}, 32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model.describe() + " " + precision_name(c.precision) +
                 (c.checkpointing ? " checkpointed" : ""));
    const DryRun run = dry_run(c.model, c.precision, c.checkpointing, c.probes);
    const double estimate = run.at(c.batch).peak();
    const double measured = measure_step(c.model, c.precision, c.checkpointing, c.batch).peak();
    EXPECT_NEAR(estimate, measured, 0.10 * measured);
    EXPECT_EQ(run.layout.params(), c.model.build()->num_parameters());
  }
}

TEST(MemoryPlan, CheckpointingShrinksAGPTsActivations) {
  PlanModel model = small_gpt();
  model.gpt.n_layer = 4;
  const double plain = measure_step(model, Precision::kFloat32, false, 4).peak();
  const double checkpointed = measure_step(model, Precision::kFloat32, true, 4).peak();
  EXPECT_LT(checkpointed, 0.75 * plain);
  EXPECT_THROW(measure_step(small_resnet(), Precision::kFloat32, true, 4), ValueError);
}

TEST(MemoryPlan, TheDryRunLeavesTheGeneratorAsItWas) {
  manual_seed(7);
  const Tensor before = randn({4});
  manual_seed(7);
  measure_step(small_gpt(), Precision::kFloat32, false, 1);
  EXPECT_TRUE(test::tensors_close(randn({4}), before, 0, 0));
}

TEST(MemoryPlan, TheLayoutHasFSDPsUnitsAndDDPsBuckets) {
  nn::GPT gpt(small_gpt().gpt);
  const ModelLayout layout = model_layout(gpt);
  EXPECT_EQ(layout.unit_names,
            (std::vector<std::string>{"transformer.h.0", "transformer.h.1", ""}));
  EXPECT_EQ(layout.params(), gpt.num_parameters());
  size_t bucketed = 0;
  for (const auto& bucket : layout.buckets) bucketed += bucket.size();
  EXPECT_EQ(bucketed, layout.names.size());
  EXPECT_EQ(layout.buckets.front().front(), layout.names.size() - 1);  // reverse order
  auto resnet = nn::resnet18(small_resnet().resnet);
  EXPECT_EQ(model_layout(*resnet).unit_names,
            (std::vector<std::string>{"layer1", "layer2", "layer3", "layer4", ""}));
}

// ------------------------------------------------------------------ inputs

TEST(MemoryPlan, ParsesSizesAndPrecisions) {
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1500000000);
  EXPECT_EQ(parse_byte_size("64 kib"), 65536);
  EXPECT_EQ(parse_byte_size("1000000"), 1000000);
  for (const char* bad : {"", "GiB", "2XB", "-1GiB", "0", "nan", "1e30TiB"})
    EXPECT_THROW(parse_byte_size(bad), ValueError) << bad;
  EXPECT_EQ(parse_precision("bf16"), Precision::kBFloat16);
  EXPECT_EQ(precision_name(parse_precision("fp16")), "fp16");
  EXPECT_THROW(parse_precision("fp8"), ValueError);
}

TEST(MemoryPlan, BadRequestsRaiseValueErrors) {
  const auto message_of = [](const PlanRequest& r) {
    try {
      r.validate();
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PlanRequest r = request_for(4, 1 << 30);
  r.global_batch = 10;
  EXPECT_NE(message_of(r).find("does not split evenly over 4 ranks"), std::string::npos);
  r = request_for(4, 0);
  EXPECT_NE(message_of(r).find("device memory"), std::string::npos);
  r = request_for(0, 1 << 30);
  EXPECT_NE(message_of(r).find("world 0"), std::string::npos);
  r = request_for(4, 1 << 30);
  r.optimizer = "lamb";
  EXPECT_NE(message_of(r).find("lamb"), std::string::npos);
  r = request_for(4, 1 << 30);
  r.probe_batches = {4, 2};
  EXPECT_NE(message_of(r).find("probe batches"), std::string::npos);
  r = request_for(4, 1 << 30, true);
  r.model.gpt.n_head = 3;  // 8 channels do not split into 3 heads
  EXPECT_THROW(r.validate(), ValueError);
  r = request_for(4, 1 << 30);
  r.model.resnet.width = 0;
  EXPECT_NE(message_of(r).find("width"), std::string::npos);
}

TEST(MemoryPlan, ACheckpointNamesItsModel) {
  test::ScratchDir dir;
  nn::GPT gpt(small_gpt().gpt);
  nn::save_gpt(dir.file("gpt.safetensors"), gpt);
  const PlanModel from_gpt = plan_model_from_checkpoint(dir.file("gpt.safetensors"));
  EXPECT_EQ(from_gpt.kind, PlanModel::Kind::kGPT);
  EXPECT_EQ(from_gpt.gpt, small_gpt().gpt);

  auto resnet = nn::resnet18(small_resnet().resnet);
  save_safetensors(
      dir.file("resnet.safetensors"), resnet->state_dict(),
      {{"model", "resnet18"}, {"width", "8"}, {"in_channels", "1"}, {"num_classes", "10"}});
  const PlanModel from_resnet = plan_model_from_checkpoint(dir.file("resnet.safetensors"));
  EXPECT_EQ(from_resnet.kind, PlanModel::Kind::kResNet18);
  EXPECT_EQ(from_resnet.resnet.width, 8);
  EXPECT_EQ(from_resnet.resnet.in_channels, 1);

  save_safetensors(dir.file("bare.safetensors"), resnet->state_dict());
  EXPECT_THROW(plan_model_from_checkpoint(dir.file("bare.safetensors")), ValueError);
  save_safetensors(dir.file("odd.safetensors"), resnet->state_dict(),
                   {{"model", "resnet18"}, {"width", "wide"}});
  EXPECT_THROW(plan_model_from_checkpoint(dir.file("odd.safetensors")), ValueError);
  EXPECT_THROW(plan_model_from_checkpoint(dir.file("missing.safetensors")), IOError);
}

// ------------------------------------------------------------------ against real ranks

// On `world` real ranks laid out as the apps lay them out (Note [The planner's dry runs]), each
// rank's peak in a training step after the first (the optimizer state exists), as "model
// states + step peak": the model states by the table, plus the peak above what the rank holds
// after the step; each within 10% of the planned row's total, 15% under ZeRO-3. There the
// reduce-scatters' timing moves the measured peak by 5-10% from run to run (Note [The
// planner's dry runs]), and on a CPU whose bfloat16 products skip the widened copies (AMX) the
// bf16 GPT row planned 7.57 MiB against 8.26-8.45 measured (9-12%; 3% with the copies): the
// dry run's peak interval moved, and the transient model is a little short there.
void expect_measured_near(const PlanModel& model, Precision precision, bool checkpointing,
                          int world, int64_t batch, const StrategyRow& planned) {
  const int stage = planned.stage;
  test::run_ranks(
      world,
      [&](test::Rank& r) {
        set_num_threads(1);
        const auto group = test::gloo_group(r);
        manual_seed(1);
        const bool gpt = model.kind == PlanModel::Kind::kGPT;
        const nn::ModulePtr net = model.build(checkpointing);
        if (plan_weights(stage, precision) != kFloat32 && stage < 3)
          net->to(plan_weights(stage, precision));  // a 16-bit model, float32 masters
        const auto adam = [](std::vector<Tensor> p, const std::vector<size_t>&) {
          return std::unique_ptr<optim::Optimizer>(std::make_unique<optim::AdamW>(p));
        };
        std::shared_ptr<DistributedDataParallel> ddp;
        std::shared_ptr<FullyShardedDataParallel> fsdp;
        std::unique_ptr<optim::Optimizer> optimizer;
        if (stage == 3) {
          FSDPOptions options;
          if (precision != Precision::kFloat32) options.param_dtype = plan_weights(3, precision);
          fsdp = std::make_shared<FullyShardedDataParallel>(net, group, options);
          optimizer = adam(fsdp->optimizer_params(), {});
        } else {
          ddp = std::make_shared<DistributedDataParallel>(net, group);
          if (stage == 0)
            optimizer = adam(net->parameters(), {});
          else
            optimizer =
                std::make_unique<ZeroRedundancyOptimizer>(*ddp, adam, ZeroOptions{.stage = stage});
        }
        nn::Module& wrapped = fsdp ? static_cast<nn::Module&>(*fsdp) : *ddp;
        int64_t peak = 0, held = 0;
        for (int step = 0; step < 2; ++step) {
          if (step == 1) reset_peak_memory(kCPU);
          optimizer->zero_grad();
          {
            Tensor loss;
            {
              autocast::Guard amp(precision == Precision::kFloat16 ? kFloat16 : kBFloat16,
                                  precision != Precision::kFloat32);
              if (gpt) {
                const int64_t T = model.gpt.block_size, V = model.gpt.vocab_size;
                const Tensor logits = wrapped.forward(randint(0, V, {batch, T}));
                loss = cross_entropy(logits.reshape({-1, V}), randint(0, V, {batch * T}));
              } else {
                const Tensor x = randn({batch, model.resnet.in_channels, 32, 32});
                loss = cross_entropy(wrapped.forward(x), randint(0, 10, {batch}));
              }
            }
            loss.backward();
          }
          optimizer->step();
        }
        peak = memory_stats(kCPU).peak_bytes;
        held = memory_stats(kCPU).current_bytes;
        const double measured = planned.states.total() + static_cast<double>(peak - held);
        const double tolerance = stage == 3 ? 0.15 : 0.10;
        EXPECT_NEAR(planned.total(), measured, tolerance * measured)
            << "rank " << r.rank << ": planned " << planned.total() / kMiB << " MiB, measured "
            << measured / kMiB << " MiB";
      },
      std::chrono::seconds(120));
}

TEST(MemoryPlan, TotalsMatchTheMeasuredPeaksOnTwoAndFourRanks) {
  struct Case {
    PlanModel model;
    Precision precision;
    bool checkpointing;
    int64_t batch;
  };
  PlanModel wide = small_gpt();
  wide.gpt.n_embd = 128;  // model states that matter beside the activations
  PlanModel deep = small_gpt();
  deep.gpt.n_layer = 4;
  deep.gpt.block_size = 64;
  const Case cases[] = {{wide, Precision::kFloat32, false, 8},
                        {wide, Precision::kBFloat16, false, 8},
                        {deep, Precision::kBFloat16, true, 8},
                        {small_resnet(), Precision::kFloat32, false, 16},
                        {small_resnet(), Precision::kFloat16, false, 16}};
  for (const Case& c : cases)
    for (int stage = 0; stage <= 3; ++stage) {
      const DryRun run =
          dry_run(c.model, c.precision, c.checkpointing, {2, 4}, plan_weights(stage, c.precision));
      for (int world : {2, 4}) {
        SCOPED_TRACE(c.model.describe() + " " + precision_name(c.precision) +
                     (c.checkpointing ? " checkpointed, " : ", ") + strategy_name(stage) + " on " +
                     std::to_string(world) + " ranks");
        expect_measured_near(c.model, c.precision, c.checkpointing, world, c.batch,
                             plan_strategy(run, stage, world, c.batch, 8, 1));
      }
    }
}

}  // namespace
}  // namespace loom::dist
