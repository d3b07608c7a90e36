// tests/cuda/linalg_cuda_test.cpp — matrix products through cuBLAS (tensor/cuda/linalg.h)
// against the CPU kernels (tensor/linalg.h): shapes, transposed and strided operands, output
// views, alpha and beta, batches, float16/bfloat16 against float32, TF32, determinism and the
// errors. Every test skips without a GPU.

#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/copy.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/linalg.h"
#include "tensor/linalg.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

namespace k = kernels;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

Tensor cuda_mm(const Tensor& a, const Tensor& b) {
  Tensor out = empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  cuda::mm_out(out, a, b);
  return out;
}

// float32 products differ from the CPU's only by summation order.
double rtol_for(DType dtype) { return dtype == kFloat64 ? 1e-10 : 1e-4; }
double atol_for(DType dtype) { return dtype == kFloat64 ? 1e-10 : 1e-4; }

// Sets the matmul TF32 switch for a scope.
struct Tf32Guard {
  explicit Tf32Guard(bool allow) : previous(cuda::allow_tf32()) { cuda::set_allow_tf32(allow); }
  ~Tf32Guard() { cuda::set_allow_tf32(previous); }
  bool previous;
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.to(kCPU).to_vector<double>() == b.to(kCPU).to_vector<double>();
}

TEST(CudaLinalg, MmMatchesCpuOverShapes) {
  LOOM_SKIP_WITHOUT_GPU();
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1},      {7, 5, 3},    {64, 128, 32},
                                                      {129, 65, 257}, {1, 1000, 1}, {1000, 1, 7}};
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const auto& [m, kk, n] : shapes) {
      const Tensor a = randn({m, kk}, dtype), b = randn({kk, n}, dtype);
      EXPECT_TRUE(
          cuda_matches_cpu(cuda_mm(gpu(a), gpu(b)), k::mm(a, b), rtol_for(dtype), atol_for(dtype)))
          << dtype << " m=" << m << " k=" << kk << " n=" << n;
    }
  }
}

TEST(CudaLinalg, TransposedOperandsAreReadInPlace) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor a = randn({33, 17}, dtype), b = randn({17, 9}, dtype);
    const Tensor at_base = k::contiguous(k::transpose(a, 0, 1));  // [17, 33]
    const Tensor bt_base = k::contiguous(k::transpose(b, 0, 1));  // [9, 17]
    const Tensor ga = gpu(a), gb = gpu(b);
    const Tensor ga_t = k::transpose(gpu(at_base), 0, 1), gb_t = k::transpose(gpu(bt_base), 0, 1);
    const Tensor expected = k::mm(a, b);
    for (const Tensor& lhs : {ga, ga_t})
      for (const Tensor& rhs : {gb, gb_t})
        EXPECT_TRUE(
            cuda_matches_cpu(cuda_mm(lhs, rhs), expected, rtol_for(dtype), atol_for(dtype)));
  }
}

TEST(CudaLinalg, StridedAndBroadcastOperands) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor base = randn({20, 30}, kFloat64);
  const Tensor b = randn({5, 8}, kFloat64);
  // Every other row and column: no unit stride, copied.
  const Tensor strided = k::slice(k::slice(base, 0, 0, 20, 4), 1, 0, 10, 2);  // [5, 5]
  const Tensor g_strided = k::slice(k::slice(gpu(base), 0, 0, 20, 4), 1, 0, 10, 2);
  const Tensor b5 = randn({5, 8}, kFloat64);
  EXPECT_TRUE(cuda_matches_cpu(cuda_mm(g_strided, gpu(b5)), k::mm(strided, b5), 1e-10, 1e-10));
  // A narrow column block: unit inner stride, ld = 30 > cols.
  const Tensor narrow = k::narrow(base, 1, 3, 5);  // [20, 5]
  EXPECT_TRUE(cuda_matches_cpu(cuda_mm(k::narrow(gpu(base), 1, 3, 5), gpu(b)), k::mm(narrow, b),
                               1e-10, 1e-10));
  // An expanded row (stride 0 between rows).
  const Tensor row = randn({1, 8}, kFloat64), lhs = randn({6, 5}, kFloat64);
  const Tensor expanded = k::expand(row, {5, 8});
  EXPECT_TRUE(cuda_matches_cpu(cuda_mm(gpu(lhs), k::expand(gpu(row), {5, 8})),
                               k::mm(lhs, k::contiguous(expanded)), 1e-10, 1e-10));
}

TEST(CudaLinalg, AlphaBetaAndOutputViews) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor a = randn({6, 4}, kFloat64), b = randn({4, 5}, kFloat64);
  const Tensor old = randn({6, 5}, kFloat64);
  Tensor expected = k::clone(old);
  k::mm_out(expected, a, b, 0.5, 2.0);

  Tensor out = gpu(old);
  const uint64_t version = out.version();
  cuda::mm_out(out, gpu(a), gpu(b), 0.5, 2.0);
  EXPECT_GT(out.version(), version);
  EXPECT_TRUE(cuda_matches_cpu(out, expected, 1e-10, 1e-10));

  // A column block of a wider output (ldc > N).
  const Tensor wide_old = randn({6, 9}, kFloat64);
  Tensor wide_expected = k::clone(wide_old);
  k::mm_out(k::narrow(wide_expected, 1, 2, 5), a, b, 0.5, 2.0);
  Tensor wide = gpu(wide_old);
  cuda::mm_out(k::narrow(wide, 1, 2, 5), gpu(a), gpu(b), 0.5, 2.0);
  EXPECT_TRUE(cuda_matches_cpu(wide, wide_expected, 1e-10, 1e-10));

  // A transposed output (no unit inner stride) goes through a buffer.
  Tensor out_t_base = gpu(k::contiguous(k::transpose(old, 0, 1)));  // [5, 6]
  cuda::mm_out(k::transpose(out_t_base, 0, 1), gpu(a), gpu(b), 0.5, 2.0);
  EXPECT_TRUE(tensors_close(k::transpose(out_t_base.to(kCPU), 0, 1), expected, 1e-10, 1e-10));

  // beta = 0 ignores NaNs in out.
  Tensor nan_out = gpu(full({6, 5}, std::nan(""), kFloat64));
  cuda::mm_out(nan_out, gpu(a), gpu(b), 1.0, 0.0);
  EXPECT_TRUE(cuda_matches_cpu(nan_out, k::mm(a, b), 1e-10, 1e-10));
}

TEST(CudaLinalg, EmptyInnerDimension) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor a = empty({3, 0}, kFloat32), b = empty({0, 4}, kFloat32);
  Tensor out = gpu(full({3, 4}, 2.0, kFloat32));
  cuda::mm_out(out, gpu(a), gpu(b), 1.0, 1.5);
  EXPECT_TRUE(cuda_matches_cpu(out, full({3, 4}, 3.0, kFloat32)));
  cuda::mm_out(out, gpu(a), gpu(b), 1.0, 0.0);
  EXPECT_TRUE(cuda_matches_cpu(out, zeros({3, 4}, kFloat32)));
  EXPECT_TRUE(
      cuda_matches_cpu(cuda::bmm(gpu(empty({2, 3, 0})), gpu(empty({2, 0, 4}))), zeros({2, 3, 4})));
  EXPECT_EQ(cuda::bmm(gpu(empty({0, 3, 2})), gpu(empty({0, 2, 4}))).sizes(), (Shape{0, 3, 4}));
}

TEST(CudaLinalg, BmmMatchesCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  const std::vector<std::array<int64_t, 4>> shapes = {
      {3, 7, 5, 9}, {1, 4, 4, 4}, {5, 1, 1, 1}, {17, 33, 65, 31}};
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const auto& [batch, m, kk, n] : shapes) {
      const Tensor a = randn({batch, m, kk}, dtype), b = randn({batch, kk, n}, dtype);
      const Tensor expected = k::bmm(a, b);
      EXPECT_TRUE(
          cuda_matches_cpu(cuda::bmm(gpu(a), gpu(b)), expected, rtol_for(dtype), atol_for(dtype)));
      // Transposed matrices within the batch.
      const Tensor ga_t = k::transpose(gpu(k::contiguous(k::transpose(a, 1, 2))), 1, 2);
      const Tensor gb_t = k::transpose(gpu(k::contiguous(k::transpose(b, 1, 2))), 1, 2);
      EXPECT_TRUE(
          cuda_matches_cpu(cuda::bmm(ga_t, gb_t), expected, rtol_for(dtype), atol_for(dtype)));
    }
  }
  // A batch broadcast by expand (batch stride 0), and a batch-strided slice.
  const Tensor a1 = randn({1, 6, 5}, kFloat64), b = randn({4, 5, 3}, kFloat64);
  EXPECT_TRUE(cuda_matches_cpu(cuda::bmm(k::expand(gpu(a1), {4, 6, 5}), gpu(b)),
                               k::bmm(k::contiguous(k::expand(a1, {4, 6, 5})), b), 1e-10, 1e-10));
  const Tensor big = randn({8, 6, 5}, kFloat64);
  EXPECT_TRUE(cuda_matches_cpu(cuda::bmm(k::slice(gpu(big), 0, 0, 8, 2), gpu(b)),
                               k::bmm(k::slice(big, 0, 0, 8, 2), b), 1e-10, 1e-10));
}

// float16 and bfloat16 on tensor cores, accumulating in float32: against the float32 product
// of the same (rounded) inputs, within the output's rounding.
TEST(CudaLinalg, HalfTypesAgainstFloat32) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat16, kBFloat16}) {
    const double tol = dtype == kFloat16 ? 2e-3 : 1e-2;
    const Tensor a = randn({48, 64}).to(dtype), b = randn({64, 40}).to(dtype);
    const Tensor expected = k::mm(a.to(kFloat32), b.to(kFloat32));
    const Tensor out = cuda_mm(gpu(a), gpu(b));
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_TRUE(tensors_close(out.to(kCPU).to(kFloat32), expected, tol, tol)) << dtype;
    // Transposed operand, and the batched path.
    const Tensor gb_t = k::transpose(gpu(k::contiguous(k::transpose(b, 0, 1))), 0, 1);
    EXPECT_TRUE(tensors_close(cuda_mm(gpu(a), gb_t).to(kCPU).to(kFloat32), expected, tol, tol));
    const Tensor a3 = randn({3, 16, 32}).to(dtype), b3 = randn({3, 32, 8}).to(dtype);
    EXPECT_TRUE(tensors_close(cuda::bmm(gpu(a3), gpu(b3)).to(kCPU).to(kFloat32),
                              k::bmm(a3.to(kFloat32), b3.to(kFloat32)), tol, tol))
        << dtype;
  }
}

TEST(CudaLinalg, Tf32IsOffByDefaultAndLooserWhenOn) {
  LOOM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::allow_tf32());
  const Tensor a = randn({128, 256}), b = randn({256, 96});
  const Tensor expected = k::mm(a, b);
  Tf32Guard guard(true);
  EXPECT_TRUE(cuda_matches_cpu(cuda_mm(gpu(a), gpu(b)), expected, 1e-2, 5e-2));
  EXPECT_TRUE(cuda_matches_cpu(cuda::bmm(gpu(k::unsqueeze(a, 0)), gpu(k::unsqueeze(b, 0))),
                               k::unsqueeze(expected, 0), 1e-2, 5e-2));
}

TEST(CudaLinalg, SameBitsTwice) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor a = gpu(randn({300, 200})), b = gpu(randn({200, 100}));
  EXPECT_TRUE(bitwise_equal(cuda_mm(a, b), cuda_mm(a, b)));
  const Tensor a3 = gpu(randn({4, 50, 60})), b3 = gpu(randn({4, 60, 70}));
  EXPECT_TRUE(bitwise_equal(cuda::bmm(a3, b3), cuda::bmm(a3, b3)));
}

TEST(CudaLinalg, Errors) {
  LOOM_SKIP_WITHOUT_GPU();
  // Through the kernels:: entry points, which check before they switch to CUDA.
  const Tensor a = gpu(randn({2, 3})), b = gpu(randn({4, 5}));
  EXPECT_LOOM_ERROR(k::mm(a, b), ShapeError, {"mm", "[2, 3]", "[4, 5]"});
  EXPECT_LOOM_ERROR(k::mm(a, gpu(randn({3, 2}, kFloat64))), DTypeError, {"mm", "float32"});
  const Tensor ints = gpu(randint(0, 5, {2, 2}));
  EXPECT_LOOM_ERROR(k::mm(ints, ints), DTypeError, {"mm", "int64"});
  EXPECT_LOOM_ERROR(k::mm(a, randn({3, 2})), DeviceError, {"mm"});
  // out on another device than the operands, either way round.
  EXPECT_LOOM_ERROR(k::mm_out(empty({2, 2}), a, gpu(randn({3, 2}))), DeviceError, {"mm"});
  EXPECT_LOOM_ERROR(k::mm_out(gpu(empty({2, 2})), randn({2, 3}), randn({3, 2})), DeviceError,
                    {"mm"});
  EXPECT_LOOM_ERROR(k::bmm(gpu(randn({2, 3, 4})), gpu(randn({3, 4, 5}))), ShapeError,
                    {"bmm", "[2, 3, 4]", "[3, 4, 5]"});
  EXPECT_LOOM_ERROR(k::bmm(gpu(randn({2, 3, 4})), gpu(randn({2, 4, 5}, kFloat64))), DTypeError,
                    {"bmm"});
}

}  // namespace
}  // namespace loom::test
