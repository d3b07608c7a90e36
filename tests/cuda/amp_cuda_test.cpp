// tests/cuda/amp_cuda_test.cpp — mixed precision on CUDA against the CPU: autocast's 16-bit
// products (cuBLAS and cuDNN on tensor cores) and its float32 ops, a ResNet's forward and
// backward under autocast, and the GradScaler's inf check on device gradients. Both sides
// multiply 16-bit operands and accumulate in float32; their sums run in different orders, so
// results agree to the 16-bit rounding, not bit for bit. Skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/elementwise.h"

namespace loom::test {
namespace {

class AmpCuda : public ::testing::TestWithParam<DType> {};

double tolerance(DType dtype) { return dtype == kBFloat16 ? 3e-2 : 4e-3; }

TEST_P(AmpCuda, ProductsAndTheirBackwardMatchTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  const DType low = GetParam();
  manual_seed(1);
  const Tensor x = randn({4, 3, 11, 11}), w = randn({8, 3, 3, 3}), b = randn({8});
  const Tensor a = randn({37, 70}), m = randn({70, 29});
  std::vector<Tensor> cpu = {x, w, b, a, m}, gpu;
  for (Tensor& t : cpu) {
    t.requires_grad_(true);
    gpu.push_back(t.detach().to(kCuda0).requires_grad_(true));
  }
  auto run = [&](const std::vector<Tensor>& in) {
    autocast::Guard amp(low);
    const Tensor y = conv2d(in[0], in[1], in[2], {2, 2}, {1, 1});
    const Tensor z = matmul(in[3], in[4]);
    EXPECT_EQ(y.dtype(), low);
    EXPECT_EQ(z.dtype(), low);
    return std::pair{y, z};
  };
  const auto [yc, zc] = run(cpu);
  const auto [yg, zg] = run(gpu);
  const double tol = tolerance(low);
  EXPECT_TRUE(cuda_matches_cpu(yg, yc, tol, tol));
  EXPECT_TRUE(cuda_matches_cpu(zg, zc, tol, tol));
  // Reductions refuse 16-bit tensors outside a region (docs/decisions.md): the loss widens first.
  const auto loss = [](const Tensor& y, const Tensor& z) {
    const Tensor y32 = y.to(kFloat32);
    return add(sum(mul(y32, y32)), sum(z.to(kFloat32)));
  };
  loss(yc, zc).backward();
  loss(yg, zg).backward();
  // The gradients against the CPU's, bounded by the CPU's own 16-bit error (its autocast
  // gradients against float32 ones): the first GPU run found single elements of x's gradient off
  // by 0.04 (float16) and 0.31 (bfloat16) where dy, rounded to 16 bits on each device from
  // forward outputs a rounding apart, cancels over the 72 terms of each sum.
  std::vector<Tensor> wide;
  for (const Tensor& t : cpu) wide.push_back(t.detach().requires_grad_(true));
  {
    const Tensor y = conv2d(wide[0], wide[1], wide[2], {2, 2}, {1, 1});
    add(sum(mul(y, y)), sum(matmul(wide[3], wide[4]))).backward();
  }
  const auto distance = [](const Tensor& a, const Tensor& b) {
    return std::sqrt(sum(pow(sub(a, b), 2.0)).item());
  };
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(gpu[i].grad().defined()) << i;
    EXPECT_EQ(gpu[i].grad().dtype(), kFloat32) << i;
    const Tensor& cpu_grad = cpu[i].grad();
    const double norm = std::sqrt(sum(mul(cpu_grad, cpu_grad)).item());
    const double cpu_error = distance(cpu_grad, wide[i].grad());
    EXPECT_LE(distance(gpu[i].grad().to(kCPU), cpu_grad), 2 * cpu_error + tol * norm + 1e-4) << i;
  }
}

// One autocast step of a small ResNet on cuda:0 against the CPU, with the batch contiguous and
// channels-last (cuDNN then runs NHWC, and batch norm, ReLU and the residual adds keep the
// format: Note [Memory formats]).
//
// At initialisation, with batch norm in training mode, this network's gradients are
// ill-conditioned: on the CPU, float32 inputs perturbed by 5e-4 (one float16 rounding) move some
// of them by 19% of their size, and autocast moves them from float32's by up to 15% (float16)
// and 64% (bfloat16). The GPU rounds where the CPU does not (batch norm, ReLU and the adds stay
// 16-bit there; the CPU widens them), so its gradients may differ from the CPU's by as much: each
// is held to twice the CPU's own autocast error plus 10% of its size. A gradient unrelated to the
// CPU's (about 1.4 times its size away) fails that in float16; in bfloat16 the bound is looser.
TEST_P(AmpCuda, AResNetStepMatchesTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  const DType low = GetParam();
  manual_seed(2);
  auto on_cpu = nn::resnet18({.width = 8, .in_channels = 3, .num_classes = 10});
  manual_seed(2);
  auto on_gpu = nn::resnet18({.width = 8, .in_channels = 3, .num_classes = 10});
  on_gpu->to(kCuda0);
  manual_seed(2);
  auto in_float32 = nn::resnet18({.width = 8, .in_channels = 3, .num_classes = 10});
  const Tensor x = randn({4, 3, 32, 32});
  const Tensor y = tensor<int64_t>({1, 5, 9, 0}, {4});
  auto loss_of = [&](nn::Module& model, Device device, MemoryFormat format) {
    autocast::Guard amp(low);
    return cross_entropy(model.forward(x.to(device).contiguous(format)), y.to(device));
  };
  const Tensor lc = loss_of(*on_cpu, kCPU, MemoryFormat::kContiguous);
  lc.backward();
  cross_entropy(in_float32->forward(x), y).backward();
  const NamedTensors pc = on_cpu->named_parameters(), pg = on_gpu->named_parameters(),
                     p32 = in_float32->named_parameters();
  const auto distance = [](const Tensor& a, const Tensor& b) {
    return std::sqrt(sum(pow(sub(a, b), 2.0)).item());
  };
  for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    SCOPED_TRACE(detail::str("batch ", format));
    on_gpu->zero_grad();
    const Tensor lg = loss_of(*on_gpu, kCuda0, format);
    EXPECT_EQ(lg.dtype(), kFloat32);
    EXPECT_NEAR(lg.item(), lc.item(), 5 * tolerance(low));
    lg.backward();
    for (size_t i = 0; i < pc.size(); ++i) {
      EXPECT_EQ(pg[i].second.grad().dtype(), kFloat32) << pg[i].first;
      const Tensor& cpu_grad = pc[i].second.grad();
      const double norm = std::sqrt(sum(mul(cpu_grad, cpu_grad)).item());
      const double cpu_error = distance(cpu_grad, p32[i].second.grad());
      const double diff = distance(pg[i].second.grad().to(kCPU), cpu_grad);
      EXPECT_LE(diff, 2 * cpu_error + 0.1 * norm + 1e-4) << pg[i].first;
    }
  }
  // The activations stay channels-last from the stem to the last stage.
  NoGradGuard no_grad;
  autocast::Guard amp(low);
  nn::ResNet& r = *on_gpu;
  Tensor a = r.relu->forward(
      r.bn1->forward(r.conv1->forward(x.to(kCuda0).contiguous(MemoryFormat::kChannelsLast))));
  for (const auto& stage : {r.layer1, r.layer2, r.layer3, r.layer4}) a = stage->forward(a);
  EXPECT_EQ(suggest_memory_format(a), MemoryFormat::kChannelsLast);
  EXPECT_EQ(a.dtype(), low);  // and 16-bit: batch norm, ReLU, adds (Note [Autocast policy])
}

// On a GPU the "as is" class keeps a 16-bit input's dtype inside a region, computing in float:
// its values are the float32 op's within a few 16-bit roundings, and the float32 leaf gets a
// float32 gradient. (On the CPU the class widens: tests/autograd/autocast_test.cpp.)
TEST_P(AmpCuda, ElementwiseOpsAndBatchNormKeep16Bits) {
  LOOM_SKIP_WITHOUT_GPU();
  const DType low = GetParam();
  manual_seed(3);
  using Op = std::function<Tensor(const Tensor&)>;
  const Tensor gamma = randn({4}).to(kCuda0), beta = randn({4}).to(kCuda0);
  const std::vector<std::pair<std::string, Op>> ops = {
      {"add", [](const Tensor& h) { return add(h, h); }},
      {"broadcast add", [](const Tensor& h) { return add(h, slice(h, 0, 0, 1)); }},
      {"mul by scalar", [](const Tensor& h) { return h * 2.0 + 1.0; }},
      {"relu", [](const Tensor& h) { return relu(h); }},
      {"gelu", [](const Tensor& h) { return gelu(h); }},
      {"where", [](const Tensor& h) { return where(gt(h, zeros({}, kFloat32, kCuda0)), h, -h); }},
      {"batch_norm",
       [&](const Tensor& h) {
         return batch_norm(h, zeros({4}, kFloat32, kCuda0), ones({4}, kFloat32, kCuda0), gamma,
                           beta, /*training=*/true);
       }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor w = randn({3, 4}).to(kCuda0).requires_grad_(true);
    Tensor out, h32;
    {
      autocast::Guard amp(low);
      const Tensor h = matmul(w, eye(4).to(kCuda0));
      out = op(h);
      h32 = h.detach().to(kFloat32);
    }
    EXPECT_EQ(out.dtype(), low) << name;
    EXPECT_TRUE(cuda_matches_cpu(out.to(kFloat32), op(h32).to(kCPU), 3e-2, 3e-2)) << name;
    sum(out.to(kFloat32)).backward();
    EXPECT_EQ(w.grad().dtype(), kFloat32) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, AmpCuda, ::testing::Values(kBFloat16, kFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(GradScalerCuda, FindsAnInfInADeviceGradientAndSkips) {
  LOOM_SKIP_WITHOUT_GPU();
  Tensor p = ones({1000}).to(kCuda0).requires_grad_(true);
  optim::SGD opt({p}, {.lr = 0.1});
  optim::GradScaler scaler;
  Tensor g = full({1000}, 65536.0).to(kCuda0);
  p.set_grad(g);
  EXPECT_TRUE(scaler.step(opt));  // finite: steps with g / 65536 = 1
  scaler.update();
  EXPECT_TRUE(tensors_close(p.to(kCPU), full({1000}, 0.9), 1e-6, 1e-6));
  Tensor bad = full({1000}, 1.0);
  bad.narrow(0, 999, 1).fill_(INFINITY);
  p.set_grad(bad.to(kCuda0));
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_TRUE(tensors_close(p.to(kCPU), full({1000}, 0.9), 1e-6, 1e-6));
}

// 150 device gradients take several tensor-list launches (Note [Tensor lists]): each is
// unscaled as on the CPU, and an inf in one of the last launch's tensors is found.
TEST(GradScalerCuda, UnscalesManyGradientsAndFindsAnInfInAnyOfThem) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  std::vector<Tensor> params, grads;
  for (int64_t i = 0; i < 150; ++i) {
    params.push_back(zeros({i + 1}).to(kCuda0).requires_grad_(true));
    grads.push_back(randn({i + 1}));
  }
  optim::SGD opt(params, {.lr = 1.0});
  optim::GradScaler scaler;
  const double scale = scaler.get_scale();
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i].to(kCuda0));
  scaler.unscale_(opt);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(
        tensors_close(params[i].grad().to(kCPU), kernels::mul_scalar(grads[i], 1 / scale), 1e-6, 0))
        << "gradient " << i;
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  Tensor bad = grads[140].clone();
  bad.narrow(0, 70, 1).fill_(INFINITY);
  params[140].set_grad(bad.to(kCuda0));
  EXPECT_FALSE(scaler.step(opt));
}

}  // namespace
}  // namespace loom::test
