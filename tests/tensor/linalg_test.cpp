// tests/tensor/linalg_test.cpp — matmul, bmm, addmm, linear: against a naive triple loop,
// with transposed (strided) operands, batched broadcasting, gradcheck, the errors.

#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;

namespace {

// The naive reference: out[i][j] = sum_k a[i][k] b[k][j], reading through any strides.
Tensor naive_mm(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor ac = a.contiguous().to(kFloat64), bc = b.contiguous().to(kFloat64);
  std::vector<double> out(m * n, 0.0);
  const double* pa = ac.data_ptr<double>();
  const double* pb = bc.data_ptr<double>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) out[i * n + j] += pa[i * k + p] * pb[p * n + j];
  return tensor<double>(out, {m, n});
}

}  // namespace

TEST(Linalg, MatmulAgainstTripleLoop) {
  manual_seed(2);
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat32 ? 1e-4 : 1e-12;
    Tensor a = randn({37, 19}, dt), b = randn({19, 23}, dt);
    EXPECT_TRUE(tensors_close(matmul(a, b).to(kFloat64), naive_mm(a, b), tol, tol));
    // Transposed operands are read in place.
    Tensor at = randn({19, 37}, dt).t(), bt = randn({23, 19}, dt).t();
    EXPECT_TRUE(tensors_close(matmul(at, bt).to(kFloat64), naive_mm(at, bt), tol, tol));
    // No unit stride at all: a copy is made.
    Tensor strided = randn({37, 38}, dt).slice(1, 0, 38, 2);
    Tensor b2 = randn({19, 5}, dt);
    EXPECT_TRUE(tensors_close(matmul(strided, b2).to(kFloat64), naive_mm(strided, b2), tol, tol));
  }
  Tensor big_a = randn({130, 300}), big_b = randn({300, 70});
  EXPECT_TRUE(tensors_close(matmul(big_a, big_b).to(kFloat64), naive_mm(big_a, big_b), 1e-4, 1e-3));
}

TEST(Linalg, BlockedKernelEdgesAndLayouts) {
  // Sizes that are not multiples of the register tile (6 x 16), a depth past one packed block
  // (256), a width past one B block (3072), rows 4 KiB apart with more than one pass over the
  // depth (the driver then stages C: Note [Staging C]), every combination of transposed
  // operands, and accumulation into an existing output (beta).
  manual_seed(9);
  struct Case {
    int64_t m, n, k;
  };
  for (Case c : {Case{67, 45, 300}, Case{7, 3100, 40}, Case{130, 17, 33}, Case{1, 64, 600},
                 Case{13, 1024, 300}, Case{7, 1024, 600}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = ta ? randn({c.k, c.m}).t() : randn({c.m, c.k});
        Tensor b = tb ? randn({c.n, c.k}).t() : randn({c.k, c.n});
        Tensor expected = naive_mm(a, b);
        EXPECT_TRUE(tensors_close(matmul(a, b).to(kFloat64), expected, 1e-4, 1e-3))
            << c.m << "x" << c.n << "x" << c.k << " ta=" << ta << " tb=" << tb;
        Tensor base = randn({c.m, c.n});
        Tensor got = addmm(base, a, b, 0.5, -2.0);
        EXPECT_TRUE(
            tensors_close(got.to(kFloat64), base.to(kFloat64) * 0.5 - expected * 2.0, 1e-4, 1e-3));
      }
    }
  }
}

TEST(Linalg, VectorAndBatchedShapes) {
  manual_seed(4);
  Tensor v = randn({5}, kFloat64), m = randn({5, 3}, kFloat64), w = randn({3}, kFloat64);
  EXPECT_EQ(matmul(v, m).sizes(), (Shape{3}));
  EXPECT_EQ(matmul(m, w).sizes(), (Shape{5}));
  EXPECT_EQ(matmul(v, v).dim(), 0);
  EXPECT_NEAR(matmul(v, v).item(), sum(v * v).item(), 1e-12);
  Tensor a = randn({4, 1, 2, 5}, kFloat64), b = randn({3, 5, 6}, kFloat64);
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.sizes(), (Shape{4, 3, 2, 6}));
  EXPECT_TRUE(tensors_close(c.select(0, 2).select(0, 1),
                            naive_mm(a.select(0, 2).select(0, 0), b.select(0, 1)), 1e-12, 1e-12));
  Tensor x = randn({3, 4, 5}, kFloat64), y = randn({3, 5, 2}, kFloat64);
  Tensor z = bmm(x, y);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(
        tensors_close(z.select(0, i), naive_mm(x.select(0, i), y.select(0, i)), 1e-12, 1e-12));
}

TEST(Linalg, AddmmAndLinear) {
  manual_seed(6);
  Tensor c = randn({3}, kFloat64), a = randn({4, 5}, kFloat64), b = randn({5, 3}, kFloat64);
  Tensor expected = naive_mm(a, b) * 2.0 + c * 0.5;
  EXPECT_TRUE(tensors_close(addmm(c, a, b, 0.5, 2.0), expected, 1e-12, 1e-12));
  Tensor x = randn({2, 3, 5}, kFloat64), weight = randn({4, 5}, kFloat64),
         bias = randn({4}, kFloat64);
  Tensor y = linear(x, weight, bias);
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 4}));
  EXPECT_TRUE(tensors_close(y.reshape({6, 4}), naive_mm(x.reshape({6, 5}), weight.t()) + bias,
                            1e-12, 1e-12));
}

TEST(Linalg, Errors) {
  EXPECT_LOOM_ERROR(matmul(zeros({2, 3}), zeros({4, 5})), ShapeError,
                    {"matmul", "[2, 3]", "[4, 5]"});
  EXPECT_LOOM_ERROR(bmm(zeros({2, 3}), zeros({2, 3, 4})), ShapeError,
                    {"bmm", "[2, 3]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), ShapeError,
                    {"bmm", "[2, 3, 4]", "[3, 4, 5]"});
  EXPECT_LOOM_ERROR(matmul(zeros({2, 3}), zeros({3, 2}, kFloat64)), DTypeError,
                    {"float32", "float64"});
  EXPECT_LOOM_ERROR(matmul(zeros({2, 3}, kInt64), zeros({3, 2}, kInt64)), DTypeError,
                    {"mm", "int64"});
  EXPECT_LOOM_ERROR(addmm(zeros({5}), zeros({2, 3}), zeros({3, 2})), ShapeError, {"addmm", "[5]"});
  EXPECT_LOOM_ERROR(linear(zeros({2, 3}), zeros({4, 5})), ShapeError,
                    {"linear", "[2, 3]", "[4, 5]"});
  EXPECT_LOOM_ERROR(linear(zeros({2, 5}), zeros({4, 5}), zeros({3})), ShapeError,
                    {"linear", "bias", "[3]"});
  EXPECT_LOOM_ERROR(matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), ShapeError,
                    {"matmul", "[2]", "[3]"});
}

TEST(LinalgGrad, Gradcheck) {
  manual_seed(8);
  using In = const std::vector<Tensor>&;
  EXPECT_GRADCHECK([](In t) { return matmul(t[0], t[1]); }, {dparam({3, 4}), dparam({4, 2})});
  EXPECT_GRADCHECK([](In t) { return matmul(t[0].t(), t[1]); }, {dparam({4, 3}), dparam({4, 2})});
  EXPECT_GRADCHECK([](In t) { return matmul(t[0], t[1]); }, {dparam({4}), dparam({4, 2})});
  EXPECT_GRADCHECK([](In t) { return matmul(t[0], t[1]); },
                   {dparam({2, 1, 2, 3}), dparam({2, 3, 2})});
  EXPECT_GRADCHECK([](In t) { return bmm(t[0], t[1]); }, {dparam({2, 2, 3}), dparam({2, 3, 2})});
  EXPECT_GRADCHECK([](In t) { return addmm(t[0], t[1], t[2], 0.5, 2.0); },
                   {dparam({2}), dparam({3, 4}), dparam({4, 2})});
  EXPECT_GRADCHECK([](In t) { return linear(t[0], t[1], t[2]); },
                   {dparam({2, 2, 3}), dparam({4, 3}), dparam({4})});
  EXPECT_GRADCHECK([](In t) { return linear(t[0], t[1]); }, {dparam({2, 3}), dparam({4, 3})});
}
