// tests/optim/optim_test.cpp — SGD, Adam, AdamW and clip_grad_norm_ against PyTorch's numbers
// (tests/golden/optim.safetensors, written by tools/make_optim_golden.py), checkpoint round trips,
// zero_grad, parameters without gradients, float32, version counters and the error paths.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>

#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom::optim {
namespace {

namespace fs = std::filesystem;
using test::tensors_close;

constexpr int kSteps = 5;
constexpr int kParams = 3;
constexpr double kTol = 1e-10;

const SafetensorsFile& golden() {
  static const SafetensorsFile file =
      load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/optim.safetensors");
  return file;
}

std::string key(const std::string& what, int step, int i) {
  return what + "." + std::to_string(step) + "." + std::to_string(i);
}

// Fresh leaves holding the golden initial values, in `dtype`.
std::vector<Tensor> initial_params(DType dtype = kFloat64) {
  std::vector<Tensor> params;
  for (int i = 0; i < kParams; ++i) {
    Tensor p = golden().at("initial." + std::to_string(i)).to(dtype).clone();
    p.requires_grad_();
    params.push_back(p);
  }
  return params;
}

// Gives each parameter the golden gradient of `step` (none where the file has none).
void set_step_grads(std::vector<Tensor>& params, int step) {
  for (int i = 0; i < kParams; ++i) {
    const std::string name = key("grad", step, i);
    params[i].set_grad(golden().contains(name) ? golden().at(name).to(params[i].dtype()).clone()
                                               : Tensor());
  }
}

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

struct Case {
  std::string name;
  Factory make;
};

std::vector<Case> golden_cases() {
  return {
      {"sgd_plain", [](auto p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1}); }},
      {"sgd_momentum",
       [](auto p) {
         return std::make_unique<SGD>(
             p, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"sgd_nesterov",
       [](auto p) {
         return std::make_unique<SGD>(
             p, SGDOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true});
       }},
      {"adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions{.lr = 0.01}); }},
      {"adam_amsgrad",
       [](auto p) {
         return std::make_unique<Adam>(p, AdamOptions{.lr = 0.02,
                                                      .beta1 = 0.8,
                                                      .beta2 = 0.99,
                                                      .eps = 1e-6,
                                                      .weight_decay = 0.1,
                                                      .amsgrad = true});
       }},
      {"adamw",
       [](auto p) {
         return std::make_unique<AdamW>(p, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
       }},
      {"adamw_amsgrad",
       [](auto p) {
         return std::make_unique<AdamW>(
             p, AdamWOptions{.lr = 0.03, .beta1 = 0.85, .beta2 = 0.95, .amsgrad = true});
       }},
  };
}

// ---------------------------------------------------------------- against PyTorch

TEST(OptimGolden, EveryStepMatchesPyTorchInFloat64) {
  for (const Case& c : golden_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> params = initial_params();
    auto optimizer = c.make(params);
    for (int step = 0; step < kSteps; ++step) {
      set_step_grads(params, step);
      optimizer->step();
      for (int i = 0; i < kParams; ++i)
        EXPECT_TRUE(tensors_close(params[i], golden().at(key(c.name, step, i)), 0, kTol))
            << "step " << step << " parameter " << i;
    }
    // Parameter 2 had gradients at two steps only: it took two steps, the others five.
    EXPECT_EQ(optimizer->param_steps(0), kSteps);
    EXPECT_EQ(optimizer->param_steps(2), 2);
  }
}

TEST(OptimGolden, Float32ParametersFollowTheSameTrajectory) {
  for (const Case& c : golden_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> params = initial_params(kFloat32);
    auto optimizer = c.make(params);
    for (int step = 0; step < kSteps; ++step) {
      set_step_grads(params, step);
      optimizer->step();
    }
    for (int i = 0; i < kParams; ++i) {
      EXPECT_EQ(params[i].dtype(), kFloat32);
      EXPECT_TRUE(tensors_close(params[i], golden().at(key(c.name, kSteps - 1, i)), 1e-4, 1e-5));
    }
  }
}

// Large parameters go through the threaded, blocked paths: compare with plain loops.
TEST(OptimReference, LargeParametersMatchPlainLoops) {
  const int64_t n = 100003;  // several thread chunks and sqrt blocks, and a ragged tail
  const std::vector<double> p0 = randn({n}, kFloat64).to_vector<double>();
  std::vector<std::vector<double>> grads;
  for (int step = 0; step < 3; ++step) grads.push_back(randn({n}, kFloat64).to_vector<double>());

  auto run = [&](Optimizer& optimizer, Tensor& p) {
    for (int step = 0; step < 3; ++step) {
      p.set_grad(tensor<double>(grads[step]));
      optimizer.step();
    }
  };
  {  // SGD, Nesterov, weight decay
    Tensor p = tensor<double>(p0).requires_grad_();
    SGD sgd({p}, SGDOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true});
    run(sgd, p);
    std::vector<double> ref = p0, buf(n);
    for (int step = 0; step < 3; ++step)
      for (int64_t j = 0; j < n; ++j) {
        double d = grads[step][j] + 0.02 * ref[j];
        buf[j] = step == 0 ? d : 0.8 * buf[j] + d;
        d = d + 0.8 * buf[j];
        ref[j] -= 0.05 * d;
      }
    EXPECT_TRUE(test::values_are(p, ref, 1e-12));
  }
  for (bool decoupled : {false, true}) {  // Adam with L2 and AMSGrad; AdamW
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    Tensor p = tensor<double>(p0).requires_grad_();
    std::unique_ptr<Optimizer> adam;
    if (decoupled)
      adam = std::make_unique<AdamW>(std::vector<Tensor>{p},
                                     AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    else
      adam = std::make_unique<Adam>(std::vector<Tensor>{p},
                                    AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
    run(*adam, p);
    std::vector<double> ref = p0, m(n, 0.0), v(n, 0.0), vmax(n, 0.0);
    for (int step = 0; step < 3; ++step) {
      const double t = step + 1, bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
      for (int64_t j = 0; j < n; ++j) {
        double g = grads[step][j];
        if (decoupled)
          ref[j] *= 1 - 0.01 * 0.1;
        else
          g += 0.1 * ref[j];
        m[j] = 0.9 * m[j] + 0.1 * g;
        v[j] = 0.999 * v[j] + 0.001 * g * g;
        vmax[j] = std::max(vmax[j], v[j]);
        const double second = decoupled ? v[j] : vmax[j];
        ref[j] -= 0.01 / bc1 * m[j] / (std::sqrt(second) / std::sqrt(bc2) + 1e-8);
      }
    }
    EXPECT_TRUE(test::values_are(p, ref, 1e-12));
  }
}

// ---------------------------------------------------------------- checkpoints

class OptimStateTest : public ::testing::Test {
 protected:
  // save_state -> file -> load_safetensors
  SafetensorsFile round_trip(const Optimizer& optimizer, const std::string& prefix) {
    NamedTensors tensors;
    Metadata meta;
    optimizer.save_state(tensors, meta, prefix);
    save_safetensors(path_, tensors, meta);
    return load_safetensors(path_);
  }

  const test::ScratchDir dir_;  // Note [Test scratch directories]
  const std::string path_ = dir_.file("state.safetensors");
};

std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor c = p.detach().clone();
    c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

TEST_F(OptimStateTest, ResumingGivesTheUninterruptedTrajectory) {
  for (const Case& c : golden_cases()) {
    SCOPED_TRACE(c.name);
    // Interrupted after two steps: parameter 2 has no state yet (its first gradient is at step 2).
    std::vector<Tensor> params = initial_params();
    auto first = c.make(params);
    for (int step = 0; step < 2; ++step) {
      set_step_grads(params, step);
      first->step();
    }
    const SafetensorsFile file = round_trip(*first, "optimizer.");
    EXPECT_FALSE(file.contains("optimizer.state.2.step"));

    // A fresh optimizer on copies of the parameters, built with other hyper-parameters: the
    // checkpoint restores them, as PyTorch's load_state_dict restores the param groups.
    std::vector<Tensor> resumed = copies(params);
    std::unique_ptr<Optimizer> second;
    if (c.name.rfind("sgd", 0) == 0)
      second = std::make_unique<SGD>(resumed, SGDOptions{.lr = 3.0});
    else if (c.name.rfind("adamw", 0) == 0)
      second = std::make_unique<AdamW>(resumed, AdamWOptions{.lr = 3.0, .beta1 = 0.1});
    else
      second = std::make_unique<Adam>(resumed, AdamOptions{.lr = 3.0, .eps = 0.5});
    second->load_state(file, "optimizer.");
    EXPECT_EQ(second->lr(), first->lr());
    EXPECT_EQ(second->param_steps(0), 2);

    for (int step = 2; step < kSteps; ++step) {
      set_step_grads(params, step);
      set_step_grads(resumed, step);
      first->step();
      second->step();
    }
    for (int i = 0; i < kParams; ++i) {
      EXPECT_TRUE(tensors_close(resumed[i], params[i], 0, 0)) << "parameter " << i;
      EXPECT_TRUE(tensors_close(resumed[i], golden().at(key(c.name, kSteps - 1, i)), 0, kTol));
    }
  }
}

TEST_F(OptimStateTest, SavesBuffersStepsAndHyperParameters) {
  std::vector<Tensor> params = initial_params();
  Adam adam(params, AdamOptions{.lr = 0.02, .beta2 = 0.98, .amsgrad = true});
  set_step_grads(params, 0);
  adam.step();
  NamedTensors tensors;
  Metadata meta;
  adam.save_state(tensors, meta, "opt/");
  EXPECT_EQ(meta.at("opt/optimizer"), "Adam");
  EXPECT_EQ(meta.at("opt/num_params"), "3");
  EXPECT_EQ(meta.at("opt/lr"), "0.02");
  EXPECT_EQ(meta.at("opt/beta2"), "0.98");
  EXPECT_EQ(meta.at("opt/amsgrad"), "true");
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"opt/state.0.exp_avg", "opt/state.0.exp_avg_sq",
                                             "opt/state.0.max_exp_avg_sq", "opt/state.0.step",
                                             "opt/state.1.exp_avg", "opt/state.1.exp_avg_sq",
                                             "opt/state.1.max_exp_avg_sq", "opt/state.1.step"}));
  EXPECT_EQ(tensors[3].second.dtype(), kInt64);
  EXPECT_EQ(tensors[3].second.item<int64_t>(), 1);
  EXPECT_EQ(tensors[0].second.sizes(), (Shape{3, 4}));

  // Numbers round-trip exactly through their text.
  EXPECT_EQ(parse_double(format_double(0.1 + 0.2), "x"), 0.1 + 0.2);
  EXPECT_EQ(parse_double(format_double(1e-300 / 3), "x"), 1e-300 / 3);
  EXPECT_LOOM_ERROR(parse_double("0.1x", "what"), ValueError, {"what", "0.1x"});
}

TEST_F(OptimStateTest, Float32StateLoadsIntoFloat64Parameters) {
  std::vector<Tensor> params = initial_params(kFloat32);
  SGD sgd(params, SGDOptions{.lr = 0.1, .momentum = 0.5});
  set_step_grads(params, 0);
  sgd.step();
  const SafetensorsFile file = round_trip(sgd, "");
  std::vector<Tensor> wide;
  for (const Tensor& p : params) wide.push_back(p.detach().to(kFloat64).clone().requires_grad_());
  SGD other(wide, SGDOptions{.lr = 0.1});
  other.load_state(file, "");
  EXPECT_EQ(other.options().momentum, 0.5);
  set_step_grads(params, 1);
  set_step_grads(wide, 1);
  sgd.step();
  other.step();
  // Only the momentum buffer came from the float32 run: the float64 run stays close.
  EXPECT_TRUE(tensors_close(wide[0], params[0].to(kFloat64), 1e-5, 1e-5));
}

TEST_F(OptimStateTest, MismatchesRaiseAndChangeNothing) {
  std::vector<Tensor> params = initial_params();
  Adam adam(params, AdamOptions{.lr = 0.01});
  set_step_grads(params, 0);
  adam.step();
  const SafetensorsFile file = round_trip(adam, "o.");

  // Shapes: the same count, parameter 0 transposed.
  std::vector<Tensor> other = {zeros({4, 3}, kFloat64).requires_grad_(),
                               zeros({5}, kFloat64).requires_grad_(),
                               zeros({2}, kFloat64).requires_grad_()};
  Adam transposed(other, AdamOptions{.lr = 0.5});
  EXPECT_LOOM_ERROR(transposed.load_state(file, "o."), ValueError,
                    {"Adam", "o.state.0.exp_avg", "[3, 4]", "[4, 3]"});
  EXPECT_EQ(transposed.lr(), 0.5);  // nothing changed
  EXPECT_EQ(transposed.param_steps(1), 0);

  // Count.
  Adam fewer({zeros({3, 4}, kFloat64).requires_grad_()});
  EXPECT_LOOM_ERROR(fewer.load_state(file, "o."), ValueError, {"Adam", "num_params=3", "1"});
  // Class.
  SGD sgd(initial_params(), SGDOptions{.lr = 0.1});
  EXPECT_LOOM_ERROR(sgd.load_state(file, "o."), ValueError, {"SGD", "Adam"});
  AdamW adamw(initial_params());
  EXPECT_LOOM_ERROR(adamw.load_state(file, "o."), ValueError, {"AdamW", "Adam"});
  // Prefix.
  Adam fresh(initial_params());
  EXPECT_LOOM_ERROR(fresh.load_state(file, "x."), ValueError, {"Adam", "x.optimizer"});

  // A missing buffer and a missing hyper-parameter.
  NamedTensors tensors;
  Metadata meta;
  adam.save_state(tensors, meta, "o.");
  NamedTensors without_sq;
  for (const auto& entry : tensors)
    if (entry.first != "o.state.1.exp_avg_sq") without_sq.push_back(entry);
  save_safetensors(path_, without_sq, meta);
  EXPECT_LOOM_ERROR(fresh.load_state(load_safetensors(path_), "o."), ValueError,
                    {"Adam", "o.state.1.exp_avg_sq"});
  Metadata without_beta = meta;
  without_beta.erase("o.beta1");
  save_safetensors(path_, tensors, without_beta);
  EXPECT_LOOM_ERROR(fresh.load_state(load_safetensors(path_), "o."), ValueError,
                    {"Adam", "o.beta1"});
  Metadata bad_beta = meta;
  bad_beta["o.beta1"] = "1.5";
  save_safetensors(path_, tensors, bad_beta);
  EXPECT_LOOM_ERROR(fresh.load_state(load_safetensors(path_), "o."), ValueError,
                    {"Adam", "beta1", "1.5"});
  EXPECT_EQ(fresh.options().beta1, 0.9);
  EXPECT_EQ(fresh.param_steps(0), 0);
}

// ---------------------------------------------------------------- behaviour

TEST(Optim, ZeroGradDropsOrZeroesGradients) {
  std::vector<Tensor> params = initial_params();
  SGD sgd(params, SGDOptions{.lr = 0.1});
  set_step_grads(params, 0);
  const Tensor g0 = params[0].grad();
  sgd.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(params[0].grad().is_same(g0));
  EXPECT_TRUE(test::values_are(params[0].grad(), std::vector<double>(12, 0.0), 0));
  EXPECT_FALSE(params[2].grad().defined());  // had none, still none
  sgd.zero_grad();
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
}

TEST(Optim, ParametersWithoutGradientsAreSkipped) {
  std::vector<Tensor> params = initial_params();
  const Tensor before = params[1].detach().clone();
  Adam adam(params, AdamOptions{.lr = 0.1, .weight_decay = 0.5});
  const uint64_t version0 = params[0].version(), version1 = params[1].version();
  params[0].set_grad(ones({3, 4}, kFloat64));
  adam.step();
  EXPECT_TRUE(tensors_close(params[1], before, 0, 0));  // weight decay does not touch it either
  EXPECT_EQ(params[1].version(), version1);
  EXPECT_GT(params[0].version(), version0);
  EXPECT_EQ(adam.param_steps(0), 1);
  EXPECT_EQ(adam.param_steps(1), 0);
  adam.zero_grad();
  const Tensor after = params[0].detach().clone();
  adam.step();  // nothing has a gradient: nothing moves
  EXPECT_TRUE(tensors_close(params[0], after, 0, 0));
}

TEST(Optim, StepBumpsTheVersionSoAutogradSeesTheChange) {
  Tensor p = test::dparam({4});
  SGD sgd({p}, SGDOptions{.lr = 0.1});
  Tensor y = (p * p).sum();  // saves p
  p.set_grad(ones({4}, kFloat64));
  sgd.step();
  EXPECT_THROW(y.backward(), AutogradError);
}

TEST(Optim, NonContiguousParametersAreUpdatedInPlace) {
  Tensor storage = randn({4, 3}, kFloat64);
  Tensor p = storage.t();  // [3, 4], strides [1, 3]
  p.requires_grad_();
  ASSERT_FALSE(p.is_contiguous());
  Tensor q = p.detach().contiguous().clone();
  q.requires_grad_();
  const Tensor g = randn({3, 4}, kFloat64);
  SGD a({p}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  SGD b({q}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 2; ++step) {
    p.set_grad(g.clone());
    q.set_grad(g.clone());
    a.step();
    b.step();
  }
  EXPECT_TRUE(tensors_close(p, q, 0, 0));
  EXPECT_TRUE(tensors_close(storage.t(), q, 0, 0));  // written through to the storage
}

TEST(Optim, LrAndOptions) {
  std::vector<Tensor> params = initial_params();
  AdamW adamw(params);
  EXPECT_EQ(adamw.name(), "AdamW");
  EXPECT_EQ(adamw.lr(), 1e-3);
  EXPECT_EQ(adamw.options().weight_decay, 1e-2);
  adamw.set_lr(0.25);
  EXPECT_EQ(adamw.lr(), 0.25);
  EXPECT_EQ(adamw.options().lr, 0.25);
  EXPECT_EQ(adamw.params().size(), 3u);
  EXPECT_TRUE(adamw.params()[1].is_same(params[1]));
  EXPECT_LOOM_ERROR(adamw.set_lr(-1), ValueError, {"AdamW", "lr=-1"});
  EXPECT_LOOM_ERROR(adamw.set_lr(std::nan("")), ValueError, {"AdamW", "learning rate"});
  EXPECT_EQ(adamw.lr(), 0.25);
  Adam adam(params);
  EXPECT_EQ(adam.options().weight_decay, 0.0);
}

TEST(Optim, ConstructionErrors) {
  EXPECT_LOOM_ERROR(SGD({}, SGDOptions{.lr = 0.1}), ValueError, {"SGD", "empty"});
  EXPECT_LOOM_ERROR(Adam({test::dparam({2}), zeros({5}, kFloat64)}), ValueError,
                    {"Adam", "parameter 1", "[5]", "require grad"});
  Tensor leaf = test::dparam({2});
  EXPECT_LOOM_ERROR(Adam({leaf * 2.0}), ValueError, {"Adam", "parameter 0", "leaf"});
  EXPECT_LOOM_ERROR(AdamW({leaf, leaf}), ValueError, {"AdamW", "parameter 1", "parameter 0"});
  EXPECT_LOOM_ERROR(SGD({Tensor()}, SGDOptions{.lr = 0.1}), ValueError, {"SGD", "undefined"});

  const std::vector<Tensor> p = {test::dparam({2})};
  EXPECT_LOOM_ERROR(SGD(p, SGDOptions{.lr = -0.5}), ValueError, {"SGD", "lr=-0.5"});
  EXPECT_LOOM_ERROR(SGD(p, SGDOptions{.lr = 0.1, .momentum = -0.9}), ValueError,
                    {"SGD", "momentum=-0.9"});
  EXPECT_LOOM_ERROR(SGD(p, SGDOptions{.lr = 0.1, .weight_decay = -1}), ValueError,
                    {"SGD", "weight_decay=-1"});
  EXPECT_LOOM_ERROR(SGD(p, SGDOptions{.lr = 0.1, .nesterov = true}), ValueError,
                    {"SGD", "Nesterov", "momentum=0"});
  EXPECT_LOOM_ERROR(
      SGD(p, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
      ValueError, {"SGD", "Nesterov", "dampening=0.1"});
  EXPECT_LOOM_ERROR(Adam(p, AdamOptions{.lr = -1}), ValueError, {"Adam", "lr=-1"});
  EXPECT_LOOM_ERROR(Adam(p, AdamOptions{.beta1 = 1.0}), ValueError, {"Adam", "beta1=1"});
  EXPECT_LOOM_ERROR(Adam(p, AdamOptions{.beta2 = -0.1}), ValueError, {"Adam", "beta2=-0.1"});
  EXPECT_LOOM_ERROR(AdamW(p, AdamWOptions{.eps = -1e-8}), ValueError, {"AdamW", "eps=-1e-08"});
  EXPECT_LOOM_ERROR(AdamW(p, AdamWOptions{.weight_decay = -0.1}), ValueError,
                    {"AdamW", "weight_decay=-0.1"});
}

// ---------------------------------------------------------------- clip_grad_norm_

struct ClipCase {
  std::string name;
  double max_norm, norm_type;
};

TEST(ClipGradNorm, MatchesPyTorch) {
  const std::vector<ClipCase> cases = {{"l2", 1.0, 2.0},
                                       {"l2_unclipped", 100.0, 2.0},
                                       {"inf", 0.5, std::numeric_limits<double>::infinity()},
                                       {"l3", 2.0, 3.0},
                                       {"l1", 1.5, 1.0}};
  for (const ClipCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> params = initial_params();
    for (int i = 0; i < kParams; ++i)
      params[i].set_grad(golden().at("clip.grad." + std::to_string(i)).clone());
    const double total = clip_grad_norm_(params, c.max_norm, c.norm_type);
    EXPECT_NEAR(total, golden().at("clip." + c.name + ".total").item(), kTol);
    for (int i = 0; i < kParams; ++i)
      EXPECT_TRUE(tensors_close(
          params[i].grad(), golden().at("clip." + c.name + ".grad." + std::to_string(i)), 0, kTol));
  }
}

TEST(ClipGradNorm, LargeFloat32GradientsAndMissingGradients) {
  // Several blocks and threads; one parameter without a gradient is left out.
  Tensor a = zeros({100000}, kFloat32).requires_grad_(), b = zeros({3}).requires_grad_();
  Tensor c = zeros({7}).requires_grad_();
  a.set_grad(full({100000}, 0.5, kFloat32));
  c.set_grad(full({7}, -2.0, kFloat32));
  const double expected = std::sqrt(100000 * 0.25 + 7 * 4.0);
  const uint64_t version = a.grad().version();
  EXPECT_NEAR(clip_grad_norm_({a, b, c}, 1.0), expected, 1e-9 * expected);
  EXPECT_GT(a.grad().version(), version);
  const double scale = 1.0 / (expected + 1e-6);
  EXPECT_NEAR(a.grad().to_vector<double>()[777], 0.5 * scale, 1e-7);
  EXPECT_NEAR(c.grad().to_vector<double>()[6], -2.0 * scale, 1e-7);
  EXPECT_FALSE(b.grad().defined());
  // After clipping the norm is max_norm (up to the 1e-6).
  EXPECT_NEAR(clip_grad_norm_({a, b, c}, 1.0), 1.0, 1e-5);
  EXPECT_NEAR(clip_grad_norm_({a, c}, 1.0, std::numeric_limits<double>::infinity()), 2.0 * scale,
              1e-7);
}

TEST(ClipGradNorm, EdgeCasesAndErrors) {
  Tensor p = test::dparam({3});
  EXPECT_EQ(clip_grad_norm_({p}, 1.0), 0.0);  // no gradient anywhere
  EXPECT_EQ(clip_grad_norm_({}, 1.0), 0.0);
  p.set_grad(tensor<double>({3, 4, 0}));
  const uint64_t version = p.grad().version();
  EXPECT_DOUBLE_EQ(clip_grad_norm_({p}, 10.0), 5.0);  // below max_norm: untouched
  EXPECT_EQ(p.grad().version(), version);
  EXPECT_TRUE(test::values_are(p.grad(), {3, 4, 0}, 0));
  EXPECT_LOOM_ERROR(clip_grad_norm_({p}, 1.0, 0.0), ValueError, {"clip_grad_norm_", "norm_type=0"});
  EXPECT_LOOM_ERROR(clip_grad_norm_({p}, -1.0), ValueError, {"clip_grad_norm_", "max_norm=-1"});
  EXPECT_LOOM_ERROR(clip_grad_norm_({p, Tensor()}, 1.0), ValueError,
                    {"clip_grad_norm_", "parameter 1"});
}

}  // namespace
}  // namespace loom::optim

namespace loom::optim {
namespace {

// AdamOptions::decay: a parameter left out of weight decay steps as with weight_decay 0, the
// others as with it; the grouping travels with the checkpoint and must match on load.
TEST(AdamW, DecayMaskExemptsParameters) {
  manual_seed(21);
  const Tensor a0 = randn({3, 4}), b0 = randn({4});
  auto fresh = [](const Tensor& t) { return t.clone().requires_grad_(); };
  Tensor a = fresh(a0), b = fresh(b0), a_ref = fresh(a0), b_ref = fresh(b0);
  AdamW masked({a, b}, AdamWOptions{.lr = 0.1, .weight_decay = 0.5, .decay = {true, false}});
  AdamW decayed({a_ref}, AdamWOptions{.lr = 0.1, .weight_decay = 0.5});
  AdamW plain({b_ref}, AdamWOptions{.lr = 0.1, .weight_decay = 0.0});
  for (int step = 0; step < 3; ++step) {
    const Tensor ga = randn({3, 4}), gb = randn({4});
    a.set_grad(ga.clone()), a_ref.set_grad(ga.clone());
    b.set_grad(gb.clone()), b_ref.set_grad(gb.clone());
    masked.step(), decayed.step(), plain.step();
  }
  EXPECT_TRUE(test::tensors_close(a, a_ref, 0, 0));
  EXPECT_TRUE(test::tensors_close(b, b_ref, 0, 0));

  NamedTensors tensors;
  Metadata meta;
  masked.save_state(tensors, meta, "optimizer.");
  EXPECT_EQ(meta.at("optimizer.decay"), "10");
  SafetensorsFile file{tensors, meta};
  AdamW same({fresh(a0), fresh(b0)}, AdamWOptions{.decay = {true, false}});
  same.load_state(file, "optimizer.");
  EXPECT_EQ(same.param_steps(1), 3);
  AdamW other({fresh(a0), fresh(b0)}, AdamWOptions{});
  EXPECT_LOOM_ERROR(other.load_state(file, "optimizer."), ValueError,
                    {"AdamW", "grouping", "10", "every parameter"});
  EXPECT_LOOM_ERROR(AdamW({fresh(a0)}, AdamWOptions{.decay = {true, false}}), ValueError,
                    {"AdamW", "decay names 2 parameters", "1"});
}

}  // namespace
}  // namespace loom::optim
