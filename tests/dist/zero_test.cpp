// tests/dist/zero_test.cpp — ZeroRedundancyOptimizer (Note [ZeRO stages]) in real processes:
// stages 1 and 2 end with DDP's weights after 5 steps (float64, 2 and 4 ranks, a small GPT with
// AdamW, weight decay on the matrices and clipping, and ResNet-18 with SGD and a GradScaler),
// move the bytes of DDP's allreduce, keep a 1/N share of the optimizer state (and in stage 2
// of the gradients), and refuse what they cannot do.
#include "dist/zero.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/memory_report.h"
#include "dist/multiprocess.h"
#include "dist/sharded_checkpoint.h"
#include "loom.h"
#include "nn/gpt.h"
#include "nn/resnet.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace loom::dist {
namespace {

enum class Model { kGPT, kResNet };

nn::ModulePtr make_model(Model kind) {
  manual_seed(7);
  nn::ModulePtr model;
  if (kind == Model::kGPT) {
    nn::GPTConfig c;
    c.vocab_size = 23;
    c.block_size = 8;
    c.n_embd = 12;
    c.n_layer = 2;
    c.n_head = 2;
    model = std::make_shared<nn::GPT>(c);
  } else {
    model = nn::resnet18({.width = 4, .in_channels = 2, .num_classes = 5});
  }
  model->to(kFloat64);
  return model;
}

// The global batch of step s, the same on every rank; rank r takes its share.
std::pair<Tensor, Tensor> batch(Model kind, int step, int rank, int world) {
  Generator g(500 + static_cast<uint64_t>(step));
  const Generator::State saved = default_generator().state();
  default_generator().set_state(g.state());
  // ResNet's batch norms see at least 16 values a channel on each rank, even in layer4 (2 x 2):
  // with fewer they amplify rounding differences by orders of magnitude.
  const int64_t samples = kind == Model::kGPT ? 8 : 16;
  Tensor x = kind == Model::kGPT ? randint(0, 23, {8, 8}) : randn({16, 2, 16, 16}, kFloat64);
  Tensor y = kind == Model::kGPT ? randint(0, 23, {8, 8}) : randint(0, 5, {16});
  default_generator().set_state(saved);
  const int64_t n = samples / world;
  return {x.narrow(0, rank * n, n).contiguous(), y.narrow(0, rank * n, n).contiguous()};
}

Tensor loss_of(Model kind, nn::Module& net, const std::pair<Tensor, Tensor>& b) {
  Tensor out = net.forward(b.first);
  if (kind == Model::kGPT) return cross_entropy(out.reshape({-1, 23}), b.second.reshape({-1}));
  return cross_entropy(out, b.second);
}

std::vector<bool> matrices(const std::vector<Tensor>& params) {
  std::vector<bool> decay;
  for (const Tensor& p : params) decay.push_back(p.dim() >= 2);
  return decay;
}

struct RunResult {
  NamedTensors params;
  CollectiveCounters per_step;       // the collectives of the last step
  int64_t state_bytes = 0;           // the (inner) optimizer's state
  int64_t total_numel = 0;           // the model's parameters, Psi
  bool grads_left = false;           // some model parameter has a .grad after the last backward
  bool buffers_left = false;         // some bucket buffer survived the last backward
  std::vector<int64_t> unit_numels;  // FSDP's units, the root last
};

// Five steps of DDP (stage 0) or ZeRO-`stage`. The GPT trains with AdamW (decay on matrices)
// and gradient clipping; ResNet-18 with SGD momentum, weight decay and a GradScaler.
// Which steps a run takes, and the sharded checkpoint it starts from or ends with.
struct Phase {
  int first_step = 0, last_step = 5;
  std::string load_from, save_to;
};

RunResult train(test::Rank& r, std::shared_ptr<ProcessGroup> group, Model kind, int stage,
                bool recompute = false, const Phase& phase = {}) {
  nn::ModulePtr model = make_model(kind);
  if (recompute) std::dynamic_pointer_cast<nn::GPT>(model)->set_gradient_checkpointing(true);
  std::shared_ptr<DistributedDataParallel> ddp;
  std::vector<Tensor> params;
  if (stage == 3) {
    for (const Tensor& p : model->parameters())
      if (p.requires_grad()) params.push_back(p);
  } else {
    ddp = std::make_shared<DistributedDataParallel>(model, group);
    params = ddp->reducer().params();
  }
  auto make = [&](std::vector<Tensor> ps, const std::vector<bool>& decay) {
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == Model::kGPT)
      opt = std::make_unique<optim::AdamW>(
          ps, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .decay = decay});
    else
      opt = std::make_unique<optim::SGD>(
          ps, optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-3});
    return opt;
  };
  auto make_over_pieces = [&](std::vector<Tensor> pieces, const std::vector<size_t>& owner) {
    std::vector<bool> decay;
    for (size_t i : owner) decay.push_back(params[i].dim() >= 2);
    return make(std::move(pieces), decay);
  };
  std::unique_ptr<optim::Optimizer> optimizer;
  ZeroRedundancyOptimizer* zero = nullptr;
  std::shared_ptr<FullyShardedDataParallel> fsdp;
  if (stage == 0) {
    optimizer = make(params, matrices(params));
  } else if (stage == 3) {
    fsdp = std::make_shared<FullyShardedDataParallel>(model, group);
    std::vector<size_t> owner;
    for (const ShardPiece& piece : fsdp->pieces()) owner.push_back(piece.param);
    optimizer = make_over_pieces(fsdp->optimizer_params(), owner);
  } else {
    auto z = std::make_unique<ZeroRedundancyOptimizer>(*ddp, make_over_pieces,
                                                       ZeroOptions{.stage = stage});
    zero = z.get();
    optimizer = std::move(z);
  }
  nn::Module& net = fsdp ? static_cast<nn::Module&>(*fsdp) : *ddp;
  auto sharded = [&] { return zero ? sharded_state(*zero) : sharded_state(*fsdp, *optimizer); };
  if (!phase.load_from.empty()) {
    const auto meta = load_sharded_checkpoint(phase.load_from, sharded());
    EXPECT_EQ(meta.at("step"), std::to_string(phase.first_step));
  }
  optim::GradScaler scaler({.init_scale = 1024.0, .enabled = kind == Model::kResNet});
  scaler.set_found_inf_agreement(found_inf_agreement(group));
  RunResult result;
  for (int step = phase.first_step; step < phase.last_step; ++step) {
    group->reset_counters();
    optimizer->zero_grad();
    scaler.scale(loss_of(kind, net, batch(kind, step, r.rank, r.world_size))).backward();
    if (kind == Model::kGPT) {
      if (zero)
        zero->clip_grad_norm_(0.5);
      else if (fsdp)
        fsdp->clip_grad_norm_(0.5);
      else
        optim::clip_grad_norm_(params, 0.5);
    }
    scaler.step(*optimizer);
    scaler.update();
    if (step == phase.last_step - 1) {
      result.per_step = group->counters();
      for (const Tensor& p : params) result.grads_left = result.grads_left || p.grad().defined();
      if (ddp)
        for (const Bucket& b : ddp->reducer().buckets())
          result.buffers_left = result.buffers_left || b.buffer.defined();
    }
  }
  if (!phase.save_to.empty())
    save_sharded_checkpoint(phase.save_to, sharded(), {{"step", std::to_string(phase.last_step)}});
  {
    std::unique_ptr<FullyShardedDataParallel::FullParams> gathered;
    if (fsdp) gathered = fsdp->summon_full_params();
    for (const auto& [name, p] : model->named_parameters())
      result.params.emplace_back(name, p.clone());
  }
  result.state_bytes = zero ? zero->inner().state_bytes() : optimizer->state_bytes();
  for (const Tensor& p : params) result.total_numel += p.numel();
  if (fsdp) result.unit_numels = fsdp->unit_numels();
  return result;
}

int64_t bus(const CollectiveCounters& c, const std::string& op) {
  auto it = c.find(op);
  return it == c.end() ? 0 : it->second.bus_bytes;
}

void check_stage_against_ddp(test::Rank& r, Model kind, int stage) {
  auto group = test::gloo_group(r);
  const RunResult ddp = train(r, group, kind, 0);
  const RunResult zero = train(r, group, kind, stage);
  ASSERT_EQ(ddp.params.size(), zero.params.size());
  for (size_t i = 0; i < ddp.params.size(); ++i)
    EXPECT_TRUE(test::tensors_close(zero.params[i].second, ddp.params[i].second, 1e-10, 1e-12))
        << ddp.params[i].first << " stage " << stage << " rank " << r.rank;

  // Traffic: a reduce-scatter and an all-gather of the parameters, DDP's allreduce (padding
  // aside: under N elements a bucket).
  const int64_t ddp_bytes = bus(ddp.per_step, "allreduce");
  const int64_t zero_bytes = bus(zero.per_step, "reduce_scatter") + bus(zero.per_step, "allgather");
  // Stage 3 all-gathers each unit twice and the root once (Note [FSDP units], step 4).
  if (stage == 3) {
    int64_t units = 0, all = 0;
    for (size_t u = 0; u < zero.unit_numels.size(); ++u) {
      all += zero.unit_numels[u] * 8;
      if (u + 1 < zero.unit_numels.size()) units += zero.unit_numels[u] * 8;
    }
    const int64_t root = all - units;
    EXPECT_EQ(bus(zero.per_step, "allgather"),
              bus_bytes("allgather", 2 * units + root, r.world_size));
    EXPECT_EQ(bus(zero.per_step, "reduce_scatter"), bus_bytes("reduce_scatter", all, r.world_size));
    EXPECT_NEAR(static_cast<double>(zero_bytes) / ddp_bytes,
                (1.5 * all - 0.5 * root) / static_cast<double>(all), 0.01);
    if (r.rank == 0)
      std::printf(
          "ZeRO-3 at %d ranks: %.3f x DDP's bytes a step (the root, %.1f%% of the "
          "parameters, gathered once)\n",
          r.world_size, static_cast<double>(zero_bytes) / ddp_bytes, 100.0 * root / all);
  }
  // Beside them one allreduce of a number: the clipping's float64 norm (GPT), the GradScaler's
  // float32 found-inf flag (ResNet).
  EXPECT_EQ(bus(zero.per_step, "allreduce"),
            bus_bytes("allreduce", kind == Model::kGPT ? 8 : 4, r.world_size))
      << format_counters(zero.per_step);
  if (stage != 3) {
    EXPECT_NEAR(static_cast<double>(zero_bytes) / ddp_bytes, 1.0, 0.01)
        << "DDP:\n"
        << format_counters(ddp.per_step) << "ZeRO-" << stage << ":\n"
        << format_counters(zero.per_step);
  }

  // Optimizer state: 1/N of DDP's (AdamW: m and v; SGD: the momentum), padding aside.
  EXPECT_NEAR(static_cast<double>(zero.state_bytes) / ddp.state_bytes, 1.0 / r.world_size, 0.01);
  // Stage 2 keeps no full gradient after backward; stage 1 keeps its buffers.
  EXPECT_EQ(zero.grads_left, stage == 1);
  EXPECT_EQ(zero.buffers_left, stage == 1);
  EXPECT_TRUE(ddp.grads_left);
}

TEST(Zero, StageOneEndsWithDDPsWeightsOnTwoAndFourRanksGPT) {
  for (int world : {2, 4})
    test::run_ranks(
        world, [](test::Rank& r) { check_stage_against_ddp(r, Model::kGPT, 1); },
        std::chrono::seconds(60));
}

TEST(Zero, StageTwoEndsWithDDPsWeightsOnTwoAndFourRanksGPT) {
  for (int world : {2, 4})
    test::run_ranks(
        world, [](test::Rank& r) { check_stage_against_ddp(r, Model::kGPT, 2); },
        std::chrono::seconds(60));
}

TEST(Zero, StagesOneAndTwoEndWithDDPsWeightsOnTwoAndFourRanksResNet18) {
  for (int world : {2, 4})
    for (int stage : {1, 2})
      test::run_ranks(
          world, [stage](test::Rank& r) { check_stage_against_ddp(r, Model::kResNet, stage); },
          std::chrono::seconds(120));
}

TEST(Zero, StageThreeFSDPEndsWithDDPsWeightsOnTwoAndFourRanksGPT) {
  for (int world : {2, 4})
    test::run_ranks(
        world, [](test::Rank& r) { check_stage_against_ddp(r, Model::kGPT, 3); },
        std::chrono::seconds(60));
}

TEST(Zero, StageThreeFSDPEndsWithDDPsWeightsOnTwoAndFourRanksResNet18) {
  for (int world : {2, 4})
    test::run_ranks(
        world, [](test::Rank& r) { check_stage_against_ddp(r, Model::kResNet, 3); },
        std::chrono::seconds(120));
}

// Note [FSDP units], step 5: with every block recomputed in backward the weights are the same to
// the bit and no unit is gathered a third time.
TEST(Zero, StageThreeWithActivationCheckpointingChangesNoBitAndGathersNoMore) {
  test::run_ranks(2, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    const RunResult plain = train(r, group, Model::kGPT, 3);
    const RunResult recomputed = train(r, group, Model::kGPT, 3, /*recompute=*/true);
    for (size_t i = 0; i < plain.params.size(); ++i)
      EXPECT_TRUE(test::tensors_close(recomputed.params[i].second, plain.params[i].second, 0, 0))
          << plain.params[i].first;
    EXPECT_EQ(recomputed.per_step.at("allgather").calls, plain.per_step.at("allgather").calls);
    EXPECT_EQ(bus(recomputed.per_step, "allgather"), bus(plain.per_step, "allgather"));
  });
}

// The ZeRO paper's 16-bit column: a bfloat16 model under ZeRO-1 and -2 with float32 masters of
// its pieces (Note [ZeRO with a 16-bit model]), and FSDP with param_dtype bfloat16 (Note [FSDP
// mixed precision]). The wire carries exactly half the bytes of the float32 stage; the rank
// keeps the column's model states (ZeRO-1 4 Psi + 12 Psi / N, ZeRO-2 2 Psi + 14 Psi / N, ZeRO-3
// 16 Psi / N); and the training follows DDP's under autocast (float32 parameters cast as the ops
// run) up to bfloat16's rounding of the weights.
void check_sixteen_bit_column(test::Rank& r, const std::shared_ptr<ProcessGroup>& group,
                              int stage) {
  {
    struct Run {
      std::vector<double> losses;
      CollectiveCounters last;
      NamedTensors params;
    };
    auto run = [&](int strategy, bool mixed) {
      nn::ModulePtr model = make_model(Model::kGPT);
      model->to(kFloat32);
      std::shared_ptr<DistributedDataParallel> ddp;
      std::shared_ptr<FullyShardedDataParallel> fsdp;
      std::unique_ptr<optim::Optimizer> optimizer;
      if (strategy == 3) {
        FSDPOptions options;
        if (mixed) options.param_dtype = kBFloat16;
        fsdp = std::make_shared<FullyShardedDataParallel>(model, group, options);
        optimizer = std::make_unique<optim::AdamW>(fsdp->optimizer_params(),
                                                   optim::AdamWOptions{.lr = 1e-2});
        for (const Tensor& p : model->parameters())
          EXPECT_EQ(p.dtype(), mixed ? kBFloat16 : kFloat32);
        for (const Tensor& piece : fsdp->optimizer_params()) EXPECT_EQ(piece.dtype(), kFloat32);
      } else {
        if (mixed) model->to(kBFloat16);
        ddp = std::make_shared<DistributedDataParallel>(model, group);
        auto adamw = [](std::vector<Tensor> ps, const std::vector<size_t>&) {
          return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions{.lr = 1e-2});
        };
        if (strategy == 0)
          optimizer = adamw(model->parameters(), {});
        else
          optimizer = std::make_unique<ZeroRedundancyOptimizer>(*ddp, adamw,
                                                                ZeroOptions{.stage = strategy});
      }
      nn::Module& net = fsdp ? static_cast<nn::Module&>(*fsdp) : *ddp;
      Run out;
      for (int step = 0; step < 4; ++step) {
        group->reset_counters();
        optimizer->zero_grad();
        Tensor loss;
        {
          autocast::Guard amp(kBFloat16);
          loss = loss_of(Model::kGPT, net, batch(Model::kGPT, step, r.rank, r.world_size));
        }
        loss.backward();
        optimizer->step();
        out.losses.push_back(loss.item());
        out.last = group->counters();
      }
      std::unique_ptr<FullyShardedDataParallel::FullParams> gathered;
      if (fsdp) gathered = fsdp->summon_full_params();
      for (const auto& [name, p] : model->named_parameters())
        out.params.emplace_back(name, p.to(kFloat32));
      if (mixed) {
        auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(optimizer.get());
        const DataParallelism parallel{.ddp = ddp.get(), .zero = zero, .fsdp = fsdp.get()};
        const ModelStates m = measure_model_states(*model, *optimizer, parallel);
        const double psi = static_cast<double>(m.parameters), n = r.world_size;
        const double column = strategy == 1   ? 4 * psi + 12 * psi / n
                              : strategy == 2 ? 2 * psi + 14 * psi / n
                                              : 16 * psi / n;
        // Padding aside (under N elements a bucket or unit).
        EXPECT_NEAR(static_cast<double>(m.weights + m.gradients + m.optimizer_state), column,
                    16.0 * 8)
            << "strategy " << strategy;
      }
      return out;
    };
    const Run ddp = run(0, false), fsdp32 = run(stage, false), fsdp16 = run(stage, true);
    const int64_t wire32 = bus(fsdp32.last, "allgather") + bus(fsdp32.last, "reduce_scatter");
    const int64_t wire16 = bus(fsdp16.last, "allgather") + bus(fsdp16.last, "reduce_scatter");
    EXPECT_EQ(2 * wire16, wire32);
    for (size_t s = 0; s < ddp.losses.size(); ++s)
      EXPECT_NEAR(fsdp16.losses[s], ddp.losses[s], 0.01 * std::fabs(ddp.losses[s])) << "step " << s;
    // The weights: the distance between the two runs' weights is a small part of the
    // distance each travelled from the start (AdamW moves every weight by about lr a step, and
    // bfloat16's rounding of the gathered weights turns into whole steps where a gradient is
    // near zero: a tenth, not the 1e-5 of float32).
    nn::ModulePtr start = make_model(Model::kGPT);
    start->to(kFloat32);
    const NamedTensors initial = start->named_parameters();
    double apart = 0, travelled = 0;
    for (size_t i = 0; i < ddp.params.size(); ++i) {
      const std::vector<double> a = ddp.params[i].second.to_vector<double>(),
                                b = fsdp16.params[i].second.to_vector<double>(),
                                o = initial[i].second.to_vector<double>();
      for (size_t e = 0; e < a.size(); ++e) {
        apart += std::fabs(a[e] - b[e]);
        travelled += std::fabs(a[e] - o[e]);
      }
    }
    EXPECT_GT(travelled, 0);
    EXPECT_LT(apart, 0.1 * travelled) << apart << " apart, " << travelled << " travelled";
    if (r.rank == 0)
      std::printf("bfloat16 ZeRO-%d against DDP under autocast: %.3f of the distance travelled\n",
                  stage, apart / travelled);
  }
}

TEST(Zero, EachStageKeepsTheSixteenBitColumnWithABfloat16Model) {
  test::run_ranks(2, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    for (int stage = 1; stage <= 3; ++stage) check_sixteen_bit_column(r, group, stage);
  });
}

// The units' parameters exist only around their use: released after forward (all but the
// root) and after backward and step (all), readable inside summon_full_params, and an attempt to
// read them outside raises instead of crashing.
TEST(Zero, StageThreeReleasesEachUnitsParametersBetweenUses) {
  test::run_ranks(2, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    nn::ModulePtr model = make_model(Model::kGPT);
    auto gpt = std::dynamic_pointer_cast<nn::GPT>(model);
    FullyShardedDataParallel fsdp(model, group);
    EXPECT_EQ(fsdp.num_units(), 3u);  // two blocks and the root
    EXPECT_NE(fsdp.plan().find("transformer.h.1"), std::string::npos) << fsdp.plan();
    Tensor block_weight = gpt->transformer->h[0]->attn->c_attn->weight;
    const Tensor embedding = gpt->transformer->wte->weight;
    EXPECT_TRUE(is_released(*block_weight.storage()));
    EXPECT_LOOM_ERROR(block_weight.clone(), ValueError, {"released", "summon_full_params"});
    Tensor loss = loss_of(Model::kGPT, fsdp, batch(Model::kGPT, 0, r.rank, r.world_size));
    EXPECT_TRUE(is_released(*block_weight.storage())) << "a block stays gathered after forward";
    EXPECT_FALSE(is_released(*embedding.storage())) << "the root is kept for backward";
    loss.backward();
    EXPECT_TRUE(is_released(*block_weight.storage()));
    EXPECT_TRUE(is_released(*embedding.storage()));
    EXPECT_FALSE(block_weight.grad().defined());
    // The shards hold 1/N of the parameters and of their gradients: 2 x 8 bytes x Psi / N.
    int64_t psi = 0;
    for (const Tensor& p : fsdp.params()) psi += p.numel();
    EXPECT_NEAR(static_cast<double>(fsdp.shard_bytes()), 16.0 * psi / 2, 16.0 * 3 * 2);
    {
      auto full = fsdp.summon_full_params();
      EXPECT_FALSE(is_released(*block_weight.storage()));
      NoGradGuard no_grad;
      block_weight.fill_(0.25);  // written back into the shards
    }
    auto again = fsdp.summon_full_params();
    EXPECT_EQ(max(block_weight).item<double>(), 0.25);
    EXPECT_EQ(min(block_weight).item<double>(), 0.25);
  });
}

TEST(Zero, StageThreeRefusesAPolicyThatPicksNothingOrNests) {
  test::run_ranks(2, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    EXPECT_LOOM_ERROR(FullyShardedDataParallel(
                          make_model(Model::kGPT), group,
                          {.units = [](const std::string&, const nn::Module&) { return false; }}),
                      ValueError, {"picked no module", "GPT2LMHeadModel", "FSDPOptions::units"});
    EXPECT_LOOM_ERROR(FullyShardedDataParallel(make_model(Model::kGPT), group,
                                               {.units =
                                                    [](const std::string& name, const nn::Module&) {
                                                      return name == "transformer.h" ||
                                                             name == "transformer.h.0";
                                                    }}),
                      ValueError, {"transformer.h.0", "inside the unit transformer.h", "nest"});
  });
}

void expect_same_weights(const RunResult& a, const RunResult& b, double rtol,
                         const std::string& what) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(test::tensors_close(b.params[i].second, a.params[i].second, rtol, 1e-12))
        << a.params[i].first << " " << what;
}

// Note [Sharded checkpoints]: two steps, a save, a new model and optimizer that load it and take
// three more: DDP's five steps, for each stage and both models.
TEST(Zero, ASaveAndALoadInTheMiddleChangeNothingInEachStage) {
  test::ScratchDir dir;
  for (Model kind : {Model::kGPT, Model::kResNet})
    for (int stage : {1, 2, 3}) {
      const std::string folder =
          dir.file(detail::str("stage", stage, kind == Model::kGPT ? "gpt" : "resnet"));
      test::run_ranks(
          2,
          [&](test::Rank& r) {
            auto group = test::gloo_group(r);
            const RunResult ddp = train(r, group, kind, 0);
            train(r, group, kind, stage, false,
                  {.first_step = 0, .last_step = 2, .load_from = "", .save_to = folder});
            const RunResult resumed =
                train(r, group, kind, stage, false,
                      {.first_step = 2, .last_step = 5, .load_from = folder, .save_to = ""});
            expect_same_weights(ddp, resumed, 1e-10, detail::str("stage ", stage));
          },
          std::chrono::seconds(120));
    }
}

// Resharding: ZeRO-3 on four ranks saves after two steps; two ranks load it and take three more,
// ending with DDP's weights on two ranks (the same global batches).
TEST(Zero, StageThreeResumesFromAFourRankCheckpointOnTwoRanks) {
  test::ScratchDir dir;
  const std::string folder = dir.file("four");
  test::run_ranks(4, [&](test::Rank& r) {
    train(r, test::gloo_group(r), Model::kGPT, 3, false,
          {.first_step = 0, .last_step = 2, .load_from = "", .save_to = folder});
  });
  EXPECT_TRUE(std::filesystem::exists(folder + "/shard-3-of-4.safetensors"));
  test::run_ranks(2, [&](test::Rank& r) {
    auto group = test::gloo_group(r);
    const RunResult ddp = train(r, group, Model::kGPT, 0);
    const RunResult resumed =
        train(r, group, Model::kGPT, 3, false,
              {.first_step = 2, .last_step = 5, .load_from = folder, .save_to = ""});
    expect_same_weights(ddp, resumed, 1e-10, "resharded 4 -> 2");
  });
}

TEST(Zero, AShardedCheckpointWithAShardMissingOrOfAnotherModelIsRefused) {
  test::ScratchDir dir;
  const std::string folder = dir.file("ckpt");
  test::run_ranks(2, [&](test::Rank& r) {
    train(r, test::gloo_group(r), Model::kGPT, 3, false,
          {.first_step = 0, .last_step = 1, .load_from = "", .save_to = folder});
  });
  std::filesystem::remove(folder + "/shard-1-of-2.safetensors");
  test::run_ranks(2, [&](test::Rank& r) {
    auto group = test::gloo_group(r);
    FullyShardedDataParallel fsdp(make_model(Model::kGPT), group);
    optim::SGD sgd(fsdp.optimizer_params(), {.lr = 0.1});
    EXPECT_LOOM_ERROR(load_sharded_checkpoint(folder, sharded_state(fsdp, sgd)), IOError,
                      {"shard 1 of 2 is missing", "shard-1-of-2.safetensors"});
    EXPECT_LOOM_ERROR(load_sharded_checkpoint(folder + "/nothing", sharded_state(fsdp, sgd)),
                      IOError, {"index.json", "not a sharded checkpoint"});
    // Another model: a ResNet's parameters against the GPT's checkpoint.
    FullyShardedDataParallel other(make_model(Model::kResNet), group);
    optim::SGD other_sgd(other.optimizer_params(), {.lr = 0.1});
    EXPECT_LOOM_ERROR(load_sharded_checkpoint(folder, sharded_state(other, other_sgd)), ValueError,
                      {"another model"});
  });
}

TEST(Zero, ThePiecesCoverEveryParameterOnceAcrossTheRanks) {
  test::run_ranks(3, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    nn::ModulePtr model = make_model(Model::kGPT);
    DistributedDataParallel ddp(model, group, {.first_bucket_bytes = 4096, .bucket_bytes = 8192});
    ZeroRedundancyOptimizer zero(ddp, [](std::vector<Tensor> pieces, const std::vector<size_t>&) {
      return std::make_unique<optim::SGD>(pieces, optim::SGDOptions{.lr = 0.1});
    });
    // Each rank's count of every parameter's elements, summed over ranks: each exactly once.
    const std::vector<Tensor>& params = ddp.reducer().params();
    Tensor counts = zeros({static_cast<int64_t>(params.size())}, kInt64);
    int64_t* c = counts.data_ptr<int64_t>();
    for (const ShardPiece& piece : zero.pieces()) c[piece.param] += piece.numel;
    group->allreduce(counts)->wait();
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(c[i], params[i].numel()) << i;
    EXPECT_GT(ddp.reducer().buckets().size(), 1u);
    EXPECT_NE(zero.plan().find("ZeRO-1"), std::string::npos) << zero.plan();
    EXPECT_NE(ddp.bucket_plan().find("reduce-scattered"), std::string::npos);
  });
}

TEST(Zero, BadInputRaisesTypedErrorsThatSayWhatToChange) {
  test::run_ranks(2, [](test::Rank& r) {
    auto group = test::gloo_group(r);
    auto sgd = [](std::vector<Tensor> pieces, const std::vector<size_t>&) {
      return std::make_unique<optim::SGD>(pieces, optim::SGDOptions{.lr = 0.1});
    };
    {
      DistributedDataParallel ddp(make_model(Model::kGPT), group);
      EXPECT_LOOM_ERROR(ZeroRedundancyOptimizer(ddp, sgd, {.stage = 3}), ValueError,
                        {"stage", "got 3", "FullyShardedDataParallel"});
      EXPECT_LOOM_ERROR(ZeroRedundancyOptimizer(ddp, sgd, {.stage = 0}), ValueError,
                        {"stage must be 1", "got 0"});
    }
    {
      DistributedDataParallel ddp(make_model(Model::kGPT), group);
      ddp.register_comm_hook(fp16_compress_hook());
      EXPECT_LOOM_ERROR(ZeroRedundancyOptimizer(ddp, sgd), ValueError,
                        {"comm hook", "fp16_compress", "reduce-scattered"});
    }
    {
      DistributedDataParallel ddp(make_model(Model::kGPT), group);
      ZeroRedundancyOptimizer zero(ddp, sgd, {.stage = 2});
      EXPECT_LOOM_ERROR(ddp.register_comm_hook(bf16_compress_hook()), ValueError,
                        {"ZeRO-2", "comm hooks do not apply"});
      NamedTensors tensors;
      optim::Metadata meta;
      EXPECT_LOOM_ERROR(zero.save_state(tensors, meta, "optimizer."), NotImplementedError,
                        {"sharded"});
    }
    // Ranks whose models differ (rank 1's GPT is wider): every rank refuses, naming the first
    // tensor that differs, before any collective reads the weights as flat bytes.
    auto model_of_this_rank = [&] {
      nn::ModulePtr model = make_model(Model::kGPT);
      if (r.rank == 1) {
        nn::GPTConfig c;
        c.vocab_size = 23;
        c.block_size = 8;
        c.n_embd = 16;
        c.n_layer = 2;
        c.n_head = 2;
        model = std::make_shared<nn::GPT>(c);
        model->to(kFloat64);
      }
      return model;
    };
    EXPECT_LOOM_ERROR(FullyShardedDataParallel(model_of_this_rank(), group), ValueError,
                      {"transformer.wte.weight"});
    EXPECT_LOOM_ERROR(DistributedDataParallel(model_of_this_rank(), group), ValueError,
                      {"transformer.wte.weight"});
  });
}

}  // namespace
}  // namespace loom::dist
