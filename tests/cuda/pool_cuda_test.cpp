// tests/cuda/pool_cuda_test.cpp — max, average and adaptive average pooling on CUDA
// (tensor/cuda/pool.h) against the CPU kernels (tensor/conv.h): the same values and indices,
// and in float32/float64 the same bits (Note [Deterministic pooling backward]); strided inputs,
// NaN, odd and large sizes, float16/bfloat16, determinism, channels-last inputs (results in the
// input's format) and errors. Every test skips without a GPU.

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/function.h"
#include "cuda/cuda_test_util.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/cuda/pool.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

namespace k = kernels;
using k::Pool2dOptions;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

// Exactly equal (NaN equals NaN), shape and dtype included.
::testing::AssertionResult same_as_cpu(const Tensor& on_cuda, const Tensor& on_cpu) {
  return cuda_matches_cpu(on_cuda, on_cpu, 0.0, 0.0);
}

Pool2dOptions pool(k::Pair kernel, k::Pair stride = {0, 0}, k::Pair padding = {0, 0},
                   k::Pair dilation = {1, 1}, bool ceil_mode = false,
                   bool count_include_pad = true) {
  return {kernel, stride, padding, dilation, ceil_mode, count_include_pad};
}

struct PoolCase {
  Shape x;
  Pool2dOptions options;
};

const std::vector<PoolCase>& max_cases() {
  static const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, pool({2, 2})},
      {{2, 4, 16, 16}, pool({3, 3}, {2, 2}, {1, 1})},         // the ResNet stem
      {{1, 2, 9, 11}, pool({3, 3}, {1, 1}, {1, 1})},          // overlapping
      {{1, 3, 10, 9}, pool({3, 3}, {1, 1}, {1, 1}, {2, 2})},  // dilation
      {{2, 2, 7, 9}, pool({3, 3}, {2, 2}, {0, 0}, {1, 1}, /*ceil_mode=*/true)},
      {{1, 1, 6, 7}, pool({2, 3}, {1, 2}, {1, 1})},  // asymmetric
      {{3, 1, 1, 1}, pool({1, 1})},
  };
  return cases;
}

TEST(CudaPool, MaxPoolMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const PoolCase& c : max_cases()) {
      const Tensor x = randn(c.x, dtype);
      const auto [out, indices] = k::max_pool2d(x, c.options);
      const auto [gout, gindices] = cuda::max_pool2d(gpu(x), c.options);
      EXPECT_TRUE(same_as_cpu(gout, out)) << detail::str(c.x) << " " << dtype;
      EXPECT_TRUE(same_as_cpu(gindices, indices)) << detail::str(c.x);
      const Tensor dout = randn(out.sizes(), dtype);
      EXPECT_TRUE(same_as_cpu(cuda::max_pool2d_backward(gpu(dout), gindices, c.x),
                              k::max_pool2d_backward(dout, indices, c.x)))
          << detail::str(c.x) << " " << dtype;
    }
  }
}

// Ties (every value equal: the first maximum wins) and NaN (the last NaN wins) as the CPU.
TEST(CudaPool, MaxPoolTiesAndNaN) {
  LOOM_SKIP_WITHOUT_GPU();
  const Pool2dOptions o = pool({3, 3}, {1, 1}, {1, 1});
  const Tensor flat = ones({1, 1, 5, 5});
  EXPECT_TRUE(same_as_cpu(cuda::max_pool2d(gpu(flat), o).second, k::max_pool2d(flat, o).second));
  std::vector<float> values(25);
  for (int i = 0; i < 25; ++i) values[i] = static_cast<float>(i % 7);
  values[6] = std::nanf("");
  values[18] = std::nanf("");
  const Tensor x = tensor<float>(values, {1, 1, 5, 5});
  const auto [out, indices] = k::max_pool2d(x, o);
  const auto [gout, gindices] = cuda::max_pool2d(gpu(x), o);
  EXPECT_TRUE(same_as_cpu(gout, out));
  EXPECT_TRUE(same_as_cpu(gindices, indices));
}

TEST(CudaPool, StridedInputsAndGradients) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor big = randn({2, 6, 12, 10}, kFloat64);
  // Every other channel, a window of columns, then channels-last strides.
  const Tensor x = k::narrow(k::slice(big, 1, 0, 6, 2), 3, 1, 8);
  const Tensor gx = k::narrow(k::slice(gpu(big), 1, 0, 6, 2), 3, 1, 8);
  const Tensor nhwc = randn({2, 9, 7, 5}, kFloat64);  // [N, H, W, C]
  const Tensor x_cl = k::permute(nhwc, {0, 3, 1, 2});
  const Tensor gx_cl = k::permute(gpu(nhwc), {0, 3, 1, 2});
  const Pool2dOptions o = pool({3, 3}, {2, 2}, {1, 1});
  for (const auto& [cpu_x, cuda_x] : {std::pair{x, gx}, std::pair{x_cl, gx_cl}}) {
    const auto [out, indices] = k::max_pool2d(cpu_x, o);
    const auto [gout, gindices] = cuda::max_pool2d(cuda_x, o);
    EXPECT_TRUE(same_as_cpu(gout, out));
    EXPECT_TRUE(same_as_cpu(gindices, indices));
    EXPECT_TRUE(same_as_cpu(cuda::avg_pool2d(cuda_x, o), k::avg_pool2d(cpu_x, o)));
    EXPECT_TRUE(same_as_cpu(cuda::adaptive_avg_pool2d(cuda_x, {3, 2}),
                            k::adaptive_avg_pool2d(cpu_x, {3, 2})));
    // dout and indices as transposed views.
    const Tensor dout = randn(out.sizes(), kFloat64);
    const Tensor gdout = k::transpose(gpu(k::contiguous(k::transpose(dout, 2, 3))), 2, 3);
    const Tensor gidx = k::transpose(gpu(k::contiguous(k::transpose(indices, 2, 3))), 2, 3);
    EXPECT_TRUE(same_as_cpu(cuda::max_pool2d_backward(gdout, gidx, cpu_x.sizes()),
                            k::max_pool2d_backward(dout, indices, cpu_x.sizes())));
    EXPECT_TRUE(same_as_cpu(cuda::avg_pool2d_backward(gdout, cpu_x.sizes(), o),
                            k::avg_pool2d_backward(dout, cpu_x.sizes(), o)));
  }
}

TEST(CudaPool, AvgPoolMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, pool({2, 2})},
      {{1, 2, 9, 11}, pool({3, 3}, {1, 1}, {1, 1})},
      {{1, 2, 9, 11}, pool({3, 3}, {1, 1}, {1, 1}, {1, 1}, false, /*count_include_pad=*/false)},
      {{2, 2, 7, 9}, pool({3, 3}, {2, 2}, {1, 1}, {1, 1}, /*ceil_mode=*/true)},
      {{2, 2, 7, 9}, pool({3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false)},
      {{1, 1, 6, 7}, pool({2, 3}, {1, 2}, {1, 1})},
      {{2, 5, 4, 4}, pool({4, 4})},  // global
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const PoolCase& c : cases) {
      const Tensor x = randn(c.x, dtype);
      const Tensor out = k::avg_pool2d(x, c.options);
      EXPECT_TRUE(same_as_cpu(cuda::avg_pool2d(gpu(x), c.options), out))
          << detail::str(c.x) << " " << dtype;
      const Tensor dout = randn(out.sizes(), dtype);
      EXPECT_TRUE(same_as_cpu(cuda::avg_pool2d_backward(gpu(dout), c.x, c.options),
                              k::avg_pool2d_backward(dout, c.x, c.options)))
          << detail::str(c.x) << " " << dtype;
    }
  }
}

TEST(CudaPool, AdaptiveAvgPoolMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, k::Pair>> cases = {
      {{2, 8, 4, 4}, {1, 1}},   // the ResNet head
      {{1, 3, 7, 11}, {3, 5}},  // windows that overlap
      {{2, 2, 4, 4}, {4, 4}},   // identity
      {{1, 2, 3, 2}, {5, 3}},   // more cells than inputs
      {{1, 1, 1, 1}, {2, 2}},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const auto& [shape, size] : cases) {
      const Tensor x = randn(shape, dtype);
      const Tensor out = k::adaptive_avg_pool2d(x, size);
      EXPECT_TRUE(same_as_cpu(cuda::adaptive_avg_pool2d(gpu(x), size), out))
          << detail::str(shape) << " " << dtype;
      const Tensor dout = randn(out.sizes(), dtype);
      EXPECT_TRUE(same_as_cpu(cuda::adaptive_avg_pool2d_backward(gpu(dout), shape),
                              k::adaptive_avg_pool2d_backward(dout, shape)))
          << detail::str(shape) << " " << dtype;
    }
  }
}

// A tall plane of 1000003 rows: grid-stride loops and a large sort in the max backward.
TEST(CudaPool, LargeOddPlane) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor x = randn({1, 1, 1000003, 1});
  const Pool2dOptions o = pool({3, 1}, {2, 1}, {1, 0});
  const auto [out, indices] = k::max_pool2d(x, o);
  const auto [gout, gindices] = cuda::max_pool2d(gpu(x), o);
  EXPECT_TRUE(same_as_cpu(gout, out));
  EXPECT_TRUE(same_as_cpu(gindices, indices));
  const Tensor dout = randn(out.sizes());
  EXPECT_TRUE(same_as_cpu(cuda::max_pool2d_backward(gpu(dout), gindices, x.sizes()),
                          k::max_pool2d_backward(dout, indices, x.sizes())));
  EXPECT_TRUE(same_as_cpu(cuda::avg_pool2d_backward(gpu(dout), x.sizes(), o),
                          k::avg_pool2d_backward(dout, x.sizes(), o)));
}

TEST(CudaPool, SameBitsTwice) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor x = gpu(randn({8, 16, 32, 32}));
  const Pool2dOptions o = pool({3, 3}, {1, 1}, {1, 1});
  const auto [out, indices] = cuda::max_pool2d(x, o);
  const Tensor dout = gpu(randn(out.sizes()));
  const Tensor first = cuda::max_pool2d_backward(dout, indices, x.sizes());
  const Tensor second = cuda::max_pool2d_backward(dout, indices, x.sizes());
  EXPECT_EQ(first.to(kCPU).to_vector<double>(), second.to(kCPU).to_vector<double>());
}

// float16 and bfloat16 compute in float32: the maximum is exact; averages round once.
TEST(CudaPool, HalfTypes) {
  LOOM_SKIP_WITHOUT_GPU();
  const Pool2dOptions o = pool({3, 3}, {2, 2}, {1, 1});
  for (DType dtype : {kFloat16, kBFloat16}) {
    const double tol = dtype == kFloat16 ? 1e-3 : 8e-3;
    const Tensor x = randn({2, 3, 9, 9}).to(dtype);
    const Tensor xf = x.to(kFloat32);
    const auto [out, indices] = k::max_pool2d(xf, o);
    const auto [gout, gindices] = cuda::max_pool2d(gpu(x), o);
    EXPECT_EQ(gout.dtype(), dtype);
    EXPECT_TRUE(tensors_close(gout.to(kCPU).to(kFloat32), out, 0.0, 0.0)) << dtype;
    EXPECT_TRUE(same_as_cpu(gindices, indices));
    const Tensor dout = randn(out.sizes()).to(dtype);
    EXPECT_TRUE(tensors_close(
        cuda::max_pool2d_backward(gpu(dout), gindices, x.sizes()).to(kCPU).to(kFloat32),
        k::max_pool2d_backward(dout.to(kFloat32), indices, x.sizes()), tol, tol));
    EXPECT_TRUE(tensors_close(cuda::avg_pool2d(gpu(x), o).to(kCPU).to(kFloat32),
                              k::avg_pool2d(xf, o), tol, tol));
    EXPECT_TRUE(tensors_close(cuda::adaptive_avg_pool2d(gpu(x), {1, 1}).to(kCPU).to(kFloat32),
                              k::adaptive_avg_pool2d(xf, {1, 1}), tol, tol));
  }
}

TEST(CudaPool, Errors) {
  LOOM_SKIP_WITHOUT_GPU();
  // Through the kernels:: entry points, which check before they switch to CUDA.
  const Tensor x = gpu(randn({1, 1, 4, 4}));
  EXPECT_LOOM_ERROR(k::max_pool2d(gpu(randn({4, 4})), pool({2, 2})), ShapeError,
                    {"max_pool2d", "[4, 4]"});
  EXPECT_LOOM_ERROR(k::max_pool2d(gpu(randint(0, 3, {1, 1, 4, 4})), pool({2, 2})), DTypeError,
                    {"max_pool2d", "int64"});
  EXPECT_LOOM_ERROR(k::avg_pool2d(x, pool({2, 2}, {0, 0}, {2, 2})), ValueError, {"avg_pool2d"});
  EXPECT_LOOM_ERROR(k::avg_pool2d_backward(gpu(randn({1, 1, 3, 3})), {1, 1, 4, 4}, pool({2, 2})),
                    ShapeError, {"avg_pool2d_backward", "[1, 1, 3, 3]"});
  EXPECT_LOOM_ERROR(k::avg_pool2d_backward(gpu(randn({1, 4, 2, 2})), {4, 1, 4, 4}, pool({2, 2})),
                    ShapeError, {"avg_pool2d_backward", "[1, 4, 2, 2]", "[4, 1, 4, 4]"});
  const auto [out, indices] = cuda::max_pool2d(x, pool({2, 2}));
  EXPECT_LOOM_ERROR(k::max_pool2d_backward(out, out, {1, 1, 4, 4}), DTypeError,
                    {"max_pool2d_backward", "int64"});
  EXPECT_LOOM_ERROR(k::adaptive_avg_pool2d(x, {0, 1}), ValueError, {"adaptive_avg_pool2d"});
}

// ---------------------------------------------------------------- channels-last

constexpr MemoryFormat kChannelsLast = MemoryFormat::kChannelsLast;

// Dense in channels-last order and read as such (the shapes below have C > 1 and H, W > 1).
::testing::AssertionResult is_channels_last(const Tensor& t) {
  if (t.is_contiguous(kChannelsLast) && suggest_memory_format(t) == kChannelsLast)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "sizes " << detail::str(t.sizes()) << " strides "
                                       << detail::str(t.strides()) << " are not channels-last";
}

// t on cuda:0 stored channels-last (a copy to another device is contiguous, so go through an
// [N, H, W, C] tensor and permute back).
Tensor gpu_channels_last(const Tensor& t) {
  return k::permute(gpu(k::contiguous(k::permute(t, {0, 2, 3, 1}))), {0, 3, 1, 2});
}

// [N, C, H, W] with odd sizes, and 70 channels (a warp's worth and more of neighbouring
// threads on one pixel).
const std::vector<Shape> kChannelsLastShapes = {{2, 5, 9, 8}, {1, 70, 7, 5}};

TEST(CudaPool, ChannelsLastMaxPool) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      const Tensor x = k::contiguous(randn(shape, dtype), kChannelsLast);
      const Tensor gx = gpu_channels_last(x);
      ASSERT_TRUE(is_channels_last(gx));
      for (const Pool2dOptions& o : {pool({3, 3}, {2, 2}, {1, 1}),
                                     pool({3, 2}, {1, 2}, {1, 1}, {2, 1}, /*ceil_mode=*/true)}) {
        const auto [out, indices] = k::max_pool2d(x, o);
        const auto [gout, gindices] = k::max_pool2d(gx, o);  // through the device switch
        EXPECT_TRUE(is_channels_last(gout));
        EXPECT_TRUE(is_channels_last(gindices));
        EXPECT_TRUE(same_as_cpu(gout, out)) << detail::str(shape) << " " << dtype;
        EXPECT_TRUE(same_as_cpu(gindices, indices)) << detail::str(shape);
        const Tensor dout = k::contiguous(randn(out.sizes(), dtype), kChannelsLast);
        const Tensor dx = k::max_pool2d_backward(dout, indices, shape, kChannelsLast);
        // A channels-last gradient, and a contiguous one, into a channels-last dx.
        for (const Tensor& gdout : {gpu_channels_last(dout), gpu(dout)}) {
          const Tensor gdx = k::max_pool2d_backward(gdout, gindices, shape, kChannelsLast);
          EXPECT_TRUE(is_channels_last(gdx));
          EXPECT_TRUE(same_as_cpu(gdx, dx)) << detail::str(shape) << " " << dtype;
        }
        // Channels-last outputs into a contiguous dx, and the same bits twice.
        const Tensor gdx = cuda::max_pool2d_backward(gpu_channels_last(dout), gindices, shape);
        EXPECT_TRUE(gdx.is_contiguous());
        EXPECT_TRUE(same_as_cpu(gdx, dx));
        EXPECT_TRUE(same_as_cpu(gdx, k::max_pool2d_backward(dout, indices, shape)));
        EXPECT_TRUE(same_as_cpu(
            cuda::max_pool2d_backward(gpu_channels_last(dout), gindices, shape, kChannelsLast),
            dx));
      }
    }
  }
}

TEST(CudaPool, ChannelsLastAvgPool) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      const Tensor x = k::contiguous(randn(shape, dtype), kChannelsLast);
      const Tensor gx = gpu_channels_last(x);
      for (const Pool2dOptions& o :
           {pool({3, 3}, {2, 2}, {1, 1}, {1, 1}, true, /*count_include_pad=*/false),
            pool({3, 3}, {1, 1}, {1, 1}), pool({2, 3}, {1, 2}, {1, 0})}) {
        const Tensor out = k::avg_pool2d(x, o);
        const Tensor gout = k::avg_pool2d(gx, o);
        EXPECT_TRUE(is_channels_last(gout));
        EXPECT_TRUE(same_as_cpu(gout, out)) << detail::str(shape) << " " << dtype;
        const Tensor dout = k::contiguous(randn(out.sizes(), dtype), kChannelsLast);
        const Tensor dx = k::avg_pool2d_backward(dout, shape, o, kChannelsLast);
        for (const Tensor& gdout : {gpu_channels_last(dout), gpu(dout)}) {
          const Tensor gdx = k::avg_pool2d_backward(gdout, shape, o, kChannelsLast);
          EXPECT_TRUE(is_channels_last(gdx));
          EXPECT_TRUE(same_as_cpu(gdx, dx)) << detail::str(shape) << " " << dtype;
        }
        const Tensor gdx = cuda::avg_pool2d_backward(gpu_channels_last(dout), shape, o);
        EXPECT_TRUE(gdx.is_contiguous());
        EXPECT_TRUE(same_as_cpu(gdx, dx));
      }
    }
  }
}

TEST(CudaPool, ChannelsLastAdaptiveAvgPool) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : kChannelsLastShapes) {
      const Tensor x = k::contiguous(randn(shape, dtype), kChannelsLast);
      const Tensor gx = gpu_channels_last(x);
      for (const k::Pair size : {k::Pair{4, 3}, k::Pair{11, 7}}) {
        const Tensor out = k::adaptive_avg_pool2d(x, size);
        const Tensor gout = k::adaptive_avg_pool2d(gx, size);
        EXPECT_TRUE(is_channels_last(gout));
        EXPECT_TRUE(same_as_cpu(gout, out)) << detail::str(shape) << " " << dtype;
        const Tensor dout = k::contiguous(randn(out.sizes(), dtype), kChannelsLast);
        const Tensor dx = k::adaptive_avg_pool2d_backward(dout, shape, kChannelsLast);
        for (const Tensor& gdout : {gpu_channels_last(dout), gpu(dout)}) {
          const Tensor gdx = k::adaptive_avg_pool2d_backward(gdout, shape, kChannelsLast);
          EXPECT_TRUE(is_channels_last(gdx));
          EXPECT_TRUE(same_as_cpu(gdx, dx)) << detail::str(shape) << " " << dtype;
        }
        const Tensor gdx = cuda::adaptive_avg_pool2d_backward(gpu_channels_last(dout), shape);
        EXPECT_TRUE(gdx.is_contiguous());
        EXPECT_TRUE(same_as_cpu(gdx, dx));
      }
    }
  }
}

// float16 keeps the format too (the maximum is exact).
TEST(CudaPool, ChannelsLastHalf) {
  LOOM_SKIP_WITHOUT_GPU();
  const Pool2dOptions o = pool({3, 3}, {2, 2}, {1, 1});
  const Tensor x = k::contiguous(randn({2, 6, 9, 9}).to(kFloat16), kChannelsLast);
  const auto [out, indices] = k::max_pool2d(x.to(kFloat32), o);
  const auto [gout, gindices] = cuda::max_pool2d(gpu_channels_last(x), o);
  EXPECT_TRUE(is_channels_last(gout));
  EXPECT_TRUE(tensors_close(gout.to(kCPU).to(kFloat32), out, 0.0, 0.0));
  EXPECT_TRUE(same_as_cpu(gindices, indices));
  EXPECT_TRUE(is_channels_last(cuda::avg_pool2d(gpu_channels_last(x), o)));
}

// An identity whose backward keeps the gradient that reaches it in *seen: the dx a pool's
// backward hands on, before the leaf's .grad accumulation can re-lay it out.
Tensor probe(const Tensor& x, Tensor* seen) {
  return autograd::record_view(
      "probe", k::alias(x), x,
      [seen](const autograd::Grads& dout, autograd::Saved&, autograd::Grads& g) {
        *seen = dout[0];
        g[0] = dout[0];
      });
}

// Through autograd on cuda:0: the format reaches the backward, the bits are the CPU's.
TEST(CudaPool, ChannelsLastAutograd) {
  LOOM_SKIP_WITHOUT_GPU();
  using Pool = std::function<Tensor(const Tensor&)>;
  const std::vector<Pool> pools = {
      [](const Tensor& x) {
        return max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
      },
      [](const Tensor& x) {
        return avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, false);
      },
      [](const Tensor& x) {
        return adaptive_avg_pool2d(x, {4, 3});
      },
  };
  for (size_t i = 0; i < pools.size(); ++i) {
    Tensor x = k::contiguous(randn({2, 5, 9, 8}), kChannelsLast);
    Tensor gx = gpu_channels_last(x);
    x.requires_grad_();
    gx.requires_grad_();
    Tensor dx, gdx;
    const Tensor out = pools[i](probe(x, &dx));
    const Tensor gout = pools[i](probe(gx, &gdx));
    EXPECT_TRUE(is_channels_last(gout)) << "pool " << i;
    EXPECT_TRUE(same_as_cpu(gout, out)) << "pool " << i;
    const Tensor dout = k::contiguous(randn(out.sizes()), kChannelsLast);
    out.backward(dout);
    gout.backward(gpu_channels_last(dout));
    ASSERT_TRUE(dx.defined() && gdx.defined()) << "pool " << i;
    EXPECT_TRUE(is_channels_last(gdx)) << "pool " << i;
    EXPECT_TRUE(same_as_cpu(gdx, dx)) << "pool " << i;
  }
}

}  // namespace
}  // namespace loom::test
