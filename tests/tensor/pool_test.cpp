// tests/tensor/pool_test.cpp — max, average and adaptive average pooling: values and indices from
// PyTorch 1.13 on a fixed input, direct loops on random ones, PyTorch's output-size rules,
// gradcheck of each backward, the argument errors, and channels-last inputs (the same bits as
// contiguous ones, results in the input's format).

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "autograd/function.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/view.h"
#include "test_util.h"

namespace loom {
namespace {

using test::dparam;
using test::tensors_close;
using test::values_are;

// x[i] = (7 i mod 11) - 5 over [1, 2, 5, 6]: integers with ties, as in the PyTorch golden runs.
Tensor pattern() {
  std::vector<double> v(60);
  for (int64_t i = 0; i < 60; ++i) v[i] = static_cast<double>((i * 7) % 11 - 5);
  return tensor(v, {1, 2, 5, 6});
}

std::vector<double> as_doubles(const std::vector<int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

TEST(MaxPool2d, MatchesPyTorchDilatedCeil) {
  // F.max_pool2d(x, (3,2), (2,2), (1,1), (1,2), ceil_mode=True, return_indices=True)
  const auto [out, idx] =
      kernels::max_pool2d(pattern(), {{3, 2}, {2, 2}, {1, 1}, {1, 2}, true, true});
  EXPECT_EQ(out.sizes(), (Shape{1, 2, 3, 4}));
  EXPECT_TRUE(
      values_are(out, {2, 5, 5, -3, 0, 3, 4, 4, 5, 5, 2, 2, 3, 4, 4, -2, 1, 4, 5, 5, -3, 0, 3, 3}));
  EXPECT_TRUE(values_are(idx, as_doubles({1, 3, 3, 5, 7, 9, 17, 17, 25, 25, 23, 23,
                                          1, 9, 9, 5, 7, 9, 17, 17, 19, 21, 23, 23})));
  EXPECT_TRUE(tensors_close(max_pool2d(pattern(), {3, 2}, {2, 2}, {1, 1}, {1, 2}, true), out));
}

TEST(MaxPool2d, MatchesPyTorchDefaultStride) {
  // F.max_pool2d(x, 2, None, 1, 1, ceil_mode=True): stride defaults to the kernel
  const auto [out, idx] = kernels::max_pool2d(pattern(), {{2, 2}, {0, 0}, {1, 1}, {1, 1}, true});
  EXPECT_TRUE(values_are(
      out, {-5, 2, 5, -3, 4, 5, 3, 4, 0, 5, 4, 2, -4, 3, 2, -2, 5, 1, 4, 5, 1, 4, 5, 3}));
  EXPECT_TRUE(values_are(idx, as_doubles({0, 1, 3, 5, 6, 14, 9, 17, 18, 25, 28, 23,
                                          0, 1, 4, 5, 6, 7,  9, 17, 18, 20, 28, 23})));
}

TEST(AvgPool2d, MatchesPyTorch) {
  const Tensor x = pattern();
  // F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True / False)
  EXPECT_TRUE(values_are(
      avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, true),
      {0.111111,  0.444444,  0.0,       -1.333333, 0.0,       0.111111,  -0.555556, 0.166667,
       -0.111111, 0.111111,  -0.333333, 0.333333,  0.555556,  -0.111111, -0.555556, -1.0,
       0.666667,  -0.111111, 0.444444,  0.666667,  -0.888889, -0.444444, 0.333333,  0.666667},
      1e-5));
  EXPECT_TRUE(
      values_are(avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, false),
                 {0.25,  0.666667,  0.0,      -4.0,     0.0,  0.111111,  -0.555556, 0.333333,
                  -0.25, 0.166667,  -0.5,     1.0,      1.25, -0.166667, -0.833333, -3.0,
                  1.0,   -0.111111, 0.444444, 1.333333, -2.0, -0.666667, 0.5,       2.0},
                 1e-5));
  // F.avg_pool2d(x, (2,3), (1,2), (1,0))
  const Tensor floor_out = avg_pool2d(x, {2, 3}, {1, 2}, {1, 0});
  EXPECT_EQ(floor_out.sizes(), (Shape{1, 2, 6, 2}));
  EXPECT_TRUE(values_are(
      floor_out,
      {-0.833333, 0.666667,  -0.833333, 0.333333,  0.833333,  0.166667,  0.666667,  0.0,
       0.5,       -0.166667, 0.666667,  0.333333,  -0.333333, -0.666667, 0.166667,  -0.5,
       0.0,       -0.666667, -0.166667, -0.833333, -0.333333, 0.833333,  -0.666667, 0.833333},
      1e-5));
}

TEST(AdaptiveAvgPool2d, MatchesPyTorch) {
  // F.adaptive_avg_pool2d(x, (3, 4)): overlapping windows [floor(i 5/3), ceil((i+1) 5/3))
  EXPECT_TRUE(values_are(
      adaptive_avg_pool2d(pattern(), {3, 4}),
      {0.25, -1.0, 2.0,  -2.0, 0.0, -0.333333, -1.0, -1.333333, -0.25, 1.25, -1.25, 0.25,
       1.25, 0.0,  0.25, -1.0, 1.0, -1.166667, 0.0,  -0.333333, -2.0,  -0.5, -0.25, 1.25},
      1e-5));
}

TEST(Pool2d, OutputSizeRules) {
  using kernels::pool_output_size;
  EXPECT_EQ(pool_output_size(5, 2, 2, 0, 1, false), 2);
  EXPECT_EQ(pool_output_size(5, 2, 2, 0, 1, true), 3);
  // ceil would give 4, but the last window would start in the right padding: 3
  EXPECT_EQ(pool_output_size(5, 2, 2, 1, 1, true), 3);
  EXPECT_EQ(pool_output_size(6, 3, 2, 1, 1, true), 4);
  EXPECT_EQ(pool_output_size(32, 3, 2, 1, 1, false), 16);
  EXPECT_EQ(pool_output_size(10, 3, 1, 0, 3, false), 4);  // dilated extent 7
}

// Direct loops: windows over the padded input, -inf padding for max.
Tensor naive_pool(const Tensor& x, Pair k, Pair s, Pair p, Pair d, bool ceil_mode, bool is_max,
                  bool count_include_pad) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t ho = kernels::pool_output_size(h, k[0], s[0], p[0], d[0], ceil_mode);
  const int64_t wo = kernels::pool_output_size(w, k[1], s[1], p[1], d[1], ceil_mode);
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<double> out;
  for (int64_t plane = 0; plane < n * c; ++plane)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t count = 0, padded = 0;
        for (int64_t a = 0; a < k[0]; ++a)
          for (int64_t b = 0; b < k[1]; ++b) {
            const int64_t ih = i * s[0] - p[0] + a * d[0], iw = j * s[1] - p[1] + b * d[1];
            if (ih < h + p[0] && iw < w + p[1]) ++padded;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            const double v = xv[(plane * h + ih) * w + iw];
            best = std::max(best, v);
            sum += v;
            ++count;
          }
        out.push_back(is_max ? best : sum / (count_include_pad ? padded : count));
      }
  return tensor(out, {n, c, ho, wo});
}

TEST(MaxPool2d, MatchesNaive) {
  const Tensor x = randn({2, 3, 9, 8}, kFloat64);
  struct Case {
    Pair k, s, p, d;
    bool ceil;
  };
  for (const Case& cs :
       {Case{{2, 2}, {2, 2}, {0, 0}, {1, 1}, false}, Case{{3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
        Case{{3, 2}, {1, 2}, {1, 1}, {2, 2}, false}, Case{{3, 3}, {3, 2}, {1, 0}, {2, 1}, true}}) {
    const Tensor ref = naive_pool(x, cs.k, cs.s, cs.p, cs.d, cs.ceil, true, true);
    EXPECT_TRUE(tensors_close(max_pool2d(x, cs.k, cs.s, cs.p, cs.d, cs.ceil), ref));
    EXPECT_TRUE(tensors_close(max_pool2d(x.to(kFloat32), cs.k, cs.s, cs.p, cs.d, cs.ceil), ref,
                              1e-6, 1e-6));
  }
}

TEST(AvgPool2d, MatchesNaive) {
  const Tensor x = randn({2, 3, 9, 8}, kFloat64);
  struct Case {
    Pair k, s, p;
    bool ceil, include_pad;
  };
  for (const Case& cs :
       {Case{{2, 2}, {2, 2}, {0, 0}, false, true}, Case{{3, 3}, {2, 2}, {1, 1}, true, true},
        Case{{3, 3}, {2, 2}, {1, 1}, true, false}, Case{{3, 2}, {2, 3}, {1, 1}, false, false},
        Case{{4, 4}, {3, 3}, {2, 2}, true, true}}) {
    const Tensor ref = naive_pool(x, cs.k, cs.s, cs.p, {1, 1}, cs.ceil, false, cs.include_pad);
    EXPECT_TRUE(tensors_close(avg_pool2d(x, cs.k, cs.s, cs.p, cs.ceil, cs.include_pad), ref));
    EXPECT_TRUE(tensors_close(avg_pool2d(x.to(kFloat32), cs.k, cs.s, cs.p, cs.ceil, cs.include_pad),
                              ref, 1e-5, 1e-5));
  }
}

TEST(AdaptiveAvgPool2d, GlobalAndIdentity) {
  const Tensor x = randn({2, 3, 5, 7}, kFloat64);
  EXPECT_TRUE(tensors_close(adaptive_avg_pool2d(x, {1, 1}), x.mean({2, 3}, true), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(adaptive_avg_pool2d(x, {5, 7}), x, 1e-12, 1e-12));
  // Output larger than the input: windows of one element, repeated.
  EXPECT_EQ(adaptive_avg_pool2d(x, {10, 14}).sizes(), (Shape{2, 3, 10, 14}));
}

TEST(MaxPool2d, NaNPropagates) {
  const Tensor x = tensor<float>({1, std::nanf(""), 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(x, {2, 2}).item()));
}

TEST(MaxPool2d, Gradcheck) {
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, {1, 2}, true);
      },
      {dparam({2, 2, 5, 6})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], {2, 2});
      },
      {dparam({1, 2, 4, 4})});
}

TEST(AvgPool2d, Gradcheck) {
  for (bool include_pad : {true, false})
    EXPECT_GRADCHECK(
        [include_pad](const std::vector<Tensor>& in) {
          return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true, include_pad);
        },
        {dparam({2, 2, 5, 6})});
}

TEST(AdaptiveAvgPool2d, Gradcheck) {
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return adaptive_avg_pool2d(in[0], {3, 4});
      },
      {dparam({2, 2, 5, 6})});
}

TEST(Pool2d, Errors) {
  const Tensor x = randn({2, 3, 5, 5});
  EXPECT_LOOM_ERROR(max_pool2d(randn({3, 5, 5}), {2, 2}), ShapeError,
                    {"max_pool2d", "4-D", "[3, 5, 5]"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {0, 2}), ValueError, {"max_pool2d", "kernel", "[2, 3, 5, 5]"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {2, 2}, {-1, 1}), ValueError, {"max_pool2d", "stride"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {2, 2}, {1, 1}, {2, 0}), ValueError,
                    {"max_pool2d", "padding", "half"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {2, 2}, {1, 1}, {-1, 0}), ValueError, {"max_pool2d", "padding"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {2, 2}, {1, 1}, {0, 0}, {0, 1}), ValueError,
                    {"max_pool2d", "dilation"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {6, 6}), ShapeError, {"max_pool2d", "too small", "[2, 3, 5, 5]"});
  EXPECT_LOOM_ERROR(max_pool2d(x, {3, 3}, {1, 1}, {0, 0}, {3, 3}), ShapeError,
                    {"max_pool2d", "too small"});
  EXPECT_LOOM_ERROR(max_pool2d(x.to(kInt64), {2, 2}), DTypeError, {"max_pool2d"});
  EXPECT_LOOM_ERROR(avg_pool2d(randn({5, 5}), {2, 2}), ShapeError, {"avg_pool2d", "[5, 5]"});
  EXPECT_LOOM_ERROR(avg_pool2d(x, {3, 3}, {1, 1}, {2, 2}), ValueError, {"avg_pool2d", "padding"});
  EXPECT_LOOM_ERROR(avg_pool2d(x, {2, 2}, {0, 1}), ValueError, {"avg_pool2d", "stride"});
  EXPECT_LOOM_ERROR(avg_pool2d(x, {7, 2}), ShapeError, {"avg_pool2d", "too small"});
  EXPECT_LOOM_ERROR(avg_pool2d(x.to(kInt32), {2, 2}), DTypeError, {"avg_pool2d"});
  EXPECT_LOOM_ERROR(adaptive_avg_pool2d(randn({3, 5, 5}), {2, 2}), ShapeError,
                    {"adaptive_avg_pool2d", "[3, 5, 5]"});
  EXPECT_LOOM_ERROR(adaptive_avg_pool2d(x, {0, 2}), ValueError,
                    {"adaptive_avg_pool2d", "output_size", "[2, 3, 5, 5]"});
  EXPECT_LOOM_ERROR(adaptive_avg_pool2d(randn({2, 3, 0, 5}), {2, 2}), ShapeError,
                    {"adaptive_avg_pool2d", "[2, 3, 0, 5]"});
  EXPECT_LOOM_ERROR(adaptive_avg_pool2d(x.to(kInt64), {2, 2}), DTypeError, {"adaptive_avg_pool2d"});
  // A gradient with N and C swapped has the right count of planes but not the right shape
  // (the CPU once accepted it and read past its end).
  EXPECT_LOOM_ERROR(
      kernels::avg_pool2d_backward(randn({6, 1, 2, 2}), {1, 6, 4, 4}, {{2, 2}, {0, 0}, {0, 0}}),
      ShapeError, {"avg_pool2d_backward", "[6, 1, 2, 2]", "[1, 6, 4, 4]"});
}

// ---------------------------------------------------------------- channels-last

constexpr MemoryFormat kChannelsLast = MemoryFormat::kChannelsLast;

// Bit for bit (NaN equals NaN), shape included.
::testing::AssertionResult same_values(const Tensor& actual, const Tensor& expected) {
  return tensors_close(actual, expected, 0.0, 0.0);
}

// Dense in channels-last order and read as channels-last (the shapes below have C > 1 and
// H, W > 1, so no tensor is dense in both orders).
::testing::AssertionResult is_channels_last(const Tensor& t) {
  if (t.is_contiguous(kChannelsLast) && suggest_memory_format(t) == kChannelsLast)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "sizes " << detail::str(t.sizes()) << " strides "
                                       << detail::str(t.strides()) << " are not channels-last";
}

::testing::AssertionResult is_row_major(const Tensor& t) {
  if (t.is_contiguous() && suggest_memory_format(t) == MemoryFormat::kContiguous)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "sizes " << detail::str(t.sizes()) << " strides "
                                       << detail::str(t.strides()) << " are not contiguous";
}

// Integers with many ties and one NaN: max pooling's tie and NaN rules in both formats.
Tensor ties_and_nan(const Shape& shape, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 11) - 5;
  v[v.size() / 3] = std::nan("");
  return tensor(v, shape).to(dtype);
}

// [2, 5, 9, 8], and 70 channels: more than one block of channels in the CPU backward.
const std::vector<Shape> kChannelsLastShapes = {{2, 5, 9, 8}, {1, 70, 6, 5}};

TEST(Pool2dChannelsLast, MaxPoolKernels) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      for (const Tensor& x : {randn(shape, dtype), ties_and_nan(shape, dtype)}) {
        const Tensor x_cl = kernels::contiguous(x, kChannelsLast);
        ASSERT_TRUE(is_channels_last(x_cl));
        for (const kernels::Pool2dOptions& o :
             {kernels::Pool2dOptions{{3, 3}, {2, 2}, {1, 1}},
              kernels::Pool2dOptions{{3, 2}, {1, 2}, {1, 1}, {2, 1}, /*ceil_mode=*/true}}) {
          const auto [out, indices] = kernels::max_pool2d(x, o);
          const auto [out_cl, indices_cl] = kernels::max_pool2d(x_cl, o);
          EXPECT_TRUE(is_row_major(out));
          EXPECT_TRUE(is_row_major(indices));
          EXPECT_TRUE(is_channels_last(out_cl));
          EXPECT_TRUE(is_channels_last(indices_cl));
          EXPECT_TRUE(same_values(out_cl, out)) << detail::str(shape) << " " << dtype;
          EXPECT_TRUE(same_values(indices_cl, indices)) << detail::str(shape) << " " << dtype;
          const Tensor dout = randn(out.sizes(), dtype);
          const Tensor dx = kernels::max_pool2d_backward(dout, indices, shape);
          EXPECT_TRUE(is_row_major(dx));
          // A channels-last gradient, and a contiguous one, into a channels-last dx.
          for (const Tensor& d : {kernels::contiguous(dout, kChannelsLast), dout}) {
            const Tensor dx_cl = kernels::max_pool2d_backward(d, indices_cl, shape, kChannelsLast);
            EXPECT_TRUE(is_channels_last(dx_cl));
            EXPECT_TRUE(same_values(dx_cl, dx)) << detail::str(shape) << " " << dtype;
          }
        }
      }
    }
  }
}

TEST(Pool2dChannelsLast, AvgPoolKernels) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      const Tensor x = randn(shape, dtype);
      const Tensor x_cl = kernels::contiguous(x, kChannelsLast);
      for (const kernels::Pool2dOptions& o : {kernels::Pool2dOptions{{3, 3},
                                                                     {2, 2},
                                                                     {1, 1},
                                                                     {1, 1},
                                                                     true, /*count_include_pad=*/
                                                                     false},
                                              kernels::Pool2dOptions{{3, 3}, {1, 1}, {1, 1}},
                                              kernels::Pool2dOptions{{2, 3}, {1, 2}, {1, 0}}}) {
        const Tensor out = kernels::avg_pool2d(x, o);
        const Tensor out_cl = kernels::avg_pool2d(x_cl, o);
        EXPECT_TRUE(is_row_major(out));
        EXPECT_TRUE(is_channels_last(out_cl));
        EXPECT_TRUE(same_values(out_cl, out)) << detail::str(shape) << " " << dtype;
        const Tensor dout = randn(out.sizes(), dtype);
        const Tensor dx = kernels::avg_pool2d_backward(dout, shape, o);
        EXPECT_TRUE(is_row_major(dx));
        for (const Tensor& d : {kernels::contiguous(dout, kChannelsLast), dout}) {
          const Tensor dx_cl = kernels::avg_pool2d_backward(d, shape, o, kChannelsLast);
          EXPECT_TRUE(is_channels_last(dx_cl));
          EXPECT_TRUE(same_values(dx_cl, dx)) << detail::str(shape) << " " << dtype;
        }
        // And back: a channels-last gradient into a contiguous dx.
        EXPECT_TRUE(same_values(
            kernels::avg_pool2d_backward(kernels::contiguous(dout, kChannelsLast), shape, o), dx));
      }
    }
  }
}

TEST(Pool2dChannelsLast, AdaptiveAvgPoolKernels) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      const Tensor x = randn(shape, dtype);
      const Tensor x_cl = kernels::contiguous(x, kChannelsLast);
      // Overlapping windows, and more cells than inputs.
      for (const Pair size : {Pair{4, 3}, Pair{11, 7}}) {
        const Tensor out = kernels::adaptive_avg_pool2d(x, size);
        const Tensor out_cl = kernels::adaptive_avg_pool2d(x_cl, size);
        EXPECT_TRUE(is_row_major(out));
        EXPECT_TRUE(is_channels_last(out_cl));
        EXPECT_TRUE(same_values(out_cl, out)) << detail::str(shape) << " " << dtype;
        const Tensor dout = randn(out.sizes(), dtype);
        const Tensor dx = kernels::adaptive_avg_pool2d_backward(dout, shape);
        EXPECT_TRUE(is_row_major(dx));
        for (const Tensor& d : {kernels::contiguous(dout, kChannelsLast), dout}) {
          const Tensor dx_cl = kernels::adaptive_avg_pool2d_backward(d, shape, kChannelsLast);
          EXPECT_TRUE(is_channels_last(dx_cl));
          EXPECT_TRUE(same_values(dx_cl, dx)) << detail::str(shape) << " " << dtype;
        }
      }
    }
  }
}

// An identity whose backward keeps the gradient that reaches it in *seen: the dx a pool's
// backward hands on, before the leaf's .grad accumulation can re-lay it out.
Tensor probe(const Tensor& x, Tensor* seen) {
  return autograd::record_view(
      "probe", kernels::alias(x), x,
      [seen](const autograd::Grads& dout, autograd::Saved&, autograd::Grads& g) {
        *seen = dout[0];
        g[0] = dout[0];
      });
}

// Through autograd: channels-last in, channels-last out and dx, the contiguous path's bits.
TEST(Pool2dChannelsLast, Autograd) {
  using Pool = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<const char*, Pool>> pools = {
      {"max_pool2d",
       [](const Tensor& x) {
         return max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
       }},
      {"avg_pool2d",
       [](const Tensor& x) {
         return avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, false);
       }},
      {"adaptive_avg_pool2d",
       [](const Tensor& x) {
         return adaptive_avg_pool2d(x, {4, 3});
       }},
  };
  const Shape shape{2, 5, 9, 8};
  for (const auto& [name, pool] : pools) {
    const Tensor base = randn(shape);
    Tensor x = kernels::clone(base);
    x.requires_grad_();
    Tensor x_cl = kernels::contiguous(base, kChannelsLast);
    x_cl.requires_grad_();
    Tensor dx, dx_cl;
    const Tensor out = pool(probe(x, &dx));
    const Tensor out_cl = pool(probe(x_cl, &dx_cl));
    EXPECT_TRUE(is_row_major(out)) << name;
    EXPECT_TRUE(is_channels_last(out_cl)) << name;
    EXPECT_TRUE(same_values(out_cl, out)) << name;
    const Tensor dout = randn(out.sizes());
    out.backward(dout);
    out_cl.backward(kernels::contiguous(dout, kChannelsLast));
    ASSERT_TRUE(dx.defined() && dx_cl.defined()) << name;
    EXPECT_TRUE(is_row_major(dx)) << name;
    EXPECT_TRUE(is_channels_last(dx_cl)) << name;
    EXPECT_TRUE(same_values(dx_cl, dx)) << name;
    EXPECT_TRUE(same_values(x_cl.grad(), x.grad())) << name;
  }
}

}  // namespace
}  // namespace loom
