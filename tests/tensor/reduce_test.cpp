// tests/tensor/reduce_test.cpp — reductions over any set of dims with keepdim: forward against
// loops over the values, gradcheck of each, the errors.

#include <cmath>
#include <limits>

#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;
using loom::test::values_are;

TEST(Reduce, SumMeanOverDims) {
  Tensor x = arange(0, 24, 1, kFloat64).reshape({2, 3, 4});
  EXPECT_TRUE(values_are(sum(x), {276}));
  EXPECT_EQ(sum(x).dim(), 0);
  EXPECT_TRUE(values_are(sum(x, {0}), {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34}));
  EXPECT_TRUE(values_are(sum(x, {1}), {12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_TRUE(values_are(sum(x, {0, 2}), {60, 92, 124}));
  EXPECT_TRUE(values_are(sum(x, {-1}), {6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(sum(x, {1}, true).sizes(), (Shape{2, 1, 4}));
  EXPECT_EQ(sum(x, {0, 2}, true).sizes(), (Shape{1, 3, 1}));
  EXPECT_TRUE(values_are(mean(x, {0, 2}), {7.5, 11.5, 15.5}));
  EXPECT_TRUE(values_are(sum(x.permute({2, 0, 1}), {1}), sum(x, {0}).t().to_vector<double>()));
  // Integer sums are int64.
  Tensor i = tensor<int32_t>({1, 2, 3});
  EXPECT_EQ(sum(i).dtype(), kInt64);
  EXPECT_TRUE(values_are(sum(i), {6}));
  // Leading-dim fast path agrees with the general path on a big tensor.
  manual_seed(0);
  Tensor big = randn({64, 33, 7}, kFloat64);
  EXPECT_TRUE(tensors_close(sum(big, {0, 1}), sum(big.permute({2, 0, 1}), {1, 2}), 1e-12, 1e-12));
}

TEST(Reduce, MaxMinArg) {
  Tensor x = tensor<float>({3, 7, 1, 7, -2, 5}, {2, 3});
  EXPECT_TRUE(values_are(amax(x), {7}));
  EXPECT_TRUE(values_are(amax(x, {1}), {7, 7}));
  EXPECT_TRUE(values_are(amin(x, {0}), {3, -2, 1}));
  auto [values, indices] = max(x, 1);
  EXPECT_TRUE(values_are(values, {7, 7}));
  EXPECT_TRUE(values_are(indices, {1, 0}));
  EXPECT_EQ(indices.dtype(), kInt64);
  EXPECT_TRUE(values_are(argmax(x), {1}));  // the first of equal maxima
  EXPECT_TRUE(values_are(argmin(x, 1), {2, 1}));
  EXPECT_EQ(argmax(x, 1, true).sizes(), (Shape{2, 1}));
  Tensor n = tensor<float>({1, std::nanf(""), 3});
  EXPECT_TRUE(std::isnan(amax(n).item()));
}

TEST(Reduce, VarStdLogsumexp) {
  Tensor x = tensor<double>({1, 2, 3, 4, 10, 20, 30, 40}, {2, 4});
  EXPECT_TRUE(values_are(var(x, {1}), {5.0 / 3, 500.0 / 3}, 1e-9));
  EXPECT_TRUE(values_are(var(x, {1}, false), {1.25, 125}, 1e-9));
  EXPECT_TRUE(values_are(loom::std(x, {1}, false), {std::sqrt(1.25), std::sqrt(125.0)}, 1e-9));
  EXPECT_TRUE(values_are(logsumexp(x, {1}),
                         {std::log(std::exp(1) + std::exp(2) + std::exp(3) + std::exp(4)),
                          40 + std::log(std::exp(-30) + std::exp(-20) + std::exp(-10) + 1)},
                         1e-9));
  // Large values do not overflow.
  EXPECT_TRUE(
      values_are(logsumexp(tensor<float>({1000, 1000}), {0}), {1000 + std::log(2.0)}, 1e-3));
}

TEST(Reduce, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_LOOM_ERROR(sum(x, {2}), IndexError, {"sum", "dim 2"});
  EXPECT_LOOM_ERROR(sum(x, {1, -1}), IndexError, {"sum", "more than once"});
  EXPECT_LOOM_ERROR(mean(arange(3)), DTypeError, {"mean", "int64"});
  EXPECT_LOOM_ERROR(amax(zeros({0, 3}), {0}), ValueError, {"amax", "[0, 3]"});
  EXPECT_LOOM_ERROR(max(x, 5), IndexError, {"max", "dim 5"});
  EXPECT_LOOM_ERROR(var(arange(3)), DTypeError, {"var", "int64"});
}

TEST(ReduceGrad, Gradcheck) {
  manual_seed(11);
  Tensor x = dparam({2, 3, 2});
  using In = const std::vector<Tensor>&;
  EXPECT_GRADCHECK([](In t) { return sum(t[0], {0, 2}); }, {x});
  EXPECT_GRADCHECK([](In t) { return sum(t[0], {1}, true); }, {x});
  EXPECT_GRADCHECK([](In t) { return mean(t[0], {-1}); }, {x});
  EXPECT_GRADCHECK([](In t) { return mean(t[0]); }, {x});
  EXPECT_GRADCHECK([](In t) { return amax(t[0], {1}); }, {x});
  EXPECT_GRADCHECK([](In t) { return amin(t[0], {0, 1}, true); }, {x});
  EXPECT_GRADCHECK([](In t) { return max(t[0], 1).first; }, {x});
  EXPECT_GRADCHECK([](In t) { return min(t[0], 0, true).first; }, {x});
  EXPECT_GRADCHECK([](In t) { return var(t[0], {1}); }, {x});
  EXPECT_GRADCHECK([](In t) { return var(t[0], {0, 2}, false, true); }, {x});
  EXPECT_GRADCHECK([](In t) { return loom::std(t[0], {2}); }, {x});
  EXPECT_GRADCHECK([](In t) { return logsumexp(t[0], {1}); }, {x});
}
