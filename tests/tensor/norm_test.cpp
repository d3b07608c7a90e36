// tests/tensor/norm_test.cpp — batch_norm and layer_norm: forward against plain loops, running
// statistics, gradcheck of x, weight and bias in training and eval, the SyncBatchNorm kernel
// pieces against the fused kernels, and every error path.

#include "tensor/norm.h"

#include <array>
#include <cmath>
#include <vector>

#include "tensor/parallel.h"
#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;
using loom::test::values_are;
using In = std::vector<Tensor>;

namespace {

// Reference batch norm over x [N, C, S...]: y, and the batch's mean and biased variance.
struct RefBatchNorm {
  std::vector<double> y, mean, var;
};

RefBatchNorm ref_batch_norm(const Tensor& x, const std::vector<double>& weight,
                            const std::vector<double>& bias, bool training,
                            const std::vector<double>& running_mean,
                            const std::vector<double>& running_var, double eps) {
  const std::vector<double> v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  RefBatchNorm r{std::vector<double>(v.size()), std::vector<double>(c), std::vector<double>(c)};
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) sum += v[(b * c + ch) * s + i];
    const double mean = sum / (n * s);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) sq += std::pow(v[(b * c + ch) * s + i] - mean, 2);
    r.mean[ch] = mean;
    r.var[ch] = sq / (n * s);
    const double m = training ? mean : running_mean[ch];
    const double var = training ? r.var[ch] : running_var[ch];
    const double w = weight.empty() ? 1.0 : weight[ch], bb = bias.empty() ? 0.0 : bias[ch];
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) {
        const int64_t k = (b * c + ch) * s + i;
        r.y[k] = (v[k] - m) / std::sqrt(var + eps) * w + bb;
      }
  }
  return r;
}

std::vector<double> ref_layer_norm(const Tensor& x, int64_t cols, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps) {
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> y(v.size());
  for (size_t r = 0; r * cols < v.size(); ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) mean += v[r * cols + i] / cols;
    for (int64_t i = 0; i < cols; ++i) var += std::pow(v[r * cols + i] - mean, 2) / cols;
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (v[r * cols + i] - mean) / std::sqrt(var + eps) * (w.empty() ? 1 : w[i]) +
                        (b.empty() ? 0 : b[i]);
  }
  return y;
}

Tensor from(const std::vector<double>& v, const Shape& shape) { return tensor<double>(v, shape); }

}  // namespace

// ---------------------------------------------------------------- batch norm forward

TEST(BatchNorm, TrainingForwardMatchesReferenceForAnyRank) {
  manual_seed(1);
  for (const Shape& shape :
       {Shape{5, 3}, Shape{2, 3, 4}, Shape{2, 3, 2, 3}, Shape{2, 2, 2, 2, 3}}) {
    const int64_t c = shape[1];
    Tensor x = add(mul(randn(shape, kFloat64), full({}, 3.0, kFloat64)), full({}, 2.0, kFloat64));
    Tensor w = randn({c}, kFloat64), b = randn({c}, kFloat64);
    RefBatchNorm ref =
        ref_batch_norm(x, w.to_vector<double>(), b.to_vector<double>(), true, {}, {}, 1e-5);
    EXPECT_TRUE(tensors_close(batch_norm(x, Tensor(), Tensor(), w, b, true), from(ref.y, shape),
                              1e-10, 1e-10))
        << detail::str(shape);
    // Without the affine part.
    RefBatchNorm plain = ref_batch_norm(x, {}, {}, true, {}, {}, 1e-5);
    EXPECT_TRUE(tensors_close(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true),
                              from(plain.y, shape), 1e-10, 1e-10));
    // float32 computes the same within float precision.
    EXPECT_TRUE(tensors_close(
        batch_norm(x.to(kFloat32), Tensor(), Tensor(), w.to(kFloat32), b.to(kFloat32), true),
        from(ref.y, shape).to(kFloat32), 1e-4, 1e-4));
  }
}

TEST(BatchNorm, NonContiguousInputAndLargeChannelCount) {
  manual_seed(2);
  Tensor base = randn({3, 4, 2, 40}, kFloat64);  // x = [40, 4, 2, 3] as a permuted view
  Tensor x = base.permute({3, 1, 2, 0});
  ASSERT_FALSE(x.is_contiguous());
  RefBatchNorm ref = ref_batch_norm(x.contiguous(), {}, {}, true, {}, {}, 1e-5);
  EXPECT_TRUE(tensors_close(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true),
                            from(ref.y, x.sizes()), 1e-10, 1e-10));
  // Enough channels and values that the channels run on several threads.
  Tensor big = randn({8, 96, 12, 12}, kFloat32);
  RefBatchNorm big_ref = ref_batch_norm(big, {}, {}, true, {}, {}, 1e-5);
  EXPECT_TRUE(tensors_close(batch_norm(big, Tensor(), Tensor(), Tensor(), Tensor(), true),
                            from(big_ref.y, big.sizes()).to(kFloat32), 1e-4, 1e-4));
}

TEST(BatchNorm, TrainingUpdatesRunningStatistics) {
  manual_seed(3);
  Tensor x = randn({4, 3, 5}, kFloat64);
  Tensor running_mean = tensor<double>({0.5, -1.0, 2.0});
  Tensor running_var = tensor<double>({1.5, 0.25, 3.0});
  const uint64_t mean_version = running_mean.version(), var_version = running_var.version();
  const double momentum = 0.3;
  RefBatchNorm ref = ref_batch_norm(x, {}, {}, true, {}, {}, 1e-5);
  Tensor xg = x.clone().requires_grad_();
  Tensor y = batch_norm(xg, running_mean, running_var, Tensor(), Tensor(), true, momentum);
  const std::vector<double> old_mean{0.5, -1.0, 2.0}, old_var{1.5, 0.25, 3.0};
  std::vector<double> want_mean(3), want_var(3);
  const double count = 4 * 5;
  for (int c = 0; c < 3; ++c) {
    want_mean[c] = (1 - momentum) * old_mean[c] + momentum * ref.mean[c];
    want_var[c] = (1 - momentum) * old_var[c] + momentum * ref.var[c] * count / (count - 1);
  }
  EXPECT_TRUE(values_are(running_mean, want_mean, 1e-12));
  EXPECT_TRUE(values_are(running_var, want_var, 1e-12));
  EXPECT_GT(running_mean.version(), mean_version);
  EXPECT_GT(running_var.version(), var_version);
  // The update is no part of the graph.
  EXPECT_FALSE(running_mean.requires_grad());
  EXPECT_EQ(running_mean.grad_fn_name(), "");
  EXPECT_EQ(y.grad_fn_name(), "batch_normBackward");
  // The output uses the batch's statistics, not the running ones.
  EXPECT_TRUE(tensors_close(y, from(ref.y, x.sizes()), 1e-10, 1e-10));
  // float32 running statistics update the same way.
  Tensor rm32 = zeros({3}), rv32 = ones({3});
  batch_norm(x.to(kFloat32), rm32, rv32, Tensor(), Tensor(), true, momentum);
  std::vector<double> want32_mean(3), want32_var(3);
  for (int c = 0; c < 3; ++c) {
    want32_mean[c] = momentum * ref.mean[c];
    want32_var[c] = (1 - momentum) + momentum * ref.var[c] * count / (count - 1);
  }
  EXPECT_TRUE(values_are(rm32, want32_mean, 1e-5));
  EXPECT_TRUE(values_are(rv32, want32_var, 1e-5));
}

TEST(BatchNorm, EvalUsesRunningStatisticsAndLeavesThemAlone) {
  manual_seed(4);
  Tensor x = randn({3, 2, 2, 2}, kFloat64);
  Tensor rm = tensor<double>({0.3, -0.7}), rv = tensor<double>({2.0, 0.5});
  Tensor w = tensor<double>({1.5, -0.5}), b = tensor<double>({0.1, 0.2});
  RefBatchNorm ref =
      ref_batch_norm(x, {1.5, -0.5}, {0.1, 0.2}, false, {0.3, -0.7}, {2.0, 0.5}, 1e-3);
  Tensor y = batch_norm(x, rm, rv, w, b, false, 0.1, 1e-3);
  EXPECT_TRUE(tensors_close(y, from(ref.y, x.sizes()), 1e-12, 1e-12));
  EXPECT_TRUE(values_are(rm, {0.3, -0.7}));
  EXPECT_TRUE(values_are(rv, {2.0, 0.5}));
}

// ---------------------------------------------------------------- batch norm backward

TEST(BatchNorm, GradcheckTraining) {
  manual_seed(5);
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 3}, Shape{2, 2, 2, 2}}) {
    Tensor x = dparam(shape), w = dparam({shape[1]}), b = dparam({shape[1]});
    EXPECT_GRADCHECK([](In t) { return batch_norm(t[0], Tensor(), Tensor(), t[1], t[2], true); },
                     {x, w, b});
    // Without weight and bias, and with running statistics being updated on each call.
    Tensor rm = zeros({shape[1]}, kFloat64), rv = ones({shape[1]}, kFloat64);
    EXPECT_GRADCHECK(
        [rm, rv](In t) { return batch_norm(t[0], rm, rv, Tensor(), Tensor(), true, 0.1, 1e-3); },
        {x});
  }
}

TEST(BatchNorm, GradcheckEval) {
  manual_seed(6);
  Tensor x = dparam({3, 2, 2}), w = dparam({2}), b = dparam({2});
  Tensor rm = tensor<double>({0.2, -0.4}), rv = tensor<double>({0.8, 1.7});
  EXPECT_GRADCHECK([rm, rv](In t) { return batch_norm(t[0], rm, rv, t[1], t[2], false); },
                   {x, w, b});
  EXPECT_GRADCHECK([rm, rv](In t) { return batch_norm(t[0], rm, rv, Tensor(), t[1], false); },
                   {x, b});
}

TEST(BatchNorm, TrainingGradientMatchesTheClosedForm) {
  // dx = (1/M) invstd (M dy_hat - sum(dy_hat) - x_hat sum(dy_hat x_hat)), dy_hat = dy w.
  manual_seed(7);
  Tensor x = randn({3, 2, 4}, kFloat64).requires_grad_();
  Tensor w = tensor<double>({2.0, -0.5}).requires_grad_();
  Tensor dy = randn({3, 2, 4}, kFloat64);
  batch_norm(x, Tensor(), Tensor(), w, Tensor(), true).backward(dy);
  const std::vector<double> xv = x.to_vector<double>(), g = dy.to_vector<double>();
  const std::vector<double> wv{2.0, -0.5};
  std::vector<double> want(xv.size()), want_dw(2);
  const double eps = 1e-5, m = 12;
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) mean += xv[(n * 2 + c) * 4 + i] / m;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) var += std::pow(xv[(n * 2 + c) * 4 + i] - mean, 2) / m;
    const double invstd = 1 / std::sqrt(var + eps);
    double sum_dyh = 0, sum_dyh_xh = 0, sum_dy_xh = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) {
        const int k = (n * 2 + c) * 4 + i;
        const double xh = (xv[k] - mean) * invstd;
        sum_dyh += g[k] * wv[c];
        sum_dyh_xh += g[k] * wv[c] * xh;
        sum_dy_xh += g[k] * xh;
      }
    want_dw[c] = sum_dy_xh;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) {
        const int k = (n * 2 + c) * 4 + i;
        const double xh = (xv[k] - mean) * invstd;
        want[k] = invstd / m * (m * g[k] * wv[c] - sum_dyh - xh * sum_dyh_xh);
      }
  }
  EXPECT_TRUE(values_are(x.grad(), want, 1e-10));
  EXPECT_TRUE(values_are(w.grad(), want_dw, 1e-10));
}

TEST(BatchNorm, SyncPiecesMatchTheFusedKernels) {
  // Two "ranks" each hold half the batch; adding their sums stands for the allreduce.
  manual_seed(8);
  Tensor x = add(randn({6, 3, 5}, kFloat64), full({}, 4.0, kFloat64));
  Tensor w = randn({3}, kFloat64), b = randn({3}, kFloat64), dy = randn({6, 3, 5}, kFloat64);
  Tensor lo = x.narrow(0, 0, 2), hi = x.narrow(0, 2, 4);
  auto [y_fused, stats] = kernels::batch_norm_forward_train(x, w, b, 1e-5);
  kernels::BatchNormSums s_lo = kernels::batch_norm_sums(lo), s_hi = kernels::batch_norm_sums(hi);
  EXPECT_EQ(s_lo.sum.dtype(), kFloat64);
  kernels::BatchNormStats global =
      kernels::batch_norm_stats_from_sums(add(s_lo.sum, s_hi.sum), add(s_lo.sum_sq, s_hi.sum_sq),
                                          s_lo.count + s_hi.count, 1e-5, kFloat64);
  EXPECT_EQ(global.count, 30);
  EXPECT_TRUE(tensors_close(global.mean, stats.mean, 1e-10, 1e-12));
  EXPECT_TRUE(tensors_close(global.invstd, stats.invstd, 1e-8, 1e-10));
  EXPECT_TRUE(tensors_close(global.var, stats.var, 1e-8, 1e-10));
  kernels::BatchNormStats local = kernels::batch_norm_stats(x, 1e-5);
  EXPECT_TRUE(tensors_close(local.invstd, stats.invstd, 1e-12, 1e-12));
  Tensor y_lo = kernels::batch_norm_elemt(lo, global.mean, global.invstd, w, b);
  EXPECT_TRUE(tensors_close(y_lo, y_fused.narrow(0, 0, 2), 1e-8, 1e-10));

  kernels::NormGrads fused =
      kernels::batch_norm_backward(dy, x, stats.mean, stats.invstd, w, true, {true, true, true});
  Tensor dy_lo = dy.narrow(0, 0, 2), dy_hi = dy.narrow(0, 2, 4);
  auto [sd_lo, sdx_lo] = kernels::batch_norm_backward_reduce(dy_lo, lo, stats.mean, stats.invstd);
  auto [sd_hi, sdx_hi] = kernels::batch_norm_backward_reduce(dy_hi, hi, stats.mean, stats.invstd);
  Tensor sum_dy = add(sd_lo, sd_hi), sum_dy_xhat = add(sdx_lo, sdx_hi);
  EXPECT_TRUE(tensors_close(sum_dy, fused.dbias, 1e-10, 1e-10));
  EXPECT_TRUE(tensors_close(sum_dy_xhat, fused.dweight, 1e-10, 1e-10));
  Tensor dx_hi = kernels::batch_norm_backward_elemt(dy_hi, hi, stats.mean, stats.invstd, w, sum_dy,
                                                    sum_dy_xhat, 30);
  EXPECT_TRUE(tensors_close(dx_hi, fused.dx.narrow(0, 2, 4), 1e-10, 1e-10));
  // Eval: no sums, the statistics are constants.
  Tensor dx_eval =
      kernels::batch_norm_backward_elemt(dy, x, stats.mean, stats.invstd, w, Tensor(), Tensor(), 0);
  kernels::NormGrads eval =
      kernels::batch_norm_backward(dy, x, stats.mean, stats.invstd, w, false, {true, false, false});
  EXPECT_TRUE(tensors_close(dx_eval, eval.dx, 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(
      dx_eval, mul(mul(dy, w.reshape({1, 3, 1})), stats.invstd.reshape({1, 3, 1})), 1e-12, 1e-12));
  // Running statistics from the allreduced statistics.
  Tensor rm = zeros({3}, kFloat64), rv = ones({3}, kFloat64);
  kernels::batch_norm_update_running_stats_(rm, rv, global, 0.5);
  EXPECT_TRUE(tensors_close(rm, mul(global.mean, full({}, 0.5, kFloat64)), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(
      rv, add(full({3}, 0.5, kFloat64), mul(global.var, full({}, 0.5 * 30 / 29, kFloat64))), 1e-12,
      1e-12));
}

// What SyncBatchNorm relies on for float32 (Note [SyncBatchNorm and world-size invariance]):
// float64 statistics of a float32 x normalise it exactly as the fused forward does, and the
// float64 sums of backward_reduce round to the fused dweight and dbias, bit for bit.
TEST(BatchNorm, Float64PiecesGiveTheFusedFloat32ResultsBitForBit) {
  manual_seed(9);
  for (MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    const Tensor x = (randn({4, 3, 5, 6}) * 3.0 + 2.0).contiguous(format);
    const Tensor dy = randn({4, 3, 5, 6}).contiguous(format);
    const Tensor w = randn({3}), b = randn({3});
    const auto [y, stats] = kernels::batch_norm_forward_train(x, w, b, 1e-5);
    const kernels::BatchNormStats wide = kernels::batch_norm_stats(x, 1e-5, kFloat64);
    ASSERT_EQ(wide.mean.dtype(), kFloat64);
    EXPECT_EQ(wide.mean.to(kFloat32).to_vector<float>(), stats.mean.to_vector<float>());
    EXPECT_EQ(wide.invstd.to(kFloat32).to_vector<float>(), stats.invstd.to_vector<float>());
    EXPECT_EQ(kernels::batch_norm_elemt(x, wide.mean, wide.invstd, w, b).to_vector<float>(),
              y.to_vector<float>());

    const kernels::NormGrads fused =
        kernels::batch_norm_backward(dy, x, stats.mean, stats.invstd, w, true, {true, true, true});
    const auto [sum_dy, sum_dy_xhat] =
        kernels::batch_norm_backward_reduce(dy, x, stats.mean, stats.invstd);
    ASSERT_EQ(sum_dy.dtype(), kFloat64);
    ASSERT_EQ(sum_dy_xhat.dtype(), kFloat64);
    EXPECT_EQ(sum_dy.to(kFloat32).to_vector<float>(), fused.dbias.to_vector<float>());
    EXPECT_EQ(sum_dy_xhat.to(kFloat32).to_vector<float>(), fused.dweight.to_vector<float>());
    const Tensor dx = kernels::batch_norm_backward_elemt(dy, x, stats.mean, stats.invstd, w, sum_dy,
                                                         sum_dy_xhat, stats.count);
    EXPECT_EQ(dx.to_vector<float>(), fused.dx.to_vector<float>());
  }
}

TEST(BatchNorm, Errors) {
  Tensor x = randn({2, 3, 4}, kFloat64);
  Tensor c3 = ones({3}, kFloat64), c4 = ones({4}, kFloat64);
  EXPECT_LOOM_ERROR(batch_norm(randn({3}, kFloat64), Tensor(), Tensor(), Tensor(), Tensor(), true),
                    ShapeError, {"batch_norm", "[3]"});
  EXPECT_LOOM_ERROR(batch_norm(x, Tensor(), Tensor(), c4, Tensor(), true), ShapeError,
                    {"batch_norm", "weight", "[4]", "[2, 3, 4]", "[3]"});
  EXPECT_LOOM_ERROR(batch_norm(x, Tensor(), Tensor(), c3, ones({3, 1}, kFloat64), true), ShapeError,
                    {"batch_norm", "bias", "[3, 1]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(batch_norm(x, c4, c3, Tensor(), Tensor(), true), ShapeError,
                    {"batch_norm", "running_mean", "[4]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(batch_norm(x, c3, c4, Tensor(), Tensor(), false), ShapeError,
                    {"batch_norm", "running_var", "[4]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(batch_norm(x, c3, Tensor(), Tensor(), Tensor(), true), ValueError,
                    {"batch_norm", "running_var"});
  EXPECT_LOOM_ERROR(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false), ValueError,
                    {"batch_norm", "eval", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(
      batch_norm(randn({1, 3}, kFloat64), Tensor(), Tensor(), Tensor(), Tensor(), true), ValueError,
      {"batch_norm", "more than 1 value", "[1, 3]"});
  EXPECT_LOOM_ERROR(batch_norm(x, Tensor(), Tensor(), ones({3}), Tensor(), true), DTypeError,
                    {"batch_norm", "weight", "float32"});
  EXPECT_LOOM_ERROR(batch_norm(randint(0, 5, {2, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                    DTypeError, {"batch_norm"});
  // Kernel entry points check what SyncBatchNorm passes them.
  EXPECT_LOOM_ERROR(kernels::batch_norm_elemt(x, c4, c3, Tensor(), Tensor()), ShapeError,
                    {"batch_norm_elemt", "mean", "[4]"});
  EXPECT_LOOM_ERROR(kernels::batch_norm_backward_reduce(randn({2, 3}, kFloat64), x, c3, c3),
                    ShapeError, {"batch_norm_backward_reduce", "[2, 3]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(kernels::batch_norm_stats_from_sums(c3, c3, 0, 1e-5, kFloat64), ValueError,
                    {"batch_norm_stats_from_sums", "count"});
  // A bad running_var is refused before running_mean changes.
  const Tensor running_mean = zeros({3}, kFloat64);
  const kernels::BatchNormStats stats = kernels::batch_norm_stats(x, 1e-5);
  EXPECT_LOOM_ERROR(kernels::batch_norm_update_running_stats_(running_mean, c4, stats, 0.1),
                    ShapeError, {"batch_norm_update_running_stats_", "running_var", "[4]"});
  EXPECT_TRUE(values_are(running_mean, {0, 0, 0}));
}

// A 16-bit x keeps its dtype through batch norm, forward and backward, with float32 weight,
// bias, statistics and parameter gradients: its values are those of the float32 batch norm of
// the widened x, rounded once (Note [16-bit arithmetic]); channels-last stays channels-last.
TEST(BatchNorm, SixteenBitXWithFloat32Parameters) {
  manual_seed(11);
  for (DType low : {kFloat16, kBFloat16}) {
    for (MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      SCOPED_TRACE(detail::str(low, format == MemoryFormat::kChannelsLast ? " channels-last" : ""));
      const Tensor x16 = (randn({4, 3, 5, 6}) * 2.0 + 0.5).to(low).contiguous(format);
      const Tensor x32 = x16.to(kFloat32);
      const Tensor dy16 = randn({4, 3, 5, 6}).to(low).contiguous(format);
      const Tensor w = randn({3}).requires_grad_(), b = randn({3}).requires_grad_();
      const Tensor rm16 = zeros({3}), rv16 = ones({3}), rm32 = zeros({3}), rv32 = ones({3});

      const Tensor x16g = x16.detach().requires_grad_();
      const Tensor y16 = batch_norm(x16g, rm16, rv16, w, b, /*training=*/true);
      EXPECT_EQ(y16.dtype(), low);
      EXPECT_TRUE(y16.is_contiguous(format));
      (y16 * dy16).to(kFloat32).sum().backward();
      const Tensor dx16 = x16g.grad(), dw16 = w.grad().clone(), db16 = b.grad().clone();
      w.grad().zero_();
      b.grad().zero_();

      const Tensor x32g = x32.detach().requires_grad_();
      const Tensor y32 = batch_norm(x32g, rm32, rv32, w, b, /*training=*/true);
      (y32 * dy16.to(kFloat32)).sum().backward();

      // The forward rounds the float32 result once; the running statistics are float32's.
      EXPECT_TRUE(tensors_close(y16, y32.to(low), 0, 0));
      EXPECT_TRUE(tensors_close(rm16, rm32, 0, 0));
      EXPECT_TRUE(tensors_close(rv16, rv32, 0, 0));
      EXPECT_EQ(dx16.dtype(), low);
      EXPECT_TRUE(tensors_close(dx16, x32g.grad().to(low), 0, 0));
      EXPECT_EQ(dw16.dtype(), kFloat32);
      EXPECT_TRUE(tensors_close(dw16, w.grad(), 0, 0));
      EXPECT_TRUE(tensors_close(db16, b.grad(), 0, 0));
      // Eval mode with the running statistics.
      EXPECT_TRUE(tensors_close(batch_norm(x16, rm16, rv16, w, b, false),
                                batch_norm(x32, rm32, rv32, w, b, false).to(low), 0, 0));
    }
  }
  // Parameters must be float32 for a 16-bit x.
  EXPECT_LOOM_ERROR(batch_norm(randn({2, 3}).to(kFloat16), Tensor(), Tensor(),
                               ones({3}).to(kFloat16), Tensor(), true),
                    DTypeError, {"batch_norm", "weight", "float32", "float16"});
}

// The CPU loops read and write a bfloat16 x, residual, dy and relu_y as they are, a chunk of a
// row at a time (Note [Batch norm on bfloat16]): every output is that of the float32 loops on
// widened copies, rounded once, bit for bit. Rows longer than a chunk (600 values, and 300
// channels-last), a last chunk that is not a whole number of lanes, every epilogue.
TEST(BatchNorm, BFloat16LoopsMatchTheFloat32LoopsOnWidenedCopies) {
  manual_seed(12);
  using kernels::BatchNormEpilogue;
  for (const Shape& shape : {Shape{3, 4, 20, 30}, Shape{2, 300, 3, 3}}) {
    for (MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      for (int form = 0; form < 3; ++form) {  // no epilogue; ReLU; residual and ReLU
        SCOPED_TRACE(
            detail::str(shape, format == MemoryFormat::kChannelsLast ? " cl" : "", " ", form));
        const int64_t c = shape[1];
        auto low = [&](double scale) {
          return (randn(shape) * scale + 0.25).to(kBFloat16).contiguous(format);
        };
        const Tensor x = low(3.0), dy = low(1.0), residual = low(1.0);
        const Tensor w = randn({c}), b = randn({c});
        const BatchNormEpilogue e16{form == 2 ? residual : Tensor(), form > 0};
        const BatchNormEpilogue e32{form == 2 ? residual.to(kFloat32) : Tensor(), form > 0};

        const auto [y16, s16] = kernels::batch_norm_forward_train(x, w, b, 1e-5, e16);
        const auto [y32, s32] = kernels::batch_norm_forward_train(x.to(kFloat32), w, b, 1e-5, e32);
        ASSERT_EQ(y16.dtype(), kBFloat16);
        EXPECT_TRUE(y16.is_contiguous(format));
        EXPECT_TRUE(tensors_close(y16, y32.to(kBFloat16), 0, 0));
        EXPECT_EQ(s16.mean.dtype(), kFloat32);
        EXPECT_TRUE(tensors_close(s16.mean, s32.mean, 0, 0));
        EXPECT_TRUE(tensors_close(s16.invstd, s32.invstd, 0, 0));
        EXPECT_TRUE(tensors_close(s16.var, s32.var, 0, 0));
        EXPECT_TRUE(
            tensors_close(kernels::batch_norm_elemt(x, s16.mean, s16.invstd, w, b, e16),
                          kernels::batch_norm_elemt(x.to(kFloat32), s32.mean, s32.invstd, w, b, e32)
                              .to(kBFloat16),
                          0, 0));

        const Tensor relu_y = form > 0 ? y16 : Tensor();
        const kernels::NormGrads g16 = kernels::batch_norm_backward(
            dy, x, s16.mean, s16.invstd, w, true, {true, true, true}, relu_y, form > 0);
        const kernels::NormGrads g32 = kernels::batch_norm_backward(
            dy.to(kFloat32), x.to(kFloat32), s32.mean, s32.invstd, w, true, {true, true, true},
            form > 0 ? relu_y.to(kFloat32) : Tensor(), form > 0);
        ASSERT_EQ(g16.dx.dtype(), kBFloat16);
        EXPECT_TRUE(g16.dx.is_contiguous(format));
        EXPECT_TRUE(tensors_close(g16.dx, g32.dx.to(kBFloat16), 0, 0));
        EXPECT_EQ(g16.dweight.dtype(), kFloat32);
        EXPECT_TRUE(tensors_close(g16.dweight, g32.dweight, 0, 0));
        EXPECT_TRUE(tensors_close(g16.dbias, g32.dbias, 0, 0));
        if (form > 0) {
          EXPECT_TRUE(tensors_close(g16.dresidual, g32.dresidual.to(kBFloat16), 0, 0));
        }
        // Eval mode: dx alone, from the running statistics' form (no sums).
        const kernels::NormGrads e = kernels::batch_norm_backward(
            dy, x, s16.mean, s16.invstd, w, false, {true, false, false}, Tensor(), false);
        EXPECT_TRUE(tensors_close(
            e.dx,
            kernels::batch_norm_backward(dy.to(kFloat32), x.to(kFloat32), s32.mean, s32.invstd, w,
                                         false, {true, false, false}, Tensor(), false)
                .dx.to(kBFloat16),
            0, 0));
      }
    }
  }
}

// ---------------------------------------------------------------- layer norm

TEST(LayerNorm, ForwardMatchesReference) {
  manual_seed(9);
  Tensor x = add(randn({3, 4, 5}, kFloat64), full({}, 1.5, kFloat64));
  Tensor w1 = randn({5}, kFloat64), b1 = randn({5}, kFloat64);
  EXPECT_TRUE(tensors_close(
      layer_norm(x, {5}, w1, b1),
      from(ref_layer_norm(x, 5, w1.to_vector<double>(), b1.to_vector<double>(), 1e-5), x.sizes()),
      1e-10, 1e-10));
  Tensor w2 = randn({4, 5}, kFloat64), b2 = randn({4, 5}, kFloat64);
  EXPECT_TRUE(tensors_close(
      layer_norm(x, {4, 5}, w2, b2, 1e-3),
      from(ref_layer_norm(x, 20, w2.to_vector<double>(), b2.to_vector<double>(), 1e-3), x.sizes()),
      1e-10, 1e-10));
  EXPECT_TRUE(tensors_close(layer_norm(x, {5}), from(ref_layer_norm(x, 5, {}, {}, 1e-5), x.sizes()),
                            1e-10, 1e-10));
  EXPECT_TRUE(tensors_close(layer_norm(x, {5}, w1),
                            from(ref_layer_norm(x, 5, w1.to_vector<double>(), {}, 1e-5), x.sizes()),
                            1e-10, 1e-10));
  EXPECT_TRUE(tensors_close(layer_norm(x, {5}, Tensor(), b1),
                            from(ref_layer_norm(x, 5, {}, b1.to_vector<double>(), 1e-5), x.sizes()),
                            1e-10, 1e-10));
  // float32, a non-contiguous input, and enough rows to use several threads.
  Tensor big = randn({300, 2, 96}).transpose(0, 1);
  EXPECT_TRUE(tensors_close(
      layer_norm(big, {96}),
      from(ref_layer_norm(big.contiguous(), 96, {}, {}, 1e-5), big.sizes()).to(kFloat32), 1e-4,
      1e-4));
}

TEST(LayerNorm, Gradcheck) {
  manual_seed(10);
  Tensor x = dparam({2, 3, 4}), w = dparam({4}), b = dparam({4});
  EXPECT_GRADCHECK([](In t) { return layer_norm(t[0], {4}, t[1], t[2]); }, {x, w, b});
  Tensor w2 = dparam({3, 4}), b2 = dparam({3, 4});
  EXPECT_GRADCHECK([](In t) { return layer_norm(t[0], {3, 4}, t[1], t[2], 1e-3); }, {x, w2, b2});
  EXPECT_GRADCHECK([](In t) { return layer_norm(t[0], {4}); }, {x});
  EXPECT_GRADCHECK([](In t) { return layer_norm(t[0], {4}, Tensor(), t[1]); }, {x, b});
}

// The float32 backward (rows in fixed blocks, dweight and dbias summed per block: Note [Layer
// norm backward in one pass]) against float64's, with and without a weight, for each set of
// gradients, and to the bit the same on 1 and 2 threads.
TEST(LayerNorm, Float32BackwardMatchesFloat64OnAnyThreadCount) {
  manual_seed(11);
  const int64_t rows = 700, cols = 96;  // several blocks, the last one short
  const Tensor x = add(randn({rows, cols}, kFloat64), full({}, 2.0, kFloat64));
  const Tensor dy = randn({rows, cols}, kFloat64), b = randn({cols}, kFloat64);
  const int threads = get_num_threads();
  for (const Tensor& w : {randn({cols}, kFloat64), Tensor()}) {
    SCOPED_TRACE(w.defined() ? "with a weight" : "without a weight");
    const auto f64 = kernels::layer_norm_forward(x, cols, w, b, 1e-5);
    const kernels::NormGrads want =
        kernels::layer_norm_backward(dy, x, f64.mean, f64.rstd, w, cols, {true, true, true});
    const Tensor x32 = x.to(kFloat32), dy32 = dy.to(kFloat32);
    const Tensor w32 = w.defined() ? w.to(kFloat32) : Tensor();
    const auto f32 = kernels::layer_norm_forward(x32, cols, w32, b.to(kFloat32), 1e-5);
    for (const std::array<bool, 3> need :
         {std::array<bool, 3>{true, true, true}, std::array<bool, 3>{true, false, false},
          std::array<bool, 3>{false, true, true}}) {
      std::vector<kernels::NormGrads> got;
      for (int t : {1, 2}) {
        set_num_threads(t);
        got.push_back(kernels::layer_norm_backward(dy32, x32, f32.mean, f32.rstd, w32, cols, need));
      }
      set_num_threads(threads);
      const kernels::NormGrads& g = got[0];
      ASSERT_EQ(g.dx.defined(), need[0]);
      ASSERT_EQ(g.dweight.defined(), need[1]);
      ASSERT_EQ(g.dbias.defined(), need[2]);
      if (need[0]) {
        EXPECT_TRUE(tensors_close(g.dx, want.dx.to(kFloat32), 1e-4, 1e-4));
        EXPECT_TRUE(tensors_close(g.dx, got[1].dx, 0, 0));
      }
      if (need[1]) {
        EXPECT_TRUE(tensors_close(g.dweight, want.dweight.to(kFloat32), 1e-4, 1e-3));
        EXPECT_TRUE(tensors_close(g.dweight, got[1].dweight, 0, 0));
        EXPECT_TRUE(tensors_close(g.dbias, want.dbias.to(kFloat32), 1e-4, 1e-3));
        EXPECT_TRUE(tensors_close(g.dbias, got[1].dbias, 0, 0));
      }
    }
  }
}

TEST(LayerNorm, Errors) {
  Tensor x = randn({2, 3, 4}, kFloat64);
  EXPECT_LOOM_ERROR(layer_norm(x, {3}), ShapeError, {"layer_norm", "[3]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(layer_norm(x, {1, 2, 3, 4}), ShapeError, {"layer_norm", "[1, 2, 3, 4]"});
  EXPECT_LOOM_ERROR(layer_norm(x, {4}, ones({3}, kFloat64)), ShapeError,
                    {"layer_norm", "weight", "[3]", "[4]"});
  EXPECT_LOOM_ERROR(layer_norm(x, {3, 4}, Tensor(), ones({12}, kFloat64)), ShapeError,
                    {"layer_norm", "bias", "[12]", "[3, 4]"});
  EXPECT_LOOM_ERROR(layer_norm(x, {4}, ones({4})), DTypeError, {"layer_norm", "weight"});
  EXPECT_LOOM_ERROR(layer_norm(randint(0, 3, {2, 4}), {4}), DTypeError, {"layer_norm"});
}
