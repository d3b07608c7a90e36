// tests/optim/schedule_test.cpp — the learning-rate schedules against torch.optim.lr_scheduler's
// numbers (tests/golden/optim.safetensors), the step convention (lr_at(0) is the first step's
// lr), checkpoint round trips and the error paths.
#include "optim/schedule.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>

#include "optim/adam.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom::optim {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 30;
constexpr double kBaseLr = 0.1;

const SafetensorsFile& golden() {
  static const SafetensorsFile file =
      load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/optim.safetensors");
  return file;
}

std::unique_ptr<SGD> make_sgd(double lr = kBaseLr) {
  return std::make_unique<SGD>(std::vector<Tensor>{zeros({1}, kFloat64).requires_grad_()},
                               SGDOptions{.lr = lr});
}

using ScheduleFactory = std::function<std::unique_ptr<LRSchedule>(Optimizer&)>;

std::vector<std::pair<std::string, ScheduleFactory>> golden_cases() {
  return {
      {"step", [](Optimizer& o) { return std::make_unique<StepLR>(o, 7, 0.5); }},
      {"multistep",  // given out of order: sorted, the repeated milestone counts twice
       [](Optimizer& o) {
         return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{20, 12, 5, 12}, 0.3);
       }},
      {"cosine", [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 12, 0.001); }},
      {"warmup", [](Optimizer& o) { return std::make_unique<LinearWarmup>(o, 5, 0.1); }},
      {"warmup_cosine",
       [](Optimizer& o) {
         return std::make_unique<LinearWarmup>(o, 4, 0.25,
                                               std::make_unique<CosineAnnealingLR>(o, 26));
       }},
      {"onecycle", [](Optimizer& o) { return std::make_unique<OneCycleLR>(o, 0.5, 30); }},
      {"onecycle_three",
       [](Optimizer& o) {
         return std::make_unique<OneCycleLR>(o, 0.4, 30,
                                             OneCycleOptions{.pct_start = 0.25,
                                                             .anneal = Anneal::Linear,
                                                             .div_factor = 10,
                                                             .final_div_factor = 100,
                                                             .three_phase = true});
       }},
  };
}

TEST(ScheduleGolden, LrOfEveryStepMatchesPyTorch) {
  for (const auto& [name, make] : golden_cases()) {
    SCOPED_TRACE(name);
    auto sgd = make_sgd();
    auto schedule = make(*sgd);
    const std::vector<double> expected = golden().at("schedule." + name).to_vector<double>();
    ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(sgd->lr(), expected[s], 1e-10) << "step " << s;
      EXPECT_EQ(schedule->lr_at(s), sgd->lr()) << "step " << s;
      EXPECT_EQ(schedule->step_count(), s);
      schedule->step();
    }
    // The linear OneCycleLR extrapolates below zero at total_steps: the optimizer gets 0.
    EXPECT_EQ(sgd->lr(), std::max(schedule->lr_at(kSteps), 0.0));
  }
}

TEST(Schedule, LrAtZeroIsTheLrOfTheFirstOptimizerStep) {
  auto sgd = make_sgd(0.2);
  LinearWarmup warmup(*sgd, 4, 0.25);
  EXPECT_EQ(warmup.base_lr(), 0.2);
  EXPECT_EQ(warmup.name(), "LinearWarmup");
  Tensor p = sgd->params()[0];
  for (int s = 0; s < 3; ++s) {
    const double before = p.item();
    p.set_grad(ones({1}, kFloat64));
    sgd->step();
    warmup.step();
    EXPECT_DOUBLE_EQ(before - p.item(), warmup.lr_at(s)) << "step " << s;
  }
  EXPECT_DOUBLE_EQ(warmup.lr_at(0), 0.05);
  EXPECT_DOUBLE_EQ(warmup.lr_at(4), 0.2);
  EXPECT_DOUBLE_EQ(warmup.lr_at(1000), 0.2);
}

TEST(Schedule, OneCycleRefusesToGoPastItsEnd) {
  auto sgd = make_sgd(123.0);  // ignored: OneCycleLR starts at max_lr / div_factor
  OneCycleLR schedule(*sgd, 1.0, 10);
  EXPECT_NEAR(sgd->lr(), 0.04, 1e-15);
  EXPECT_DOUBLE_EQ(schedule.base_lr(), 0.04);
  for (int s = 0; s < 10; ++s) schedule.step();
  EXPECT_NEAR(sgd->lr(), schedule.lr_at(10), 0);  // step == total_steps is allowed, as in PyTorch
  const double lr = sgd->lr();
  EXPECT_LOOM_ERROR(schedule.step(), ValueError, {"OneCycleLR", "11", "total_steps=10"});
  EXPECT_EQ(schedule.step_count(), 10);
  EXPECT_EQ(sgd->lr(), lr);
}

class ScheduleStateTest : public ::testing::Test {
 protected:
  SafetensorsFile round_trip(const LRSchedule& schedule, const std::string& prefix) {
    NamedTensors tensors;
    Metadata meta;
    schedule.save_state(tensors, meta, prefix);
    EXPECT_TRUE(tensors.empty());
    save_safetensors(path_, tensors, meta);
    return load_safetensors(path_);
  }

  const test::ScratchDir dir_;  // Note [Test scratch directories]
  const std::string path_ = dir_.file("state.safetensors");
};

TEST_F(ScheduleStateTest, ResumingContinuesTheSameLrs) {
  for (const auto& [name, make] : golden_cases()) {
    SCOPED_TRACE(name);
    auto sgd = make_sgd();
    auto schedule = make(*sgd);
    for (int s = 0; s < 11; ++s) schedule->step();
    const SafetensorsFile file = round_trip(*schedule, "sched.");

    // Resumed on an optimizer with another lr (as after its own load_state): base_lr comes
    // from the checkpoint.
    auto other = make_sgd(0.7);
    auto resumed = make(*other);
    resumed->load_state(file, "sched.");
    EXPECT_EQ(resumed->step_count(), 11);
    EXPECT_EQ(other->lr(), sgd->lr());
    for (int s = 11; s < kSteps; ++s) {
      EXPECT_EQ(other->lr(), sgd->lr()) << "step " << s;
      schedule->step();
      resumed->step();
    }
  }
}

TEST_F(ScheduleStateTest, MismatchesRaise) {
  auto sgd = make_sgd();
  StepLR step(*sgd, 3);
  step.step();
  const SafetensorsFile file = round_trip(step, "s.");
  EXPECT_EQ(file.metadata.at("s.schedule"), "StepLR");
  EXPECT_EQ(file.metadata.at("s.step"), "1");
  EXPECT_EQ(file.metadata.at("s.base_lr"), "0.1");

  CosineAnnealingLR cosine(*sgd, 10);
  EXPECT_LOOM_ERROR(cosine.load_state(file, "s."), ValueError, {"CosineAnnealingLR", "StepLR"});
  EXPECT_LOOM_ERROR(step.load_state(file, "t."), ValueError, {"StepLR", "t.schedule"});
  // The warmup's inner schedule is saved under <prefix>after.: a file without it is refused.
  LinearWarmup warmup(*sgd, 2, 0.5, std::make_unique<StepLR>(*sgd, 3));
  EXPECT_LOOM_ERROR(warmup.load_state(file, "s."), ValueError, {"StepLR", "s.after.schedule"});

  Metadata bad = file.metadata;
  bad["s.step"] = "-2";
  save_safetensors(path_, {}, bad);
  EXPECT_LOOM_ERROR(step.load_state(load_safetensors(path_), "s."), ValueError,
                    {"StepLR", "s.step", "-2"});
  EXPECT_EQ(step.step_count(), 1);
}

TEST(Schedule, ConstructionErrors) {
  auto sgd = make_sgd();
  auto other = make_sgd();
  EXPECT_LOOM_ERROR(StepLR(*sgd, 0), ValueError, {"StepLR", "step_size=0"});
  EXPECT_LOOM_ERROR(StepLR(*sgd, 2, -0.5), ValueError, {"StepLR", "gamma=-0.5"});
  EXPECT_LOOM_ERROR(MultiStepLR(*sgd, {1, 2}, std::nan("")), ValueError, {"MultiStepLR", "gamma"});
  EXPECT_LOOM_ERROR(CosineAnnealingLR(*sgd, 0), ValueError, {"CosineAnnealingLR", "T_max=0"});
  EXPECT_LOOM_ERROR(CosineAnnealingLR(*sgd, 5, -1e-3), ValueError,
                    {"CosineAnnealingLR", "eta_min=-0.001"});
  EXPECT_LOOM_ERROR(LinearWarmup(*sgd, 0, 0.5), ValueError, {"LinearWarmup", "warmup_steps=0"});
  EXPECT_LOOM_ERROR(LinearWarmup(*sgd, 3, 0.0), ValueError, {"LinearWarmup", "start_factor=0"});
  EXPECT_LOOM_ERROR(LinearWarmup(*sgd, 3, 1.5), ValueError, {"LinearWarmup", "start_factor=1.5"});
  EXPECT_LOOM_ERROR(LinearWarmup(*sgd, 3, 0.5, std::make_unique<StepLR>(*other, 2)), ValueError,
                    {"LinearWarmup", "StepLR", "another optimizer"});
  EXPECT_LOOM_ERROR(OneCycleLR(*sgd, 1.0, 0), ValueError, {"OneCycleLR", "total_steps=0"});
  EXPECT_LOOM_ERROR(OneCycleLR(*sgd, 1.0, 10, {.pct_start = 1.5}), ValueError,
                    {"OneCycleLR", "pct_start=1.5"});
  EXPECT_LOOM_ERROR(OneCycleLR(*sgd, 1.0, 10, {.pct_start = 0.1}), ValueError,
                    {"OneCycleLR", "phase 0", "total_steps=10"});
  EXPECT_LOOM_ERROR(OneCycleLR(*sgd, 1.0, 10, {.div_factor = 0}), ValueError,
                    {"OneCycleLR", "div_factor=0"});
  StepLR step(*sgd, 2);
  EXPECT_LOOM_ERROR(step.lr_at(-1), ValueError, {"StepLR", "step=-1"});
}

TEST(ScheduleGolden, OneCycleCyclesMomentumLikePyTorch) {
  Tensor p = zeros({1}, kFloat64).requires_grad_();
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  Adam adam({zeros({1}, kFloat64).requires_grad_()}, {.lr = 0.1});
  OneCycleLR sgd_cycle(sgd, 0.5, 30, {.pct_start = 0.3});
  OneCycleLR adam_cycle(adam, 0.5, 30, {.pct_start = 0.3});
  const std::vector<double>
      sgd_lr = golden().at("schedule.onecycle_momentum.sgd.lr").to_vector<double>(),
      sgd_m = golden().at("schedule.onecycle_momentum.sgd.momentum").to_vector<double>(),
      adam_m = golden().at("schedule.onecycle_momentum.adam.momentum").to_vector<double>();
  for (int s = 0; s < 30; ++s) {
    EXPECT_NEAR(sgd.lr(), sgd_lr[s], 1e-12) << "step " << s;
    EXPECT_NEAR(sgd.momentum(), sgd_m[s], 1e-12) << "step " << s;
    EXPECT_NEAR(adam.momentum(), adam_m[s], 1e-12) << "step " << s;
    sgd_cycle.step();
    adam_cycle.step();
  }
  EXPECT_DOUBLE_EQ(sgd_m[0], 0.95);  // starts high, dips to base_momentum at the lr's peak
  // Without cycling the momentum stays where the optimizer had it.
  SGD fixed({zeros({1}, kFloat64).requires_grad_()}, {.lr = 0.1, .momentum = 0.9});
  OneCycleLR plain(fixed, 0.5, 30, {.cycle_momentum = false});
  plain.step();
  EXPECT_EQ(fixed.momentum(), 0.9);
}

}  // namespace
}  // namespace loom::optim
