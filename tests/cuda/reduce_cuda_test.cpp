// tests/cuda/reduce_cuda_test.cpp — the CUDA reductions (tensor/cuda/reduce.h) against the CPU
// kernels: every op, contiguous and strided inputs, float32/float64 and the integer types, the
// row, column and split paths (sizes up to 1000003), NaN and tie rules, and bit-for-bit
// repeatability. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/reduce.h"
#include "tensor/elementwise.h"
#include "tensor/reduce.h"

namespace loom {
namespace {

namespace k = loom::kernels;
namespace kc = loom::cuda;
using test::cuda_matches_cpu;
using test::kCuda0;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

// The same view of a CPU tensor and of its copy on cuda:0.
struct Pair {
  Tensor cpu, cuda;
};
Pair pair_of(const Tensor& x) { return {x, gpu(x)}; }

// Bit-for-bit equality of two CUDA results of the same op.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(kCPU), hb = b.to(kCPU);
  if (ha.sizes() != hb.sizes() || ha.dtype() != hb.dtype())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  if (std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

// The shapes and dims the sums below walk: rows, cols, general inner maps, splits, 0-d.
struct Case {
  Shape shape;
  Shape dims;
};
const std::vector<Case> kCases = {
    {{1000003}, {}},       // one output: rows split into chunks
    {{4096, 1000}, {1}},   // many rows
    {{4096, 1000}, {0}},   // cols (a bias gradient), split
    {{1000003, 3}, {0}},   // three cols over a million values
    {{3, 1000003}, {1}},   // three long rows
    {{7, 13, 5}, {0, 2}},  // reduced dims that do not merge (general inner map)
    {{7, 13, 5}, {1}},     // middle dim: outer dims that do not merge
    {{2, 3, 4, 5}, {1, 3}}, {{1}, {}}, {{7}, {0}}, {{}, {}},  // 0-d
    {{5, 0, 3}, {1}},                                         // empty reduction: sum 0, mean NaN
};

TEST(CudaReduce, SumMatchesCpuForEveryLayout) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(1);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Case& c : kCases) {
      const Pair x = pair_of(randn(c.shape, dtype));
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(
            detail::str("shape=", c.shape, " dims=", c.dims, " keepdim=", keepdim, " ", dtype));
        EXPECT_TRUE(cuda_matches_cpu(kc::sum(x.cuda, c.dims, keepdim),
                                     k::sum(x.cpu, c.dims, keepdim), 1e-5, 1e-5));
        EXPECT_TRUE(cuda_matches_cpu(kc::mean(x.cuda, c.dims, keepdim),
                                     k::mean(x.cpu, c.dims, keepdim), 1e-5, 1e-6));
      }
    }
  }
}

TEST(CudaReduce, SumOfStridedViews) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(2);
  const Pair base = pair_of(randn({64, 33, 7}, kFloat32));
  // Transposed, permuted, sliced with a step and expanded views, read in place.
  const std::vector<std::pair<Tensor, Tensor>> views = {
      {base.cpu.transpose(0, 2), base.cuda.transpose(0, 2)},
      {base.cpu.permute({1, 2, 0}), base.cuda.permute({1, 2, 0})},
      {base.cpu.slice(1, 1, 33, 3), base.cuda.slice(1, 1, 33, 3)},
      {base.cpu.select(2, 4), base.cuda.select(2, 4)},
      {base.cpu.narrow(0, 3, 50).unsqueeze(1).expand({50, 4, 33, 7}),
       base.cuda.narrow(0, 3, 50).unsqueeze(1).expand({50, 4, 33, 7})},
  };
  for (const auto& [cpu, cuda] : views) {
    for (const Shape& dims : {Shape{}, Shape{0}, Shape{-1}, Shape{0, 1}, Shape{1}}) {
      if (static_cast<int64_t>(dims.size()) > cpu.dim()) continue;
      SCOPED_TRACE(detail::str("view=", cpu.sizes(), " strides=", cpu.strides(), " dims=", dims));
      EXPECT_TRUE(cuda_matches_cpu(kc::sum(cuda, dims), k::sum(cpu, dims), 1e-5, 1e-5));
      EXPECT_TRUE(cuda_matches_cpu(kc::amax(cuda, dims), k::amax(cpu, dims)));
      EXPECT_TRUE(cuda_matches_cpu(kc::var(cuda, dims), k::var(cpu, dims), 1e-5, 1e-6));
    }
  }
}

TEST(CudaReduce, IntegerAndBoolSumsAreInt64) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  for (DType dtype : {kInt64, kInt32, kUInt8}) {
    const Pair x = pair_of(randint(0, 100, {1000003}, dtype));
    const Tensor s = kc::sum(x.cuda);
    EXPECT_EQ(s.dtype(), kInt64);
    EXPECT_TRUE(cuda_matches_cpu(s, k::sum(x.cpu), 0, 0));
    const Pair m = pair_of(randint(-50, 50, {37, 129}, dtype == kUInt8 ? kInt32 : dtype));
    EXPECT_TRUE(cuda_matches_cpu(kc::sum(m.cuda, {0}), k::sum(m.cpu, {0}), 0, 0));
    EXPECT_TRUE(cuda_matches_cpu(kc::sum(m.cuda, {1}, true), k::sum(m.cpu, {1}, true), 0, 0));
  }
  const Pair flags = pair_of(randint(0, 2, {513, 7}).to(kBool));
  EXPECT_TRUE(cuda_matches_cpu(kc::sum(flags.cuda), k::sum(flags.cpu), 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(kc::sum(flags.cuda, {0}), k::sum(flags.cpu, {0}), 0, 0));
  EXPECT_LOOM_ERROR(k::mean(gpu(tensor<int32_t>({1, 2}))), DTypeError, {"mean", "int32"});
}

TEST(CudaReduce, SumTo) {
  LOOM_SKIP_WITHOUT_GPU();
  const Pair x = pair_of(randn({8, 3, 5}, kFloat64));
  for (const Shape& shape :
       {Shape{3, 5}, Shape{3, 1}, Shape{1, 5}, Shape{8, 1, 5}, Shape{5}, Shape{8, 3, 5}}) {
    SCOPED_TRACE(detail::str("to=", shape));
    EXPECT_TRUE(cuda_matches_cpu(kc::sum_to(x.cuda, shape), k::sum_to(x.cpu, shape), 1e-12, 1e-12));
  }
  EXPECT_LOOM_ERROR(k::sum_to(x.cuda, {4, 5}), ShapeError, {"sum_to", "[8, 3, 5]", "[4, 5]"});
}

TEST(CudaReduce, MaxMinValuesAndIndices) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(4);
  // Small integers as floats: many ties, which the first index must win.
  for (DType dtype : {kFloat32, kFloat64, kInt64, kInt32, kUInt8}) {
    for (const Shape& shape : {Shape{4096, 1000}, Shape{1000003}, Shape{7, 13, 5}}) {
      const Pair x = pair_of(randint(0, 7, shape).to(dtype));
      for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
        SCOPED_TRACE(detail::str("shape=", shape, " dim=", dim, " ", dtype));
        auto [gv, gi] = kc::max_dim(x.cuda, dim);
        auto [cv, ci] = k::max_dim(x.cpu, dim);
        EXPECT_TRUE(cuda_matches_cpu(gv, cv, 0, 0));
        EXPECT_TRUE(cuda_matches_cpu(gi, ci, 0, 0));
        auto [gv2, gi2] = kc::min_dim(x.cuda, dim, true);
        auto [cv2, ci2] = k::min_dim(x.cpu, dim, true);
        EXPECT_TRUE(cuda_matches_cpu(gv2, cv2, 0, 0));
        EXPECT_TRUE(cuda_matches_cpu(gi2, ci2, 0, 0));
        EXPECT_TRUE(cuda_matches_cpu(kc::argmax(x.cuda, dim), k::argmax(x.cpu, dim), 0, 0));
        EXPECT_TRUE(
            cuda_matches_cpu(kc::argmin(x.cuda, dim, true), k::argmin(x.cpu, dim, true), 0, 0));
        EXPECT_TRUE(cuda_matches_cpu(kc::amax(x.cuda, {dim}), k::amax(x.cpu, {dim}), 0, 0));
        EXPECT_TRUE(cuda_matches_cpu(kc::amin(x.cuda, {dim}), k::amin(x.cpu, {dim}), 0, 0));
      }
      EXPECT_TRUE(cuda_matches_cpu(kc::argmax(x.cuda), k::argmax(x.cpu), 0, 0));
      EXPECT_TRUE(cuda_matches_cpu(kc::argmin(x.cuda), k::argmin(x.cpu), 0, 0));
      EXPECT_TRUE(cuda_matches_cpu(kc::amax(x.cuda), k::amax(x.cpu), 0, 0));
    }
  }
  // A strided view: the flat argmax counts in the view's row-major order.
  const Pair y = pair_of(randn({300, 41}, kFloat32));
  EXPECT_TRUE(cuda_matches_cpu(kc::argmax(y.cuda.t()), k::argmax(y.cpu.t()), 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(kc::argmin(y.cuda.t(), 0), k::argmin(y.cpu.t(), 0), 0, 0));
  EXPECT_LOOM_ERROR(k::amax(gpu(empty({3, 0}))), ValueError, {"amax", "[3, 0]"});
  EXPECT_LOOM_ERROR(k::max_dim(gpu(empty({3, 0})), 1), ValueError, {"max", "[3, 0]"});
  EXPECT_LOOM_ERROR(k::max_dim(gpu(empty({3, 4})), 2), IndexError, {"max"});
}

TEST(CudaReduce, NaNPropagatesAndItsFirstIndexWins) {
  LOOM_SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values(5000, 1.0f);
  values[1234] = nan;
  values[4321] = nan;
  values[77] = 5.0f;
  const Pair x = pair_of(tensor<float>(values, {5, 1000}));
  EXPECT_TRUE(cuda_matches_cpu(kc::amax(x.cuda, {1}), k::amax(x.cpu, {1})));
  EXPECT_TRUE(cuda_matches_cpu(kc::amin(x.cuda), k::amin(x.cpu)));
  EXPECT_TRUE(cuda_matches_cpu(kc::argmax(x.cuda), k::argmax(x.cpu), 0, 0));  // 1234
  EXPECT_TRUE(test::values_are(kc::argmax(x.cuda).to(kCPU), {1234}));
  auto [gv, gi] = kc::max_dim(x.cuda, 1);
  auto [cv, ci] = k::max_dim(x.cpu, 1);
  EXPECT_TRUE(cuda_matches_cpu(gv, cv));
  EXPECT_TRUE(cuda_matches_cpu(gi, ci, 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(kc::logsumexp(x.cuda, {1}), k::logsumexp(x.cpu, {1})));
}

TEST(CudaReduce, VarStdLogsumexp) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  for (DType dtype : {kFloat32, kFloat64}) {
    const double rtol = dtype == kFloat32 ? 1e-5 : 1e-10;
    for (const Case& c : kCases) {
      const Pair x = pair_of(k::add_scalar(randn(c.shape, dtype), 3.0));
      for (bool unbiased : {true, false}) {
        SCOPED_TRACE(detail::str("shape=", c.shape, " dims=", c.dims, " unbiased=", unbiased));
        EXPECT_TRUE(cuda_matches_cpu(kc::var(x.cuda, c.dims, unbiased),
                                     k::var(x.cpu, c.dims, unbiased), rtol, 1e-6));
        EXPECT_TRUE(cuda_matches_cpu(kc::std(x.cuda, c.dims, unbiased, true),
                                     k::std(x.cpu, c.dims, unbiased, true), rtol, 1e-6));
      }
      EXPECT_TRUE(
          cuda_matches_cpu(kc::logsumexp(x.cuda, c.dims), k::logsumexp(x.cpu, c.dims), rtol, 1e-6));
    }
  }
  // Rows of -inf, +inf, and a huge value (the max subtraction keeps it finite).
  const double inf = std::numeric_limits<double>::infinity();
  const Pair s = pair_of(tensor<double>({-inf, -inf, -inf, 1, inf, 2, 1000, 1000, 0}, {3, 3}));
  EXPECT_TRUE(cuda_matches_cpu(kc::logsumexp(s.cuda, {1}), k::logsumexp(s.cpu, {1})));
  EXPECT_LOOM_ERROR(kc::var(gpu(tensor<int64_t>({1, 2})), {}), DTypeError, {"var"});
}

TEST(CudaReduce, SameBitsEveryRun) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  const Tensor flat = gpu(randn({1000003}, kFloat32));
  EXPECT_TRUE(same_bits(kc::sum(flat), kc::sum(flat)));
  EXPECT_TRUE(same_bits(kc::var(flat), kc::var(flat)));
  EXPECT_TRUE(same_bits(kc::logsumexp(flat, {0}), kc::logsumexp(flat, {0})));
  const Tensor rows = gpu(randn({4096, 1000}, kFloat32));
  EXPECT_TRUE(same_bits(kc::sum(rows, {1}), kc::sum(rows, {1})));
  EXPECT_TRUE(same_bits(kc::sum(rows, {0}), kc::sum(rows, {0})));
  EXPECT_TRUE(same_bits(kc::mean(rows.t(), {1}), kc::mean(rows.t(), {1})));
  // The same values at another alignment (scalar loads instead of vector loads) add in the same
  // order: same bits.
  const Tensor padded = gpu(randn({1000004}, kFloat32));
  const Tensor shifted = padded.narrow(0, 1, 1000003);
  const Tensor aligned = gpu(shifted.to(kCPU));
  EXPECT_TRUE(same_bits(kc::sum(shifted), kc::sum(aligned)));
}

TEST(CudaReduce, ContiguousAsGathersAndConverts) {
  LOOM_SKIP_WITHOUT_GPU();
  const Pair x = pair_of(randn({33, 17, 5}, kFloat64));
  const Tensor view = x.cuda.permute({2, 0, 1}).slice(1, 1, 33, 2);
  const Tensor expected = x.cpu.permute({2, 0, 1}).slice(1, 1, 33, 2).contiguous().to(kFloat32);
  const Tensor got = kc::contiguous_as(view, kFloat32);
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_TRUE(cuda_matches_cpu(got, expected, 0, 0));
  EXPECT_TRUE(kc::contiguous_as(x.cuda, kFloat64).is_same(x.cuda));  // nothing to do
  const Pair h = pair_of(randn({100}, kFloat32).to(kFloat16));
  EXPECT_TRUE(cuda_matches_cpu(kc::contiguous_as(h.cuda, kFloat32), h.cpu.to(kFloat32), 0, 0));
  const Pair b = pair_of(randn({100}, kFloat32).to(kBFloat16));
  EXPECT_TRUE(cuda_matches_cpu(kc::contiguous_as(b.cuda, kFloat64), b.cpu.to(kFloat64), 0, 0));
}

}  // namespace
}  // namespace loom
