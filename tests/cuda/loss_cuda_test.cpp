// tests/cuda/loss_cuda_test.cpp — the CUDA softmax family and losses (tensor/cuda/loss.h)
// against the CPU kernels: rows and lanes layouts, strided inputs, every reduction, label
// smoothing, ignore_index, class weights, int32 and int64 targets, the target range error, and
// bit-for-bit repeatability on 4096 x 1000 rows. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/loss.h"
#include "tensor/cuda/runtime.h"
#include "tensor/elementwise.h"
#include "tensor/loss.h"

namespace loom {
namespace {

namespace k = loom::kernels;
namespace kc = loom::cuda;
using test::cuda_matches_cpu;
using test::kCuda0;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(kCPU), hb = b.to(kCPU);
  if (ha.sizes() != hb.sizes() || ha.dtype() != hb.dtype())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  if (std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

double rtol_of(DType dtype) { return dtype == kFloat32 ? 1e-4 : 1e-10; }
double atol_of(DType dtype) { return dtype == kFloat32 ? 1e-6 : 1e-12; }

// Class targets in [0, classes), about one in `ignore_every` set to ignore_index.
Tensor class_targets(const Shape& shape, int64_t classes, int64_t ignore_index,
                     int64_t ignore_every, DType dtype) {
  Tensor t = randint(0, classes, shape, kInt64);
  std::vector<int64_t> v = t.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    if (ignore_every > 0 && i % ignore_every == 3) v[i] = ignore_index;
  return tensor<int64_t>(v, shape).to(dtype);
}

struct SoftmaxCase {
  Shape shape;
  int64_t dim;
};
const std::vector<SoftmaxCase> kSoftmaxCases = {
    {{4096, 1000}, -1},           // rows, a block per row
    {{64, 10}, 1},                // short rows, many per block
    {{3, 50000}, 1},              // long rows
    {{2, 7, 5}, 1},               // lanes
    {{7, 3, 2, 33}, 0},           // lanes over a wide inner
    {{1000, 3}, 0},               // lanes over a long dim
    {{5}, 0},           {{}, 0},  // 0-d
    {{4, 0, 3}, 1},
};

TEST(CudaLoss, SoftmaxFamilyMatchesCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(1);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const SoftmaxCase& c : kSoftmaxCases) {
      SCOPED_TRACE(detail::str("shape=", c.shape, " dim=", c.dim, " ", dtype));
      const Tensor x = randn(c.shape, dtype), dy = randn(c.shape, dtype);
      const Tensor gx = gpu(x), gdy = gpu(dy);
      const double rtol = rtol_of(dtype), atol = atol_of(dtype);
      const Tensor y = k::softmax(x, c.dim), log_y = k::log_softmax(x, c.dim);
      EXPECT_TRUE(cuda_matches_cpu(kc::softmax(gx, c.dim), y, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(kc::log_softmax(gx, c.dim), log_y, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(kc::softmax_backward(gdy, gpu(y), c.dim),
                                   k::softmax_backward(dy, y, c.dim), rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(kc::log_softmax_backward(gdy, gpu(log_y), c.dim),
                                   k::log_softmax_backward(dy, log_y, c.dim), rtol, atol));
    }
  }
}

TEST(CudaLoss, SoftmaxOfStridedInputs) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(2);
  const Tensor base = randn({300, 41, 3}, kFloat32);
  const Tensor g = gpu(base);
  for (int64_t dim : {0, 1, 2}) {
    SCOPED_TRACE(detail::str("dim=", dim));
    const Tensor view = base.transpose(0, 1), gview = g.transpose(0, 1);
    EXPECT_TRUE(cuda_matches_cpu(kc::softmax(gview, dim), k::softmax(view, dim), 1e-4, 1e-6));
    const Tensor sliced = base.slice(0, 2, 300, 3), gsliced = g.slice(0, 2, 300, 3);
    EXPECT_TRUE(
        cuda_matches_cpu(kc::log_softmax(gsliced, dim), k::log_softmax(sliced, dim), 1e-4, 1e-6));
    // dy of another dtype is converted to y's, as on the CPU.
    const Tensor y = k::softmax(view, dim), dy = randn(view.sizes(), kFloat64);
    EXPECT_TRUE(cuda_matches_cpu(kc::softmax_backward(gpu(dy), gpu(y), dim),
                                 k::softmax_backward(dy, y, dim), 1e-4, 1e-6));
  }
  EXPECT_LOOM_ERROR(k::softmax(g, 3), IndexError, {"softmax"});
  EXPECT_LOOM_ERROR(k::softmax_backward(gpu(randn({2, 3})), gpu(randn({3, 2})), 0), ShapeError,
                    {"softmax_backward", "[2, 3]", "[3, 2]"});
}

struct ClassCase {
  Shape input;  // [N, C, *]
  DType target_dtype;
};
const std::vector<ClassCase> kClassCases = {
    {{4096, 1000}, kInt64},   // rows
    {{64, 10}, kInt32},       // short rows
    {{4, 5, 3, 2}, kInt64},   // [N, C, S] lanes
    {{2, 1000, 37}, kInt32},  // many classes, lanes
    {{1, 3}, kInt64},
};

Shape target_shape(const Shape& input) {
  Shape t = {input[0]};
  for (size_t d = 2; d < input.size(); ++d) t.push_back(input[d]);
  return t;
}

TEST(CudaLoss, CrossEntropyForwardAndBackward) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  const int64_t ignore = -100;
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const ClassCase& c : kClassCases) {
      const Tensor logits = k::mul_scalar(randn(c.input, dtype), 3.0);
      const Tensor target =
          class_targets(target_shape(c.input), c.input[1], ignore, 5, c.target_dtype);
      const Tensor glogits = gpu(logits), gtarget = gpu(target);
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (double ls : {0.0, 0.1}) {
          SCOPED_TRACE(
              detail::str("input=", c.input, " ", dtype, " reduction=", int(r), " ls=", ls));
          const double rtol = rtol_of(dtype), atol = dtype == kFloat32 ? 1e-5 : 1e-12;
          const k::CrossEntropyForward cpu =
              k::cross_entropy_forward(logits, target, r, ignore, ls);
          const k::CrossEntropyForward cuda =
              kc::cross_entropy_forward(glogits, gtarget, r, ignore, ls);
          EXPECT_EQ(cuda.count.item<int64_t>(), cpu.count.item<int64_t>());
          EXPECT_TRUE(cuda_matches_cpu(cuda.loss, cpu.loss, rtol, atol));
          EXPECT_TRUE(cuda_matches_cpu(cuda.lse, cpu.lse, rtol, atol));
          const Tensor dloss =
              r == Reduction::None ? randn(cpu.loss.sizes(), dtype) : scalar_tensor(0.75, dtype);
          EXPECT_TRUE(cuda_matches_cpu(
              kc::cross_entropy_backward(gpu(dloss), glogits, gtarget, cuda.lse, r, ignore, ls,
                                         cuda.count),
              k::cross_entropy_backward(dloss, logits, target, cpu.lse, r, ignore, ls, cpu.count),
              rtol, atol));
        }
      }
    }
  }
}

TEST(CudaLoss, CrossEntropyEdgeCases) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(4);
  // Every target ignored: Mean is NaN, count 0.
  const Tensor logits = randn({6, 4}, kFloat64);
  const Tensor ignored = full({6}, -1, kInt64);
  const auto cpu = k::cross_entropy_forward(logits, ignored, Reduction::Mean, -1, 0.0);
  const auto cuda = kc::cross_entropy_forward(gpu(logits), gpu(ignored), Reduction::Mean, -1, 0.0);
  EXPECT_EQ(cuda.count.item<int64_t>(), 0);
  EXPECT_TRUE(cuda_matches_cpu(cuda.loss, cpu.loss));
  // A strided logits view.
  const Tensor wide = randn({10, 64}, kFloat32);
  const Tensor target = class_targets({64}, 10, -100, 0, kInt64);
  EXPECT_TRUE(cuda_matches_cpu(
      kc::cross_entropy_forward(gpu(wide).t(), gpu(target), Reduction::Sum, -100, 0.0).loss,
      k::cross_entropy_forward(wide.t(), target, Reduction::Sum, -100, 0.0).loss, 1e-5, 1e-5));
  // A target outside [0, C) raises IndexError naming it, as on the CPU, but at the next wait for
  // the device (Note [Deferred device checks]): the forward itself does not wait.
  cuda::synchronize(0);
  ASSERT_EQ(cuda::pending_checks(), 0u);
  const Tensor bad = tensor<int64_t>({1, 2, 10, 0, 11, 3});
  const auto queued = kc::cross_entropy_forward(gpu(logits), gpu(bad), Reduction::Mean, -100, 0.0);
  EXPECT_EQ(cuda::pending_checks(), 1u);
  EXPECT_LOOM_ERROR(queued.loss.item(), IndexError,
                    {"cross_entropy", "target 10", "[6, 4]", "[6]", "after the op returned"});
  EXPECT_EQ(cuda::pending_checks(), 0u);  // raised once, then gone
  EXPECT_TRUE(std::isnan(queued.loss.item()));
  // synchronize() settles too; a good target's check passes silently.
  const auto good = kc::cross_entropy_forward(gpu(logits), gpu(tensor<int64_t>({1, 2, 3, 0, 1, 3})),
                                              Reduction::Mean, -100, 0.0);
  const auto bad_again =
      kc::cross_entropy_forward(gpu(logits), gpu(bad), Reduction::Sum, -100, 0.0);
  EXPECT_GE(cuda::pending_checks(), 1u);  // good's may have been settled when bad_again's came
  EXPECT_LOOM_ERROR(cuda::synchronize(0), IndexError, {"cross_entropy", "target 10"});
  EXPECT_EQ(cuda::pending_checks(), 0u);
  EXPECT_FALSE(std::isnan(good.loss.item()));
  // Library code that waits mid-change holds the checks; the next wait after it raises them.
  const auto held = kc::cross_entropy_forward(gpu(logits), gpu(bad), Reduction::Sum, -100, 0.0);
  {
    cuda::DeferredChecksHold hold;
    cuda::synchronize(0);
    EXPECT_TRUE(std::isnan(held.loss.item()));
    EXPECT_EQ(cuda::pending_checks(), 1u);
  }
  EXPECT_LOOM_ERROR(cuda::synchronize(0), IndexError, {"cross_entropy", "target 10"});
  // A second device gets its own event for a reused slot.
  if (cuda::device_count() > 1) {
    const Device d1{DeviceType::CUDA, 1};
    const auto other =
        kc::cross_entropy_forward(logits.to(d1), bad.to(d1), Reduction::Sum, -100, 0.0);
    EXPECT_LOOM_ERROR(cuda::synchronize(1), IndexError, {"cross_entropy", "target 10"});
  }
  EXPECT_LOOM_ERROR(
      k::check_class_target("nll_loss", gpu(logits), gpu(tensor<int32_t>({-2})), -100), ShapeError,
      {"nll_loss", "[6, 4]", "[1]"});
  EXPECT_LOOM_ERROR(
      kc::check_class_target("nll_loss", gpu(logits), gpu(full({6}, -2, kInt32)), -100), IndexError,
      {"nll_loss", "target -2"});
  const Tensor some_ignored = class_targets({6}, 4, 7, 2, kInt64);
  EXPECT_EQ(kc::check_class_target("nll_loss", gpu(logits), gpu(some_ignored), 7),
            k::check_class_target("nll_loss", logits, some_ignored, 7));
}

TEST(CudaLoss, NllLossForwardAndBackward) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  const int64_t ignore = 2;
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const ClassCase& c : kClassCases) {
      const Tensor log_probs = k::log_softmax(randn(c.input, dtype), 1);
      const Tensor target =
          class_targets(target_shape(c.input), c.input[1], ignore, 4, c.target_dtype);
      const Tensor weight = rand({c.input[1]}, dtype);
      for (const Tensor& w : {Tensor(), weight}) {
        for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
          SCOPED_TRACE(detail::str("input=", c.input, " ", dtype, " weight=", w.defined(),
                                   " reduction=", int(r)));
          const double rtol = rtol_of(dtype), atol = dtype == kFloat32 ? 1e-5 : 1e-12;
          const Tensor gw = w.defined() ? gpu(w) : Tensor();
          const k::NllLossForward cpu = k::nll_loss_forward(log_probs, target, w, r, ignore);
          const k::NllLossForward cuda =
              kc::nll_loss_forward(gpu(log_probs), gpu(target), gw, r, ignore);
          EXPECT_TRUE(cuda_matches_cpu(cuda.loss, cpu.loss, rtol, atol));
          EXPECT_NEAR(cuda.total_weight, cpu.total_weight, 1e-9 * (1 + cpu.total_weight));
          const Tensor dloss =
              r == Reduction::None ? randn(cpu.loss.sizes(), dtype) : scalar_tensor(-1.5, dtype);
          EXPECT_TRUE(cuda_matches_cpu(
              kc::nll_loss_backward(gpu(dloss), c.input, gpu(target), gw, r, ignore,
                                    cuda.total_weight),
              k::nll_loss_backward(dloss, c.input, target, w, r, ignore, cpu.total_weight), rtol,
              atol));
        }
      }
    }
  }
  EXPECT_LOOM_ERROR(k::nll_loss_forward(gpu(randn({4, 3})), gpu(tensor<int64_t>({0, 1, 2, 0})),
                                        gpu(randn({4})), Reduction::Mean, -100),
                    ShapeError, {"nll_loss", "[4]", "[4, 3]"});
}

TEST(CudaLoss, MseLossForwardAndBackward) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : {Shape{1000003}, Shape{4096, 1000}, Shape{7, 3}, Shape{}, Shape{0}}) {
      const Tensor x = randn(shape, dtype), t = randn(shape, dtype);
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        SCOPED_TRACE(detail::str("shape=", shape, " ", dtype, " reduction=", int(r)));
        const double rtol = rtol_of(dtype), atol = atol_of(dtype);
        EXPECT_TRUE(
            cuda_matches_cpu(kc::mse_loss(gpu(x), gpu(t), r), k::mse_loss(x, t, r), rtol, atol));
        const Tensor dloss = r == Reduction::None ? randn(shape, dtype) : scalar_tensor(2.5, dtype);
        EXPECT_TRUE(cuda_matches_cpu(kc::mse_loss_backward(gpu(dloss), gpu(x), gpu(t), r),
                                     k::mse_loss_backward(dloss, x, t, r), rtol, atol));
      }
    }
  }
  // A strided input.
  const Tensor x = randn({50, 40}, kFloat32), t = randn({40, 50}, kFloat32);
  EXPECT_TRUE(cuda_matches_cpu(kc::mse_loss(gpu(x).t(), gpu(t), Reduction::Mean),
                               k::mse_loss(x.t(), t, Reduction::Mean), 1e-5, 1e-6));
  EXPECT_LOOM_ERROR(k::mse_loss(gpu(x), gpu(t), Reduction::Mean), ShapeError,
                    {"mse_loss", "[50, 40]", "[40, 50]"});
}

TEST(CudaLoss, SameBitsEveryRun) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(7);
  const Tensor logits = gpu(randn({4096, 1000}, kFloat32));
  const Tensor target = gpu(class_targets({4096}, 1000, -100, 7, kInt64));
  const auto a = kc::cross_entropy_forward(logits, target, Reduction::Mean, -100, 0.1);
  const auto b = kc::cross_entropy_forward(logits, target, Reduction::Mean, -100, 0.1);
  EXPECT_TRUE(same_bits(a.loss, b.loss));
  EXPECT_TRUE(same_bits(a.lse, b.lse));
  EXPECT_TRUE(same_bits(kc::softmax(logits, 1), kc::softmax(logits, 1)));
  EXPECT_TRUE(same_bits(kc::log_softmax(logits, 0), kc::log_softmax(logits, 0)));
  const Tensor x = gpu(randn({1000003}, kFloat32)), t = gpu(randn({1000003}, kFloat32));
  EXPECT_TRUE(same_bits(kc::mse_loss(x, t, Reduction::Mean), kc::mse_loss(x, t, Reduction::Mean)));
}

}  // namespace
}  // namespace loom
