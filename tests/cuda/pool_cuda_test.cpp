// tests/cuda/pool_cuda_test.cpp — max, average and adaptive average pooling on CUDA
// (tensor/cuda/pool.h) against the CPU kernels (tensor/conv.h): the same values and indices,
// and in float32/float64 the same bits (Note [Deterministic pooling backward]); strided inputs,
// NaN, odd and large sizes, float16/bfloat16, determinism and errors. Every test skips without
// a GPU.

#include <cmath>
#include <vector>

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

}  // namespace
}  // namespace loom::test
