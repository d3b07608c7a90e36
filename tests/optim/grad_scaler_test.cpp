// tests/optim/grad_scaler_test.cpp — GradScaler (Note [Dynamic loss scaling]): overflowing
// gradients skip the step and halve the scale, clean runs grow it, scaled steps equal plain ones
// bit for bit with power-of-two scales, the rank agreement decides, and the state survives
// save_state/load_state and checkpoints.

#include "optim/grad_scaler.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "optim/checkpoint.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/copy.h"
#include "tensor/view.h"
#include "test_util.h"

namespace loom::optim {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         a.to_vector<double>() == b.to_vector<double>();
}

// loss = sum(w * x) + sum(b * b) / 2 + sum(w * w) / 4: float32 parameters requiring grad.
struct TinyModel {
  Tensor w = tensor<float>({0.5f, -1.25f, 2.0f, 0.75f, -0.5f, 1.5f}, {2, 3}).requires_grad_();
  Tensor b = tensor<float>({0.25f, -2.0f}, {2}).requires_grad_();
  Tensor x = tensor<float>({1.0f, -3.0f, 0.5f, 2.0f, 0.125f, -1.0f}, {2, 3});

  std::vector<Tensor> params() const { return {w, b}; }
  Tensor loss() const { return sum(w * x) + sum(b * b) / 2.0 + sum(w * w) / 4.0; }
};

std::vector<Tensor> snapshot(const std::vector<Tensor>& params) {
  std::vector<Tensor> copies;
  for (const Tensor& p : params) copies.push_back(kernels::clone(p));
  return copies;
}

void expect_unchanged(const std::vector<Tensor>& params, const std::vector<Tensor>& before) {
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(same_bits(params[i], before[i])) << i;
}

// One scaled backward into fresh gradients.
void scaled_backward(const GradScaler& scaler, const TinyModel& model, Optimizer& opt) {
  opt.zero_grad();
  scaler.scale(model.loss()).backward();
}

// One clean iteration: backward, step, update.
void clean_iteration(GradScaler& scaler, const TinyModel& model, Optimizer& opt) {
  scaled_backward(scaler, model, opt);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

void inject(const Tensor& grad, int64_t index, float value) {
  grad.data_ptr<float>()[index] = value;  // CPU tensors: the test writes the element directly
}

// ---------------------------------------------------------------- skipping and backing off

void check_bad_value_skips(float bad) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler;
  clean_iteration(scaler, model, opt);
  ASSERT_EQ(scaler.growth_tracker(), 1);
  const std::vector<Tensor> before = snapshot(model.params());

  scaled_backward(scaler, model, opt);
  inject(model.w.grad(), 4, bad);
  EXPECT_FALSE(scaler.step(opt));
  expect_unchanged(model.params(), before);
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // update() changes it, not step()
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);

  clean_iteration(scaler, model, opt);  // the next clean step moves the parameters again
  EXPECT_FALSE(same_bits(model.w, before[0]));
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, InfGradientSkipsTheStepAndHalvesTheScale) { check_bad_value_skips(kInf); }
TEST(GradScaler, NegativeInfGradientSkipsTheStep) { check_bad_value_skips(-kInf); }
TEST(GradScaler, NaNGradientSkipsTheStepAndHalvesTheScale) { check_bad_value_skips(kNaN); }

TEST(GradScaler, LargeFiniteGradientsAreNotAnOverflow) {
  // sum(g) would overflow float32; sum(g * 0) does not.
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.0});
  GradScaler scaler({.init_scale = 1.0});
  scaled_backward(scaler, model, opt);
  for (int64_t i = 0; i < 6; ++i) inject(model.w.grad(), i, 3.0e38f);
  EXPECT_TRUE(scaler.step(opt));
}

TEST(GradScaler, GradientsThatOverflowWhenUnscaledAreAnOverflow) {
  // After many back-offs the scale can fall below 1: unscaling then multiplies, and a finite
  // gradient can leave float32's range. That step must be skipped, not taken with inf.
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 0.25});
  const std::vector<Tensor> before = snapshot(model.params());
  scaled_backward(scaler, model, opt);
  inject(model.b.grad(), 1, 1.0e38f);  // 4e38 when unscaled
  EXPECT_FALSE(scaler.step(opt));
  expect_unchanged(model.params(), before);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 0.125);
}

TEST(GradScaler, AnInfInAnyOptimizerBacksOffOnce) {
  TinyModel model;
  SGD opt_w({model.w}, {.lr = 0.1});
  SGD opt_b({model.b}, {.lr = 0.1});
  GradScaler scaler;
  const std::vector<Tensor> before = snapshot(model.params());
  model.loss().backward();
  inject(model.b.grad(), 0, kInf);
  EXPECT_TRUE(scaler.step(opt_w));
  EXPECT_FALSE(scaler.step(opt_b));
  EXPECT_FALSE(same_bits(model.w, before[0]));
  EXPECT_TRUE(same_bits(model.b, before[1]));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

// ---------------------------------------------------------------- growth

TEST(GradScaler, TwoThousandCleanStepsDoubleTheScaleOnce) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 1e-4});
  GradScaler scaler;
  for (int i = 0; i < 1999; ++i) clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 1999);
  clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.get_scale(), 131072.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, ShortGrowthIntervalAndAnInfResettingTheTracker) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 8.0, .growth_interval = 3});
  const std::vector<double> expected = {8, 8, 16, 16, 16, 32};
  for (double scale : expected) {
    clean_iteration(scaler, model, opt);
    EXPECT_EQ(scaler.get_scale(), scale);
  }
  clean_iteration(scaler, model, opt);
  clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  scaled_backward(scaler, model, opt);
  inject(model.w.grad(), 0, kInf);
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // Three clean steps are needed again, not one.
  clean_iteration(scaler, model, opt);
  clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.get_scale(), 16.0);
  clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.get_scale(), 32.0);
}

TEST(GradScaler, OtherFactors) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 1e-3});
  GradScaler scaler(
      {.init_scale = 100.0, .growth_factor = 3.0, .backoff_factor = 0.25, .growth_interval = 1});
  clean_iteration(scaler, model, opt);
  EXPECT_EQ(scaler.get_scale(), 300.0);
  scaled_backward(scaler, model, opt);
  inject(model.b.grad(), 1, kNaN);
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 75.0);
}

TEST(GradScaler, TheScaleStopsGrowingBelowFloat32Overflow) {
  // No backward (the gradients would overflow at such scales): the parameters have no gradient,
  // which makes clean iterations.
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 0x1p126, .growth_interval = 1});
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 0x1p127);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();  // 2^128 is inf in float32
  EXPECT_EQ(scaler.get_scale(), 0x1p127);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

// ---------------------------------------------------------------- unscaling

TEST(GradScaler, UnscaleDividesTheGradientsExactly) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  model.loss().backward();
  const std::vector<Tensor> plain = {model.w.grad(), model.b.grad()};

  GradScaler scaler;
  scaled_backward(scaler, model, opt);
  EXPECT_FALSE(same_bits(model.w.grad(), plain[0]));
  scaler.unscale_(opt);
  EXPECT_TRUE(same_bits(model.w.grad(), plain[0]));
  EXPECT_TRUE(same_bits(model.b.grad(), plain[1]));

  // step() after unscale_ does not divide again: the update is the plain one.
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(same_bits(model.w.grad(), plain[0]));
  TinyModel plain_model;
  SGD plain_opt(plain_model.params(), {.lr = 0.1});
  plain_model.loss().backward();
  plain_opt.step();
  EXPECT_TRUE(same_bits(model.w, plain_model.w));
  EXPECT_TRUE(same_bits(model.b, plain_model.b));
}

TEST(GradScaler, UnscaleTwiceInOneIterationIsRefused) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  GradScaler scaler;
  scaled_backward(scaler, model, opt);
  scaler.unscale_(opt);
  EXPECT_LOOM_ERROR(scaler.unscale_(opt), ValueError, {"GradScaler", "unscale_", "SGD"});
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_LOOM_ERROR(scaler.unscale_(opt), ValueError, {"GradScaler", "unscale_"});
  EXPECT_LOOM_ERROR(scaler.step(opt), ValueError, {"GradScaler", "step"});
  scaler.update();
  scaled_backward(scaler, model, opt);
  scaler.unscale_(opt);  // a new iteration
}

TEST(GradScaler, UpdateWithoutAStepIsRefused) {
  GradScaler scaler;
  EXPECT_LOOM_ERROR(scaler.update(), ValueError, {"GradScaler", "update"});
}

TEST(GradScaler, ClipAfterUnscaleSeesTheUnscaledNorm) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  model.loss().backward();
  const double plain_norm = clip_grad_norm_(model.params(), 1e9);

  GradScaler scaler;
  scaled_backward(scaler, model, opt);
  scaler.unscale_(opt);
  const double norm = clip_grad_norm_(model.params(), 1.0);
  EXPECT_EQ(norm, plain_norm);
  ASSERT_GT(norm, 1.0);
  EXPECT_NEAR(clip_grad_norm_(model.params(), 1e9), 1.0, 1e-5);  // clipped to max_norm
  EXPECT_TRUE(scaler.step(opt));
}

TEST(GradScaler, ParametersWithoutAGradientAreSkipped) {
  TinyModel model;
  const Tensor unused = zeros({3}).requires_grad_();
  SGD opt({model.w, unused, model.b}, {.lr = 0.1});
  GradScaler scaler;
  scaled_backward(scaler, model, opt);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_FALSE(unused.grad().defined());
  scaler.update();
}

TEST(GradScaler, NonContiguousFloat64GradientViews) {
  // Gradients may be views into a bucket buffer (DDP): a transposed view, and a float64 one.
  Tensor p = zeros({2, 3}, kFloat64);
  p.requires_grad_();
  const Tensor bucket = tensor<double>({8, -16, 32, 64, 0.5, 1}, {3, 2});
  p.set_grad(kernels::transpose(bucket, 0, 1));
  ASSERT_FALSE(p.grad().is_contiguous());
  SGD opt({p}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 8.0});
  scaler.unscale_(opt);
  EXPECT_TRUE(test::values_are(bucket, {1, -2, 4, 8, 0.0625, 0.125}, 0.0));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(test::values_are(p, {-1, -4, -0.0625, 2, -8, -0.125}, 0.0));
  scaler.update();

  kernels::fill_(bucket, 1.0);
  bucket.data_ptr<double>()[3] = std::numeric_limits<double>::infinity();
  scaler.unscale_(opt);
  EXPECT_FALSE(scaler.step(opt));
}

// ---------------------------------------------------------------- equal to a plain step

TEST(GradScaler, ScaledStepsEqualPlainStepsBitForBit) {
  TinyModel scaled_model, plain_model;
  const SGDOptions options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true};
  SGD scaled_opt(scaled_model.params(), options);
  SGD plain_opt(plain_model.params(), options);
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});  // the scale changes on the way
  for (int i = 0; i < 5; ++i) {
    scaled_backward(scaler, scaled_model, scaled_opt);
    EXPECT_TRUE(scaler.step(scaled_opt));
    scaler.update();
    plain_opt.zero_grad();
    plain_model.loss().backward();
    plain_opt.step();
    EXPECT_TRUE(same_bits(scaled_model.w, plain_model.w)) << "step " << i;
    EXPECT_TRUE(same_bits(scaled_model.b, plain_model.b)) << "step " << i;
  }
  EXPECT_EQ(scaler.get_scale(), 4096.0);
}

// ---------------------------------------------------------------- agreement across ranks

TEST(GradScaler, TheAgreedFlagDecides) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  GradScaler scaler;
  std::vector<bool> seen;
  bool other_rank_overflowed = false;
  scaler.set_found_inf_agreement([&](bool local) {
    seen.push_back(local);
    return local || other_rank_overflowed;
  });

  clean_iteration(scaler, model, opt);  // step() unscales: one call
  scaled_backward(scaler, model, opt);
  scaler.unscale_(opt);  // explicit unscale_, then step(): still one call
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(seen, (std::vector<bool>{false, false}));

  scaled_backward(scaler, model, opt);
  inject(model.w.grad(), 2, kInf);
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(seen, (std::vector<bool>{false, false, true}));

  // This rank's gradients are finite but another rank's overflowed: skip all the same.
  other_rank_overflowed = true;
  const std::vector<Tensor> before = snapshot(model.params());
  scaled_backward(scaler, model, opt);
  EXPECT_FALSE(scaler.step(opt));
  expect_unchanged(model.params(), before);
  scaler.update();
  EXPECT_EQ(seen, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(scaler.get_scale(), 16384.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

// ---------------------------------------------------------------- disabled

TEST(GradScaler, DisabledScalerIsTransparent) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 0.1});
  GradScaler scaler({.enabled = false});
  int calls = 0;
  scaler.set_found_inf_agreement([&](bool local) {
    ++calls;
    return local;
  });
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  const Tensor loss = model.loss();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  inject(model.w.grad(), 0, kInf);  // not checked: a disabled scaler steps
  scaler.unscale_(opt);
  const Tensor b0 = kernels::clone(model.b);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_FALSE(same_bits(model.b, b0));
  scaler.update();
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(calls, 0);
}

// ---------------------------------------------------------------- state

TEST(GradScaler, StateRoundTripsThroughSaveAndLoadState) {
  TinyModel model;
  SGD opt(model.params(), {.lr = 1e-3});
  GradScaler scaler(
      {.init_scale = 256.0, .growth_factor = 1.5, .backoff_factor = 0.3, .growth_interval = 4});
  for (int i = 0; i < 6; ++i) clean_iteration(scaler, model, opt);
  ASSERT_EQ(scaler.get_scale(), 384.0);
  ASSERT_EQ(scaler.growth_tracker(), 2);

  SafetensorsFile file;
  scaler.save_state(file.tensors, file.metadata, "amp.");
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_EQ(file.metadata.at("amp.scale"), "384");
  EXPECT_EQ(file.metadata.at("amp.growth_tracker"), "2");
  EXPECT_EQ(file.metadata.at("amp.enabled"), "true");

  GradScaler restored;
  restored.load_state(file, "amp.");
  EXPECT_EQ(restored.get_scale(), 384.0);
  EXPECT_EQ(restored.growth_tracker(), 2);
  EXPECT_EQ(restored.options().growth_factor, 1.5);
  EXPECT_EQ(restored.options().backoff_factor, 0.3);  // exact: written to round-trip
  EXPECT_EQ(restored.options().growth_interval, 4);
  // Both go on alike: two more clean steps grow the scale.
  for (GradScaler* s : {&scaler, &restored}) {
    clean_iteration(*s, model, opt);
    clean_iteration(*s, model, opt);
    EXPECT_EQ(s->get_scale(), 576.0);
  }
}

TEST(GradScaler, LoadStateChecksEveryKeyBeforeChangingAnything) {
  GradScaler source({.init_scale = 32.0});
  SafetensorsFile good;
  source.save_state(good.tensors, good.metadata, "scaler.");

  for (const char* key : {"scale", "growth_tracker", "growth_factor", "backoff_factor",
                          "growth_interval", "enabled"}) {
    SafetensorsFile file = good;
    file.metadata.erase(std::string("scaler.") + key);
    GradScaler scaler;
    EXPECT_LOOM_ERROR(scaler.load_state(file, "scaler."), ValueError,
                      {"GradScaler", std::string("scaler.") + key});
    EXPECT_EQ(scaler.get_scale(), 65536.0);
  }
  struct Bad {
    const char* key;
    const char* value;
  };
  for (const Bad& bad :
       {Bad{"scale", "abc"}, Bad{"scale", "-1"}, Bad{"scale", "inf"}, Bad{"growth_tracker", "1.5"},
        Bad{"growth_tracker", "-1"}, Bad{"growth_tracker", "2000"}, Bad{"growth_factor", "1"},
        Bad{"backoff_factor", "1"}, Bad{"growth_interval", "0"}, Bad{"enabled", "yes"}}) {
    SCOPED_TRACE(std::string(bad.key) + "=" + bad.value);
    SafetensorsFile file = good;
    file.metadata[std::string("scaler.") + bad.key] = bad.value;
    GradScaler scaler;
    EXPECT_LOOM_ERROR(scaler.load_state(file, "scaler."), ValueError,
                      {"GradScaler", std::string("scaler.") + bad.key});
    EXPECT_EQ(scaler.get_scale(), 65536.0);
  }
}

TEST(GradScaler, LoadStateKeepsEnabled) {
  GradScaler disabled({.init_scale = 4.0, .enabled = false});
  SafetensorsFile file;
  disabled.save_state(file.tensors, file.metadata, "");
  GradScaler scaler;
  scaler.load_state(file, "");
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

// ---------------------------------------------------------------- checkpoints

TEST(GradScaler, StateRoundTripsThroughCheckpoints) {
  manual_seed(3);
  auto net = nn::make<nn::Linear>(3, 2);
  SGD opt(net->parameters(), {.lr = 0.01});
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  const Tensor x = randn({4, 3});
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    scaler.scale(sum(net->forward(x))).backward();
    if (i == 1) inject(net->parameters()[0].grad(), 0, kNaN);
    EXPECT_EQ(scaler.step(opt), i != 1);
    scaler.update();
  }
  ASSERT_EQ(scaler.get_scale(), 1024.0);  // halved at step 1, doubled at step 4
  ASSERT_EQ(scaler.growth_tracker(), 0);
  opt.zero_grad();
  scaler.scale(sum(net->forward(x))).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  ASSERT_EQ(scaler.growth_tracker(), 1);

  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("roundtrip.safetensors");
  save_checkpoint(path, *net, opt, nullptr, {.step = 6}, {}, &scaler);
  EXPECT_EQ(read_checkpoint_metadata(path).at("scaler.scale"), "1024");

  auto net2 = nn::make<nn::Linear>(3, 2);
  SGD opt2(net2->parameters(), {.lr = 0.01});
  GradScaler restored({.growth_interval = 3});
  const TrainingProgress progress = load_checkpoint(path, *net2, &opt2, nullptr, true, &restored);
  EXPECT_EQ(progress.step, 6);
  EXPECT_EQ(restored.get_scale(), 1024.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_TRUE(same_bits(net2->parameters()[0], net->parameters()[0]));
}

TEST(GradScaler, CheckpointWithoutScalerKeysIsRefusedBeforeAnythingLoads) {
  manual_seed(4);
  auto net = nn::make<nn::Linear>(3, 2);
  SGD opt(net->parameters(), {.lr = 0.01});
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("no_scaler.safetensors");
  save_checkpoint(path, *net, opt, nullptr, {.step = 1});  // the existing call, no scaler

  auto net2 = nn::make<nn::Linear>(3, 2);
  const Tensor weight_before = kernels::clone(net2->parameters()[0]);
  SGD opt2(net2->parameters(), {.lr = 0.01});
  GradScaler scaler;
  EXPECT_LOOM_ERROR(load_checkpoint(path, *net2, &opt2, nullptr, true, &scaler), ValueError,
                    {"GradScaler", "scaler."});
  EXPECT_TRUE(same_bits(net2->parameters()[0], weight_before));  // the model did not change
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  load_checkpoint(path, *net2, &opt2);  // without a scaler it loads
}

// ---------------------------------------------------------------- options

TEST(GradScaler, BadOptionsAreRefused) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_LOOM_ERROR(GradScaler({.init_scale = 0.0}), ValueError, {"GradScaler", "scale"});
  EXPECT_LOOM_ERROR(GradScaler({.init_scale = -2.0}), ValueError, {"GradScaler", "scale"});
  EXPECT_LOOM_ERROR(GradScaler({.init_scale = inf}), ValueError, {"GradScaler", "scale"});
  EXPECT_LOOM_ERROR(GradScaler({.init_scale = nan}), ValueError, {"GradScaler", "scale"});
  EXPECT_LOOM_ERROR(GradScaler({.growth_factor = 1.0}), ValueError,
                    {"GradScaler", "growth_factor"});
  EXPECT_LOOM_ERROR(GradScaler({.growth_factor = nan}), ValueError,
                    {"GradScaler", "growth_factor"});
  EXPECT_LOOM_ERROR(GradScaler({.backoff_factor = 0.0}), ValueError,
                    {"GradScaler", "backoff_factor"});
  EXPECT_LOOM_ERROR(GradScaler({.backoff_factor = 1.0}), ValueError,
                    {"GradScaler", "backoff_factor"});
  EXPECT_LOOM_ERROR(GradScaler({.backoff_factor = nan}), ValueError,
                    {"GradScaler", "backoff_factor"});
  EXPECT_LOOM_ERROR(GradScaler({.growth_interval = 0}), ValueError,
                    {"GradScaler", "growth_interval"});
}

}  // namespace
}  // namespace loom::optim
