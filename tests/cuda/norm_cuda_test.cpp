// tests/cuda/norm_cuda_test.cpp — the CUDA batch norm and layer norm kernels
// (tensor/cuda/norm.h) against the CPU kernels: every function, the SyncBatchNorm pieces, both
// channel layouts (S >= 16 and S = 1), split channels, strided inputs, optional weight and bias,
// and bit-for-bit repeatability. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/copy.h"
#include "tensor/cuda/norm.h"
#include "tensor/elementwise.h"
#include "tensor/norm.h"

namespace loom {
namespace {

namespace k = loom::kernels;
namespace kc = loom::cuda;
using test::cuda_matches_cpu;
using test::kCuda0;

Tensor gpu(const Tensor& t) { return t.defined() ? t.to(kCuda0) : t; }

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(kCPU), hb = b.to(kCPU);
  if (ha.sizes() != hb.sizes() || ha.dtype() != hb.dtype())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  if (std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

double rtol_of(DType dtype) { return dtype == kFloat32 ? 1e-4 : 1e-10; }
double atol_of(DType dtype) { return dtype == kFloat32 ? 1e-5 : 1e-12; }

// x [N, C, *] shapes: S >= 16 (a block per channel), S = 1 and small S (channels side by side),
// few channels with many values (split), and empty.
const std::vector<Shape> kShapes = {
    {8, 3, 5, 7}, {64, 16}, {2, 4, 3}, {16, 8, 64, 64}, {4096, 2}, {1, 5, 1000003}, {3, 2, 0},
};

// Non-zero mean and a spread, so that centring matters.
Tensor batch(const Shape& shape, DType dtype) {
  return k::add_scalar(k::mul_scalar(randn(shape, dtype), 2.0), 0.5);
}

TEST(CudaNorm, BatchNormStatistics) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(1);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(detail::str("x=", shape, " ", dtype));
      const Tensor x = batch(shape, dtype), gx = gpu(x);
      const double rtol = rtol_of(dtype), atol = atol_of(dtype);
      const k::BatchNormSums cs = k::batch_norm_sums(x);
      const k::BatchNormSums gs = kc::batch_norm_sums(gx);
      EXPECT_EQ(gs.count, cs.count);
      EXPECT_TRUE(cuda_matches_cpu(gs.sum, cs.sum, 1e-10, 1e-9));
      EXPECT_TRUE(cuda_matches_cpu(gs.sum_sq, cs.sum_sq, 1e-10, 1e-9));
      const k::BatchNormStats c = k::batch_norm_stats(x, 1e-5);
      const k::BatchNormStats g = kc::batch_norm_stats(gx, 1e-5);
      EXPECT_EQ(g.count, c.count);
      EXPECT_TRUE(cuda_matches_cpu(g.mean, c.mean, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(g.var, c.var, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(g.invstd, c.invstd, rtol, atol));
      if (cs.count == 0) continue;
      const k::BatchNormStats cf =
          k::batch_norm_stats_from_sums(cs.sum, cs.sum_sq, cs.count, 1e-3, dtype);
      const k::BatchNormStats gf =
          kc::batch_norm_stats_from_sums(gpu(cs.sum), gpu(cs.sum_sq), cs.count, 1e-3, dtype);
      EXPECT_TRUE(cuda_matches_cpu(gf.mean, cf.mean, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(gf.var, cf.var, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(gf.invstd, cf.invstd, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(kc::batch_norm_invstd(gpu(c.var), 1e-5),
                                   k::batch_norm_invstd(c.var, 1e-5), rtol, atol));
    }
  }
  EXPECT_LOOM_ERROR(k::batch_norm_sums(gpu(randn({5}))), ShapeError, {"batch_norm_sums", "[5]"});
  EXPECT_LOOM_ERROR(k::batch_norm_stats_from_sums(gpu(randn({3}, kFloat64)),
                                                  gpu(randn({3}, kFloat64)), 0, 1e-5, kFloat32),
                    ValueError, {"batch_norm_stats_from_sums", "count"});
}

// Note [One-pass moments]: a mean far from 0 against a small spread still gives the CPU's
// two-pass statistics, in float32 and in layer norm's rows. In float64 at 1e9 against 1, sums of
// x and x^2 without the shift would lose every bit of the variance (E[x^2] ~ 1e18, whose ulp is
// 128): this case fails unless the shift works.
TEST(CudaNorm, OnePassMomentsOfAnOffsetBatch) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  {
    const Tensor x = k::add_scalar(randn({64, 3, 5, 5}, kFloat64), 1e9);
    const k::BatchNormStats c = k::batch_norm_stats(x, 0.0);
    const k::BatchNormStats g = kc::batch_norm_stats(gpu(x), 0.0);
    EXPECT_TRUE(cuda_matches_cpu(g.mean, c.mean, 1e-15, 0));
    EXPECT_TRUE(cuda_matches_cpu(g.var, c.var, 1e-6, 0));
  }
  for (const Shape& shape : {Shape{16, 8, 6, 6}, Shape{512, 4}}) {
    SCOPED_TRACE(detail::str("x=", shape));
    const Tensor x = k::add_scalar(randn(shape), 1e4);
    const k::BatchNormStats c = k::batch_norm_stats(x, 1e-5);
    const k::BatchNormStats g = kc::batch_norm_stats(gpu(x), 1e-5);
    EXPECT_TRUE(cuda_matches_cpu(g.mean, c.mean, 1e-6, 0));
    EXPECT_TRUE(cuda_matches_cpu(g.var, c.var, 1e-4, 0));
    const auto [cy, cs] = k::batch_norm_forward_train(x, Tensor(), Tensor(), 1e-5);
    const auto [gy, gs] = kc::batch_norm_forward_train(gpu(x), Tensor(), Tensor(), 1e-5);
    EXPECT_TRUE(cuda_matches_cpu(gs.invstd, cs.invstd, 1e-4, 0));
    EXPECT_TRUE(cuda_matches_cpu(gy, cy, 1e-3, 1e-3));
  }
  const Tensor rows = k::add_scalar(randn({64, 300}), -3e3);
  const k::LayerNormForward c = k::layer_norm_forward(rows, 300, Tensor(), Tensor(), 1e-5);
  const k::LayerNormForward g = kc::layer_norm_forward(gpu(rows), 300, Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(cuda_matches_cpu(g.mean, c.mean, 1e-6, 0));
  EXPECT_TRUE(cuda_matches_cpu(g.rstd, c.rstd, 1e-4, 0));
  EXPECT_TRUE(cuda_matches_cpu(g.out, c.out, 1e-3, 1e-3));
}

TEST(CudaNorm, RunningStatistics) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(2);
  const Tensor x = batch({32, 6, 9}, kFloat32);
  const k::BatchNormStats c = k::batch_norm_stats(x, 1e-5);
  const k::BatchNormStats g = kc::batch_norm_stats(gpu(x), 1e-5);
  for (DType running_dtype : {kFloat32, kFloat64}) {
    const Tensor mean = rand({6}, running_dtype), var = rand({6}, running_dtype);
    const Tensor cm = k::clone(mean), cv = k::clone(var);
    const Tensor gm = gpu(mean), gv = gpu(var);
    const uint64_t version = gm.version();
    k::batch_norm_update_running_stats_(cm, cv, c, 0.1);
    kc::batch_norm_update_running_stats_(gm, gv, g, 0.1);
    EXPECT_GT(gm.version(), version);
    EXPECT_TRUE(cuda_matches_cpu(gm, cm, 1e-5, 1e-6));
    EXPECT_TRUE(cuda_matches_cpu(gv, cv, 1e-5, 1e-6));
    // A strided running buffer (every other element of a longer one).
    const Tensor long_mean = rand({12}, running_dtype);
    const Tensor cl = k::clone(long_mean), gl = gpu(long_mean);
    k::batch_norm_update_running_stats_(cl.slice(0, 0, 12, 2), Tensor(), c, 0.3);
    kc::batch_norm_update_running_stats_(gl.slice(0, 0, 12, 2), Tensor(), g, 0.3);
    EXPECT_TRUE(cuda_matches_cpu(gl, cl, 1e-5, 1e-6));
  }
  k::BatchNormStats one = g;
  one.count = 1;
  EXPECT_LOOM_ERROR(k::batch_norm_update_running_stats_(Tensor(), gpu(rand({6})), one, 0.1),
                    ValueError, {"batch_norm_update_running_stats_", "count=1"});
}

TEST(CudaNorm, BatchNormForward) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kShapes) {
      const Tensor x = batch(shape, dtype), gx = gpu(x);
      const Tensor weight = randn({shape[1]}, dtype), bias = randn({shape[1]}, dtype);
      const double rtol = rtol_of(dtype), atol = atol_of(dtype);
      for (bool affine : {false, true}) {
        SCOPED_TRACE(detail::str("x=", shape, " ", dtype, " affine=", affine));
        const Tensor w = affine ? weight : Tensor(), b = affine ? bias : Tensor();
        const auto [cy, cs] = k::batch_norm_forward_train(x, w, b, 1e-5);
        const auto [gy, gs] = kc::batch_norm_forward_train(gx, gpu(w), gpu(b), 1e-5);
        EXPECT_TRUE(cuda_matches_cpu(gy, cy, rtol, atol));
        EXPECT_TRUE(cuda_matches_cpu(gs.mean, cs.mean, rtol, atol));
        EXPECT_TRUE(cuda_matches_cpu(gs.var, cs.var, rtol, atol));
        EXPECT_TRUE(cuda_matches_cpu(gs.invstd, cs.invstd, rtol, atol));
        EXPECT_EQ(gs.count, cs.count);
        // The elementwise piece with the statistics given (eval, or SyncBatchNorm).
        EXPECT_TRUE(
            cuda_matches_cpu(kc::batch_norm_elemt(gx, gpu(cs.mean), gpu(cs.invstd), gpu(w), gpu(b)),
                             k::batch_norm_elemt(x, cs.mean, cs.invstd, w, b), rtol, atol));
      }
    }
  }
  // A strided x: [C, N, S] transposed to [N, C, S].
  const Tensor base = batch({6, 10, 20}, kFloat32);
  const auto [cy, cs] = k::batch_norm_forward_train(base.transpose(0, 1), Tensor(), Tensor(), 1e-5);
  const auto [gy, gs] =
      kc::batch_norm_forward_train(gpu(base).transpose(0, 1), Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(cuda_matches_cpu(gy, cy, 1e-4, 1e-5));
  EXPECT_TRUE(cuda_matches_cpu(gs.mean, cs.mean, 1e-4, 1e-5));
  EXPECT_LOOM_ERROR(
      k::batch_norm_elemt(gpu(randn({4, 3})), gpu(randn({2})), gpu(randn({3})), Tensor(), Tensor()),
      ShapeError, {"batch_norm_elemt", "mean", "[2]"});
  EXPECT_LOOM_ERROR(
      k::batch_norm_forward_train(gpu(randint(0, 5, {4, 3})), Tensor(), Tensor(), 1e-5), DTypeError,
      {"batch_norm", "int64"});
}

// f(dtype, tol, shape, format) for each dtype and for x [N, C, H, W] and [N, C] shapes in each
// layout that fits them (channels-last is 4-D only), under a trace that names the case; tol
// is one rounding of the dtype (float32 and float64: 1e-4).
template <typename F>
void for_each_layout_case(std::initializer_list<DType> dtypes, F&& f) {
  for (DType dtype : dtypes) {
    const double tol = dtype == kFloat16 ? 2e-3 : dtype == kBFloat16 ? 1.6e-2 : 1e-4;
    for (const Shape& shape : {Shape{8, 16, 5, 7}, Shape{32, 64, 4, 4}, Shape{64, 16}}) {
      for (bool channels_last : {false, true}) {
        if (channels_last && shape.size() != 4) continue;
        SCOPED_TRACE(detail::str("x=", shape, " ", dtype, channels_last ? " channels-last" : ""));
        f(dtype, tol, shape,
          channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous);
      }
    }
  }
}

// A 16-bit x (read and written element by element, statistics and parameters in float32) and a
// channels-last x (read in place as [N H W, C, 1]) against the CPU, which widens a 16-bit x to
// float32 and rounds once: y and dx within a 16-bit rounding (FMA contraction may move the float
// value by an ulp), in x's dtype and format; dy comes NCHW and is converted.
TEST(CudaNorm, SixteenBitAndChannelsLastBatchNorm) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(9);
  for_each_layout_case(
      {kFloat16, kBFloat16, kFloat32},
      [](DType dtype, double tol, const Shape& shape, MemoryFormat format) {
        const Tensor x = batch(shape, kFloat32).to(dtype).contiguous(format);
        const Tensor dy = randn(shape).to(dtype);
        const Tensor weight = randn({shape[1]}), bias = randn({shape[1]});
        const auto [cy, cs] = k::batch_norm_forward_train(x, weight, bias, 1e-5);
        const auto [gy, gs] = kc::batch_norm_forward_train(gpu(x), gpu(weight), gpu(bias), 1e-5);
        EXPECT_EQ(gy.dtype(), dtype);
        EXPECT_EQ(gs.mean.dtype(), kFloat32);
        EXPECT_TRUE(gy.is_contiguous(format));
        EXPECT_TRUE(cuda_matches_cpu(gy, cy, tol, tol));
        EXPECT_TRUE(cuda_matches_cpu(gs.mean, cs.mean, 1e-5, 1e-6));
        EXPECT_TRUE(cuda_matches_cpu(gs.invstd, cs.invstd, 1e-5, 1e-6));
        const k::NormGrads c =
            k::batch_norm_backward(dy, x, cs.mean, cs.invstd, weight, true, {true, true, true});
        const k::NormGrads g = kc::batch_norm_backward(gpu(dy), gpu(x), gs.mean, gs.invstd,
                                                       gpu(weight), true, {true, true, true});
        EXPECT_EQ(g.dx.dtype(), dtype);
        EXPECT_TRUE(g.dx.is_contiguous(format));
        EXPECT_TRUE(cuda_matches_cpu(g.dx, c.dx, tol, tol));
        EXPECT_TRUE(cuda_matches_cpu(g.dweight, c.dweight, 1e-4, 1e-4));
        EXPECT_TRUE(cuda_matches_cpu(g.dbias, c.dbias, 1e-4, 1e-4));
        EXPECT_TRUE(cuda_matches_cpu(
            kc::batch_norm_elemt(gpu(x), gs.mean, gs.invstd, gpu(weight), gpu(bias)),
            k::batch_norm_elemt(x, cs.mean, cs.invstd, weight, bias), tol, tol));
      });
}

// Note [Batch norm with ReLU]: the epilogue (residual, ReLU) of the forward kernels and the
// masked backward with the residual's gradient, against the CPU. Both backwards take the CPU's
// y as the mask, so an output that rounds to 0 on one device only cannot flip a mask bit.
TEST(CudaNorm, BatchNormReluEpilogue) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(10);
  for_each_layout_case({kFloat32, kFloat16, kBFloat16, kFloat64}, [](DType dtype, double tol,
                                                                     const Shape& shape,
                                                                     MemoryFormat format) {
    const DType pd = k::batch_norm_param_dtype(dtype);
    const Tensor x = batch(shape, kFloat32).to(dtype).contiguous(format);
    const Tensor res = randn(shape).to(dtype), dy = randn(shape).to(dtype);
    const Tensor weight = randn({shape[1]}, pd), bias = randn({shape[1]}, pd);
    for (const Tensor& r : {Tensor(), res}) {
      const k::BatchNormEpilogue ce{r, true}, ge{gpu(r), true};
      const auto [cy, cs] = k::batch_norm_forward_train(x, weight, bias, 1e-5, ce);
      const auto [gy, gs] = kc::batch_norm_forward_train(gpu(x), gpu(weight), gpu(bias), 1e-5, ge);
      EXPECT_TRUE(gy.is_contiguous(format));
      EXPECT_TRUE(cuda_matches_cpu(gy, cy, tol, tol));
      EXPECT_TRUE(cuda_matches_cpu(
          kc::batch_norm_elemt(gpu(x), gpu(cs.mean), gpu(cs.invstd), gpu(weight), gpu(bias), ge),
          k::batch_norm_elemt(x, cs.mean, cs.invstd, weight, bias, ce), tol, tol));
      for (bool training : {true, false}) {
        SCOPED_TRACE(detail::str("residual=", r.defined(), " training=", training));
        const k::NormGrads c = k::batch_norm_backward(dy, x, cs.mean, cs.invstd, weight, training,
                                                      {true, true, true}, cy, true);
        const k::NormGrads g =
            kc::batch_norm_backward(gpu(dy), gpu(x), gpu(cs.mean), gpu(cs.invstd), gpu(weight),
                                    training, {true, true, true}, gpu(cy), true);
        EXPECT_TRUE(g.dx.is_contiguous(format));
        EXPECT_TRUE(cuda_matches_cpu(g.dx, c.dx, tol, tol));
        EXPECT_TRUE(cuda_matches_cpu(g.dweight, c.dweight, 1e-4, 1e-4));
        EXPECT_TRUE(cuda_matches_cpu(g.dbias, c.dbias, 1e-4, 1e-4));
        EXPECT_TRUE(cuda_matches_cpu(g.dresidual, c.dresidual, 0, 0));  // dy or 0, exactly
        // The residual's gradient alone.
        const k::NormGrads only =
            kc::batch_norm_backward(gpu(dy), gpu(x), gpu(cs.mean), gpu(cs.invstd), gpu(weight),
                                    training, {false, false, false}, gpu(cy), true);
        EXPECT_FALSE(only.dx.defined());
        EXPECT_TRUE(cuda_matches_cpu(only.dresidual, c.dresidual, 0, 0));
      }
    }
  });
}

TEST(CudaNorm, BatchNormBackward) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(4);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kShapes) {
      const Tensor x = batch(shape, dtype), dy = randn(shape, dtype);
      const Tensor gx = gpu(x), gdy = gpu(dy);
      const k::BatchNormStats st = k::batch_norm_stats(x, 1e-5);
      const Tensor gmean = gpu(st.mean), ginvstd = gpu(st.invstd);
      const Tensor weight = randn({shape[1]}, dtype);
      const double rtol = rtol_of(dtype), atol = dtype == kFloat32 ? 1e-4 : 1e-10;
      SCOPED_TRACE(detail::str("x=", shape, " ", dtype));
      // The SyncBatchNorm pieces: local sums, then dx from (here: unreduced) sums.
      const auto [c_sum_dy, c_sum_dy_xhat] =
          k::batch_norm_backward_reduce(dy, x, st.mean, st.invstd);
      const auto [g_sum_dy, g_sum_dy_xhat] =
          kc::batch_norm_backward_reduce(gdy, gx, gmean, ginvstd);
      EXPECT_TRUE(cuda_matches_cpu(g_sum_dy, c_sum_dy, rtol, atol));
      EXPECT_TRUE(cuda_matches_cpu(g_sum_dy_xhat, c_sum_dy_xhat, rtol, atol));
      const int64_t count = shape[0] * (x.numel() / std::max<int64_t>(shape[0] * shape[1], 1));
      if (count > 0) {
        EXPECT_TRUE(cuda_matches_cpu(
            kc::batch_norm_backward_elemt(gdy, gx, gmean, ginvstd, gpu(weight), gpu(c_sum_dy),
                                          gpu(c_sum_dy_xhat), count),
            k::batch_norm_backward_elemt(dy, x, st.mean, st.invstd, weight, c_sum_dy, c_sum_dy_xhat,
                                         count),
            rtol, atol));
      }
      EXPECT_TRUE(cuda_matches_cpu(
          kc::batch_norm_backward_elemt(gdy, gx, gmean, ginvstd, Tensor(), Tensor(), Tensor(), 0),
          k::batch_norm_backward_elemt(dy, x, st.mean, st.invstd, Tensor(), Tensor(), Tensor(), 0),
          rtol, atol));
      // The fused backward, training and eval, each subset of gradients.
      for (bool training : {true, false}) {
        for (const std::array<bool, 3> need :
             {std::array<bool, 3>{true, true, true}, std::array<bool, 3>{true, false, false},
              std::array<bool, 3>{false, true, true}, std::array<bool, 3>{false, false, true}}) {
          SCOPED_TRACE(detail::str("training=", training, " need=", need[0], need[1], need[2]));
          const k::NormGrads c =
              k::batch_norm_backward(dy, x, st.mean, st.invstd, weight, training, need);
          const k::NormGrads g =
              kc::batch_norm_backward(gdy, gx, gmean, ginvstd, gpu(weight), training, need);
          EXPECT_EQ(g.dx.defined(), need[0]);
          EXPECT_EQ(g.dweight.defined(), need[1]);
          EXPECT_EQ(g.dbias.defined(), need[2]);
          if (need[0]) {
            EXPECT_TRUE(cuda_matches_cpu(g.dx, c.dx, rtol, atol));
          }
          if (need[1]) {
            EXPECT_TRUE(cuda_matches_cpu(g.dweight, c.dweight, rtol, atol));
          }
          if (need[2]) {
            EXPECT_TRUE(cuda_matches_cpu(g.dbias, c.dbias, rtol, atol));
          }
        }
      }
    }
  }
  EXPECT_LOOM_ERROR(k::batch_norm_backward_elemt(gpu(randn({4, 3})), gpu(randn({4, 3})),
                                                 gpu(randn({3})), gpu(randn({3})), Tensor(),
                                                 gpu(randn({3}, kFloat64)), Tensor(), 4),
                    ValueError, {"batch_norm_backward_elemt", "sum_dy"});
  EXPECT_LOOM_ERROR(k::batch_norm_backward_reduce(gpu(randn({4, 3})), gpu(randn({3, 4})),
                                                  gpu(randn({4})), gpu(randn({4}))),
                    ShapeError, {"batch_norm_backward_reduce", "[4, 3]", "[3, 4]"});
}

struct LayerCase {
  Shape shape;
  int64_t normalized;  // product of the trailing normalised dims
};
const std::vector<LayerCase> kLayerCases = {
    {{4096, 1000}, 1000},                         // a block per row
    {{8, 16, 7}, 7},                              // short rows side by side
    {{2, 3, 4, 5}, 20},   {{3, 100003}, 100003},  // few long rows: split
    {{0, 6}, 6},
};

TEST(CudaNorm, LayerNorm) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const LayerCase& c : kLayerCases) {
      const Tensor x = batch(c.shape, dtype), dy = randn(c.shape, dtype);
      const Tensor weight = randn({c.normalized}, dtype), bias = randn({c.normalized}, dtype);
      const Tensor gx = gpu(x), gdy = gpu(dy);
      const double rtol = rtol_of(dtype), atol = dtype == kFloat32 ? 1e-4 : 1e-10;
      for (bool affine : {false, true}) {
        SCOPED_TRACE(detail::str("x=", c.shape, " ", dtype, " affine=", affine));
        const Tensor w = affine ? weight : Tensor(), b = affine ? bias : Tensor();
        const k::LayerNormForward cf = k::layer_norm_forward(x, c.normalized, w, b, 1e-5);
        const k::LayerNormForward gf =
            kc::layer_norm_forward(gx, c.normalized, gpu(w), gpu(b), 1e-5);
        EXPECT_TRUE(cuda_matches_cpu(gf.out, cf.out, rtol, atol));
        EXPECT_TRUE(cuda_matches_cpu(gf.mean, cf.mean, rtol, atol));
        EXPECT_TRUE(cuda_matches_cpu(gf.rstd, cf.rstd, rtol, atol));
        for (const std::array<bool, 3> need :
             {std::array<bool, 3>{true, true, true}, std::array<bool, 3>{true, false, false},
              std::array<bool, 3>{false, true, false}}) {
          const k::NormGrads cg =
              k::layer_norm_backward(dy, x, cf.mean, cf.rstd, w, c.normalized, need);
          const k::NormGrads gg = kc::layer_norm_backward(gdy, gx, gpu(cf.mean), gpu(cf.rstd),
                                                          gpu(w), c.normalized, need);
          if (need[0]) {
            EXPECT_TRUE(cuda_matches_cpu(gg.dx, cg.dx, rtol, atol));
          }
          if (need[1]) {
            EXPECT_TRUE(cuda_matches_cpu(gg.dweight, cg.dweight, rtol, atol));
          }
          if (need[2]) {
            EXPECT_TRUE(cuda_matches_cpu(gg.dbias, cg.dbias, rtol, atol));
          }
        }
      }
    }
  }
  // A strided x.
  const Tensor base = batch({64, 48}, kFloat32);
  EXPECT_TRUE(cuda_matches_cpu(
      kc::layer_norm_forward(gpu(base).t(), 64, Tensor(), Tensor(), 1e-5).out,
      k::layer_norm_forward(base.t(), 64, Tensor(), Tensor(), 1e-5).out, 1e-4, 1e-5));
  EXPECT_LOOM_ERROR(k::layer_norm_forward(gpu(randn({4, 6})), 5, Tensor(), Tensor(), 1e-5),
                    ShapeError, {"layer_norm", "5", "[4, 6]"});
  EXPECT_LOOM_ERROR(k::layer_norm_forward(gpu(randn({4, 6})), 6, gpu(randn({5})), Tensor(), 1e-5),
                    ShapeError, {"layer_norm", "weight", "[5]"});
}

TEST(CudaNorm, SameBitsEveryRun) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  const Tensor x = gpu(batch({16, 8, 64, 64}, kFloat32)), dy = gpu(randn({16, 8, 64, 64}));
  const k::BatchNormSums a = kc::batch_norm_sums(x), b = kc::batch_norm_sums(x);
  EXPECT_TRUE(same_bits(a.sum, b.sum));
  EXPECT_TRUE(same_bits(a.sum_sq, b.sum_sq));
  const k::BatchNormStats st = kc::batch_norm_stats(x, 1e-5);
  const auto r1 = kc::batch_norm_backward_reduce(dy, x, st.mean, st.invstd);
  const auto r2 = kc::batch_norm_backward_reduce(dy, x, st.mean, st.invstd);
  EXPECT_TRUE(same_bits(r1.first, r2.first));
  EXPECT_TRUE(same_bits(r1.second, r2.second));
  const Tensor rows = gpu(batch({4096, 1000}, kFloat32)), drows = gpu(randn({4096, 1000}));
  const k::LayerNormForward f = kc::layer_norm_forward(rows, 1000, Tensor(), Tensor(), 1e-5);
  const std::array<bool, 3> all = {true, true, true};
  const k::NormGrads g1 = kc::layer_norm_backward(drows, rows, f.mean, f.rstd, Tensor(), 1000, all);
  const k::NormGrads g2 = kc::layer_norm_backward(drows, rows, f.mean, f.rstd, Tensor(), 1000, all);
  EXPECT_TRUE(same_bits(g1.dx, g2.dx));
  EXPECT_TRUE(same_bits(g1.dweight, g2.dweight));
  EXPECT_TRUE(same_bits(g1.dbias, g2.dbias));
}

}  // namespace
}  // namespace loom
