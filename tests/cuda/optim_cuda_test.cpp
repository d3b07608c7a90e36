// tests/cuda/optim_cuda_test.cpp — the optimizers' fused updates on CUDA against the same
// optimizers on the CPU: a few steps of SGD (plain, momentum, nesterov, weight decay), Adam,
// AdamW and AMSGrad from the same start, also over many parameters of two dtypes that take
// several tensor-list launches, channels-last parameters and gradients, GradScaler's unscale and
// clip_grad_norm_. Skips without a GPU.

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace loom::test {
namespace {

// Runs `steps` updates of the optimizer made by `make` on the parameters `cpu` and on CUDA
// copies of them (in the same memory format), with the same gradients each step, and compares
// the parameters. Parameter `sometimes`, where given, has no gradient every other step, so its
// step count (Adam's bias corrections) falls behind the others'. The 4-D gradients are stored in
// `grad_format`. Every parameter is dense: it is updated where it lies.
template <typename Make>
void expect_same_steps(Make make, std::vector<Tensor> cpu, int steps = 4,
                       std::optional<size_t> sometimes = std::nullopt,
                       MemoryFormat grad_format = MemoryFormat::kContiguous) {
  std::vector<Tensor> gpu;
  std::vector<const void*> storage;
  for (Tensor& p : cpu) {
    p.requires_grad_(true);
    gpu.push_back(p.detach().to(kCuda0));
    gpu.back().requires_grad_(true);
    storage.push_back(gpu.back().data());
  }
  auto opt_cpu = make(cpu);
  auto opt_gpu = make(gpu);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      const bool none = sometimes == i && s % 2 == 1;
      Tensor g = none ? Tensor() : randn(cpu[i].sizes(), cpu[i].dtype());
      if (g.defined() && g.dim() == 4) g = g.contiguous(grad_format);
      cpu[i].set_grad(g);
      gpu[i].set_grad(none ? Tensor() : g.to(kCuda0));
    }
    opt_cpu->step();
    opt_gpu->step();
  }
  if (sometimes) {
    EXPECT_EQ(opt_gpu->param_steps(*sometimes), (steps + 1) / 2);
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double tol = cpu[i].dtype() == kFloat64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(cuda_matches_cpu(gpu[i].detach(), cpu[i].detach(), tol, tol)) << "parameter " << i;
    EXPECT_EQ(gpu[i].data(), storage[i]) << "parameter " << i;
    EXPECT_EQ(suggest_memory_format(gpu[i]), suggest_memory_format(cpu[i])) << "parameter " << i;
  }
}

// Three parameters of one dtype, one of them 16 chunks long.
std::vector<Tensor> three_params(DType dtype) {
  manual_seed(3);
  return {randn({7, 5}, dtype), randn({1000003}, dtype), randn({3}, dtype)};
}

// Many parameters (Note [Tensor lists]): 100 small ones, float32 and float64 mixed (one list
// each), and one of 321 chunks of 64 Ki elements, more than one launch's blocks.
std::vector<Tensor> many_params() {
  manual_seed(4);
  std::vector<Tensor> params;
  for (int i = 0; i < 100; ++i)
    params.push_back(randn({(i * 37) % 300 + 1}, i % 4 == 0 ? kFloat64 : kFloat32));
  params.push_back(randn({21 * 1000 * 1000 + 7}));
  return params;
}

TEST(CudaOptim, ManyParametersOfTwoDtypesMatchTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  expect_same_steps(
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(
            std::move(p),
            optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
      },
      many_params(), 4, 5);
  expect_same_steps(
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::Adam>(std::move(p),
                                             optim::AdamOptions{.lr = 1e-2, .amsgrad = true});
      },
      many_params(), 4, 5);
}

// The CUDA parameters are updated after the loop that makes their state, so every gradient is
// checked first: one on the wrong device fails the step before any parameter moves or counts a
// step.
TEST(CudaOptim, ABadGradientFailsTheStepBeforeAnythingChanges) {
  LOOM_SKIP_WITHOUT_GPU();
  Tensor a = randn({5}).to(kCuda0).requires_grad_(true);
  Tensor b = randn({3}).to(kCuda0).requires_grad_(true);
  const Tensor before = a.detach().to(kCPU);
  optim::SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  a.set_grad(ones({5}).to(kCuda0));
  b.set_grad(ones({3}));  // on the CPU
  EXPECT_THROW(sgd.step(), DeviceError);
  EXPECT_EQ(sgd.param_steps(0), 0);
  EXPECT_TRUE(tensors_close(a.detach().to(kCPU), before, 0, 0));
}

TEST(CudaOptim, SgdVariantsMatchTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (optim::SGDOptions o :
         {optim::SGDOptions{.lr = 0.1}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9},
          optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2},
          optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true}})
      expect_same_steps(
          [&](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), o); },
          three_params(dtype));
  }
}

TEST(CudaOptim, AdamAdamWAndAmsgradMatchTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    expect_same_steps(
        [](std::vector<Tensor> p) {
          return std::make_unique<optim::Adam>(
              std::move(p), optim::AdamOptions{.lr = 1e-2, .weight_decay = 1e-2});
        },
        three_params(dtype));
    expect_same_steps(
        [](std::vector<Tensor> p) {
          return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{.lr = 1e-2});
        },
        three_params(dtype));
    expect_same_steps(
        [](std::vector<Tensor> p) {
          return std::make_unique<optim::Adam>(std::move(p),
                                               optim::AdamOptions{.lr = 1e-2, .amsgrad = true});
        },
        three_params(dtype));
  }
}

// Channels-last weights (nn::Module::to(MemoryFormat::kChannelsLast)) beside 1-D ones in one
// tensor list, with gradients in either order (Note [Update layouts]).
TEST(CudaOptim, ChannelsLastParametersAreUpdatedWhereTheyLie) {
  LOOM_SKIP_WITHOUT_GPU();
  auto params = [] {
    manual_seed(6);
    return std::vector<Tensor>{randn({8, 4, 3, 3}).contiguous(MemoryFormat::kChannelsLast),
                               randn({5}),
                               randn({16, 8, 1, 1}).contiguous(MemoryFormat::kChannelsLast)};
  };
  for (MemoryFormat grads : {MemoryFormat::kChannelsLast, MemoryFormat::kContiguous}) {
    expect_same_steps(
        [](std::vector<Tensor> p) {
          return std::make_unique<optim::SGD>(
              std::move(p),
              optim::SGDOptions{
                  .lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
        },
        params(), 4, 0, grads);
    expect_same_steps(
        [](std::vector<Tensor> p) {
          return std::make_unique<optim::Adam>(std::move(p),
                                               optim::AdamOptions{.lr = 1e-2, .amsgrad = true});
        },
        params(), 4, std::nullopt, grads);
  }
}

// GradScaler unscales a channels-last CUDA gradient where it lies, and finds an inf in it.
TEST(CudaOptim, UnscaleTakesChannelsLastGradients) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(7);
  const Tensor g = randn({4, 3, 2, 2});
  Tensor p = randn({4, 3, 2, 2}).contiguous(MemoryFormat::kChannelsLast).to(kCuda0);
  p.requires_grad_(true);
  p.set_grad(g.contiguous(MemoryFormat::kChannelsLast).to(kCuda0));
  const void* grad_storage = p.grad().data();
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 4});
  scaler.unscale_(sgd);
  EXPECT_EQ(p.grad().data(), grad_storage);
  EXPECT_TRUE(cuda_matches_cpu(p.grad(), g.mul(full({}, 0.25)), 0, 0));
  scaler.step(sgd);
  scaler.update();
  p.grad().select(0, 3).select(0, 2).fill_(std::numeric_limits<double>::infinity());
  const Tensor before = p.detach().to(kCPU);
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(cuda_matches_cpu(p.detach(), before, 0, 0));
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

TEST(CudaOptim, ClipGradNormMatchesTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  for (double norm_type : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    manual_seed(5);
    Tensor a = randn({300}, kFloat64), b = randn({20, 20}, kFloat64);
    Tensor ga = a.to(kCuda0), gb = b.to(kCuda0);
    a.requires_grad_(true);
    b.requires_grad_(true);
    ga.requires_grad_(true);
    gb.requires_grad_(true);
    a.set_grad(randn({300}, kFloat64));
    b.set_grad(randn({20, 20}, kFloat64));
    ga.set_grad(a.grad().to(kCuda0));
    gb.set_grad(b.grad().to(kCuda0));
    const double cpu_norm = optim::clip_grad_norm_({a, b}, 1.0, norm_type);
    const double gpu_norm = optim::clip_grad_norm_({ga, gb}, 1.0, norm_type);
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-9 * cpu_norm) << norm_type;
    EXPECT_TRUE(cuda_matches_cpu(ga.grad(), a.grad(), 1e-12, 1e-12)) << norm_type;
  }
}

}  // namespace
}  // namespace loom::test
