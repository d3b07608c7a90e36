// tests/tensor/batch_norm_relu_test.cpp — batch_norm_relu (Note [Batch norm with ReLU]): the fused
// op against relu(batch_norm(x) + residual) run op by op, forward and every gradient, in
// training and eval, both memory formats, 16-bit x; gradcheck; the kernels' checks; and a
// ResNet whose blocks fuse against the same ResNet unfused.

#include <algorithm>
#include <vector>

#include "nn/resnet.h"
#include "tensor/norm.h"
#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;
using In = std::vector<Tensor>;
namespace k = loom::kernels;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;

struct Result {
  Tensor y, dx, dweight, dbias, dresidual, running_mean, running_var;
};

// relu(batch_norm(x) + residual), fused or op by op, then backward of sum(y * dy).
Result run(bool fused, const Tensor& x0, const Tensor& residual0, const Tensor& dy, bool training) {
  const double c = static_cast<double>(x0.size(1));
  const DType pd = x0.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor x = x0.detach().requires_grad_();
  Tensor residual = residual0.defined() ? residual0.detach().requires_grad_() : Tensor();
  // Per-channel parameters and running statistics that differ from channel to channel.
  const Tensor ch = arange(0, c, 1, pd);
  Tensor w = (ch * -0.3 + 0.9).requires_grad_();
  Tensor b = (ch * 0.1 + -0.2).requires_grad_();
  Tensor rm = ch * 0.05 + -0.1, rv = ch * 0.3 + 0.5;
  Tensor y;
  if (fused) {
    y = batch_norm_relu(x, rm, rv, w, b, training, 0.1, 1e-5, residual);
  } else {
    y = batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
    y = relu(residual.defined() ? y + residual : y);
  }
  (y.to(kFloat64) * dy).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.grad(), residual.defined() ? residual.grad() : Tensor(),
          rm,         rv};
}

::testing::AssertionResult same_result(const Result& a, const Result& b, double tol) {
  const std::pair<const char*, std::pair<Tensor, Tensor>> parts[] = {
      {"y", {a.y, b.y}},
      {"dx", {a.dx, b.dx}},
      {"dweight", {a.dweight, b.dweight}},
      {"dbias", {a.dbias, b.dbias}},
      {"running_mean", {a.running_mean, b.running_mean}},
      {"running_var", {a.running_var, b.running_var}}};
  for (const auto& [name, p] : parts) {
    const auto r = tensors_close(p.first, p.second, tol, tol);
    if (!r) return ::testing::AssertionFailure() << name << ": " << r.message();
  }
  if (a.dresidual.defined() != b.dresidual.defined())
    return ::testing::AssertionFailure() << "dresidual defined in only one";
  if (a.dresidual.defined()) {
    const auto r = tensors_close(a.dresidual, b.dresidual, tol, tol);
    if (!r) return ::testing::AssertionFailure() << "dresidual: " << r.message();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(BatchNormRelu, MatchesTheOpsOneByOne) {
  manual_seed(11);
  for (const Shape& shape : {Shape{4, 3, 5, 5}, Shape{2, 6, 3, 4}, Shape{8, 5}}) {
    const Tensor x = randn(shape, kFloat64), r = randn(shape, kFloat64);
    const Tensor dy = randn(shape, kFloat64);
    for (bool training : {true, false})
      for (bool with_residual : {false, true}) {
        const Tensor res = with_residual ? r : Tensor();
        const Result fused = run(true, x, res, dy, training);
        const Result ops = run(false, x, res, dy, training);
        EXPECT_TRUE(same_result(fused, ops, 1e-12))
            << detail::str(shape) << " training=" << training << " residual=" << with_residual;
        // Some outputs are cut by the ReLU, some pass: the mask is exercised both ways.
        const std::vector<double> y = fused.y.to_vector<double>();
        EXPECT_GT(std::count(y.begin(), y.end(), 0.0), 0);
        EXPECT_LT(std::count(y.begin(), y.end(), 0.0), static_cast<long>(y.size()));
      }
  }
}

TEST(BatchNormRelu, ChannelsLastGivesTheSameNumbersAndKeepsItsFormat) {
  manual_seed(12);
  const Tensor x = randn({3, 8, 4, 5}, kFloat64), r = randn({3, 8, 4, 5}, kFloat64);
  const Tensor dy = randn({3, 8, 4, 5}, kFloat64);
  for (bool training : {true, false}) {
    const Result ref = run(false, x, r, dy, training);
    // x channels-last with the residual in either format: the kernels read both in x's order.
    for (const Tensor& res : {r.contiguous(kCL), r}) {
      const Result cl = run(true, x.contiguous(kCL), res, dy, training);
      EXPECT_EQ(suggest_memory_format(cl.y), kCL);
      EXPECT_EQ(suggest_memory_format(cl.dx), kCL);
      EXPECT_TRUE(same_result(cl, ref, 1e-12)) << training;
    }
  }
}

TEST(BatchNormRelu, Float32AndSixteenBitX) {
  manual_seed(13);
  const Tensor x = randn({4, 6, 3, 3}), r = randn({4, 6, 3, 3}), dy = randn({4, 6, 3, 3});
  EXPECT_TRUE(same_result(run(true, x, r, dy, true), run(false, x, r, dy, true), 1e-5));
  for (DType half : {kFloat16, kBFloat16}) {
    // A 16-bit x takes float32 parameters; the fused op rounds y once where the ops round the
    // batch norm's output and then the sum.
    const Result fused = run(true, x.to(half), r.to(half), dy, true);
    const Result ops = run(false, x.to(half), r.to(half), dy, true);
    EXPECT_EQ(fused.y.dtype(), half);
    EXPECT_EQ(fused.dresidual.dtype(), half);
    EXPECT_TRUE(same_result(fused, ops, half == kFloat16 ? 2e-2 : 1e-1)) << half;
  }
}

TEST(BatchNormRelu, Gradcheck) {
  manual_seed(14);
  Tensor x = dparam({3, 2, 2, 2}), w = dparam({2}), b = dparam({2}), r = dparam({3, 2, 2, 2});
  EXPECT_GRADCHECK(
      [](In t) { return batch_norm_relu(t[0], Tensor(), Tensor(), t[1], t[2], true, 0.1, 1e-5); },
      {x, w, b});
  EXPECT_GRADCHECK(
      [](In t) {
        return batch_norm_relu(t[0], Tensor(), Tensor(), t[1], t[2], true, 0.1, 1e-5, t[3]);
      },
      {x, w, b, r});
  Tensor rm = tensor<double>({0.2, -0.4}), rv = tensor<double>({0.8, 1.7});
  EXPECT_GRADCHECK(
      [rm, rv](In t) { return batch_norm_relu(t[0], rm, rv, t[1], t[2], false, 0.1, 1e-5, t[3]); },
      {x, w, b, r});
}

TEST(BatchNormRelu, AResidualTheKernelsCannotReadFallsBackToTheOps) {
  manual_seed(15);
  const Tensor x = randn({2, 3, 4, 4});
  const Tensor w = ones({3}), b = zeros({3});
  // Broadcast and another dtype: the fused kernels refuse both, the op still answers.
  for (const Tensor& res : {randn({1, 3, 1, 1}), randn({2, 3, 4, 4}, kFloat64)}) {
    const Tensor want = relu(batch_norm(x, Tensor(), Tensor(), w, b, true) + res);
    const Tensor got = batch_norm_relu(x, Tensor(), Tensor(), w, b, true, 0.1, 1e-5, res);
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_TRUE(tensors_close(got, want, 1e-6, 1e-6)) << detail::str(res.sizes());
  }
  EXPECT_LOOM_ERROR(
      batch_norm_relu(x, Tensor(), Tensor(), w, b, true, 0.1, 1e-5, randn({2, 5, 4, 4})),
      ShapeError, {"[2, 3, 4, 4]", "[2, 5, 4, 4]"});
}

TEST(BatchNormRelu, KernelChecks) {
  const Tensor x = randn({2, 3, 4}), w = ones({3});
  EXPECT_LOOM_ERROR(k::batch_norm_forward_train(x, w, Tensor(), 1e-5, {randn({2, 3, 5}), true}),
                    ShapeError, {"batch_norm", "residual", "[2, 3, 5]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(
      k::batch_norm_elemt(x, zeros({3}), ones({3}), w, Tensor(), {randn({2, 3, 4}, kFloat64)}),
      DTypeError, {"batch_norm_elemt", "residual", "float64"});
  const auto [y, stats] = k::batch_norm_forward_train(x, w, Tensor(), 1e-5, {Tensor(), true});
  EXPECT_LOOM_ERROR(k::batch_norm_backward(x, x, stats.mean, stats.invstd, w, true,
                                           {true, true, true}, randn({2, 3})),
                    ShapeError, {"batch_norm_backward", "relu_y", "[2, 3]"});
  EXPECT_LOOM_ERROR(k::batch_norm_backward(x, x, stats.mean, stats.invstd, w, true,
                                           {true, false, false}, Tensor(), true),
                    ValueError, {"batch_norm_backward", "relu_y", "[2, 3, 4]"});
}

TEST(BatchNormRelu, FusedResNetMatchesTheUnfusedOne) {
  // The same weights (same seed), one ResNet fusing its blocks' batch norms and ReLUs and one
  // running torchvision's ops one by one: the same logits, gradients and running statistics.
  auto build = [](bool fuse) {
    manual_seed(21);
    return nn::resnet18({.width = 4, .in_channels = 1, .num_classes = 5, .fuse_bn_relu = fuse});
  };
  auto fused = build(true), ops = build(false);
  manual_seed(22);
  const Tensor x = randn({3, 1, 12, 12}), dlogits = randn({3, 5});
  for (bool training : {true, false}) {
    fused->train(training);
    ops->train(training);
    const Tensor a = fused->forward(x), b = ops->forward(x);
    EXPECT_TRUE(tensors_close(a, b, 1e-5, 1e-5)) << training;
    (a * dlogits).sum().backward();
    (b * dlogits).sum().backward();
    const auto pa = fused->named_parameters(), pb = ops->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(tensors_close(pa[i].second.grad(), pb[i].second.grad(), 1e-4, 1e-5))
          << pa[i].first << " training=" << training;
    const auto ba = fused->named_buffers(), bb = ops->named_buffers();
    for (size_t i = 0; i < ba.size(); ++i)
      EXPECT_TRUE(tensors_close(ba[i].second, bb[i].second, 1e-6, 1e-6)) << ba[i].first;
    fused->zero_grad();
    ops->zero_grad();
  }
}
