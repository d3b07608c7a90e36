// tests/tensor/embedding_dropout_test.cpp — embedding (forward, accumulated and padded gradients,
// thread-count independence) and dropout (the Philox mask, determinism, statistics, gradients,
// errors).

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/index.h"
#include "test_util.h"

namespace loom {
namespace {

using test::tensors_close;
using test::values_are;

// Runs f with n threads, then restores the previous count.
template <typename F>
auto with_threads(int n, F&& f) {
  const int previous = get_num_threads();
  set_num_threads(n);
  auto result = f();
  set_num_threads(previous);
  return result;
}

// ---------------------------------------------------------------- embedding

TEST(Embedding, MatchesNaiveRowLookup) {
  Tensor weight = randn({10, 4});
  Tensor index = tensor<int64_t>({3, 0, 9, 3, 3, 7}, {2, 3});
  Tensor out = embedding(weight, index);
  EXPECT_EQ(out.sizes(), Shape({2, 3, 4}));
  const std::vector<double> wv = weight.to_vector<double>();
  std::vector<double> expected;
  for (int64_t i : index.to_vector<int64_t>())
    for (int64_t d = 0; d < 4; ++d) expected.push_back(wv[i * 4 + d]);
  EXPECT_TRUE(values_are(out, expected, 0.0));
  EXPECT_TRUE(tensors_close(embedding(weight, index.to(kInt32)), out, 0, 0));
  // A strided weight, a 0-d index, an empty index.
  EXPECT_TRUE(tensors_close(embedding(weight.t().contiguous().t(), index), out, 0, 0));
  EXPECT_TRUE(tensors_close(embedding(weight, scalar_tensor(9, kInt64)), weight[9], 0, 0));
  EXPECT_EQ(embedding(weight, empty({0}, kInt64)).sizes(), Shape({0, 4}));
  // padding_idx changes only the gradient: the forward returns that row as it is.
  EXPECT_TRUE(tensors_close(embedding(weight, index, 3), out, 0, 0));
}

TEST(Embedding, GradientAccumulatesDuplicatesAndSkipsPadding) {
  Tensor weight = test::dparam({5, 2});
  Tensor index = tensor<int64_t>({1, 4, 1, 0, 1}, {5});
  Tensor dout = tensor<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2});
  embedding(weight, index).backward(dout);
  EXPECT_TRUE(values_are(weight.grad(), {7, 8, 15, 18, 0, 0, 0, 0, 3, 4}));

  Tensor padded = test::dparam({5, 2});
  embedding(padded, index, /*padding_idx=*/1).backward(dout);
  EXPECT_TRUE(values_are(padded.grad(), {7, 8, 0, 0, 0, 0, 0, 0, 3, 4}));

  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        Tensor y = embedding(in[0], tensor<int64_t>({2, 0, 2, 2}, {2, 2}));
        return y * y;
      },
      {test::dparam({3, 3})});
}

TEST(Embedding, LargeBackwardMatchesNaiveForAnyThreadCount) {
  const int64_t vocab = 300, dim = 96, n = 6000;
  Tensor index = randint(0, vocab, {n / 2, 2});
  Tensor dout = randn({n / 2, 2, dim});
  auto dweight = [&](int threads) {
    return with_threads(threads, [&] {
      return kernels::embedding_backward(dout, index, vocab, /*padding_idx=*/5);
    });
  };
  Tensor one = dweight(1), two = dweight(2);
  EXPECT_TRUE(tensors_close(one, two, 0, 0));  // bitwise: the same summation order

  std::vector<double> expected(vocab * dim, 0.0);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  const std::vector<double> gv = dout.to_vector<double>();
  for (int64_t j = 0; j < n; ++j)
    if (iv[j] != 5)
      for (int64_t d = 0; d < dim; ++d) expected[iv[j] * dim + d] += gv[j * dim + d];
  EXPECT_TRUE(values_are(one, expected, 1e-4));

  // Every index the same row (the worst case for row-parallel work) with a wide row.
  Tensor hot = zeros({4000}, kInt64);
  Tensor wide = ones({4000, 1000});
  Tensor hot_grad = with_threads(2, [&] { return kernels::embedding_backward(wide, hot, 3, -1); });
  EXPECT_DOUBLE_EQ(hot_grad[0][999].item(), 4000.0);
  EXPECT_DOUBLE_EQ(hot_grad[1][0].item(), 0.0);
}

TEST(Embedding, Errors) {
  Tensor weight = zeros({5, 3});
  EXPECT_LOOM_ERROR(embedding(zeros({5}), tensor<int64_t>({0})), ShapeError, {"embedding", "[5]"});
  EXPECT_LOOM_ERROR(embedding(weight, tensor<float>({0.f})), DTypeError, {"embedding", "float32"});
  EXPECT_LOOM_ERROR(embedding(weight, tensor<int64_t>({0, 5}, {1, 2})), IndexError,
                    {"embedding", "index 5", "[5, 3]", "[1, 2]"});
  EXPECT_LOOM_ERROR(embedding(weight, tensor<int32_t>({-1})), IndexError,
                    {"embedding", "index -1", "[5, 3]"});
  EXPECT_LOOM_ERROR(embedding(weight, tensor<int64_t>({0}), 5), IndexError,
                    {"embedding", "padding_idx 5", "[5, 3]"});
  EXPECT_LOOM_ERROR(embedding(weight, tensor<int64_t>({0}), -2), IndexError,
                    {"embedding", "padding_idx -2"});
}

// ---------------------------------------------------------------- dropout

TEST(Dropout, MaskIsRandOfTheSameShapeAtLeastP) {
  Tensor x = randn({37, 11});  // not a multiple of 4 elements
  const double p = 0.3;
  manual_seed(123);
  Tensor y = dropout(x, p);
  manual_seed(123);
  const std::vector<double> u = rand({37, 11}).to_vector<double>();
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<double> expected;
  for (size_t i = 0; i < u.size(); ++i) expected.push_back(u[i] >= p ? xv[i] / (1 - p) : 0.0);
  EXPECT_TRUE(values_are(y, expected, 1e-6));
  // float64 draws the same mask; a strided input is masked in its logical order.
  manual_seed(123);
  EXPECT_TRUE(values_are(dropout(x.to(kFloat64), p), expected, 1e-6));
  manual_seed(123);
  EXPECT_TRUE(values_are(dropout(x.t().contiguous().t(), p), expected, 1e-6));
}

TEST(Dropout, SameSeedSameMaskAndTheGeneratorMovesOn) {
  Tensor x = ones({1001});
  manual_seed(7);
  Tensor a = dropout(x, 0.5);
  EXPECT_EQ(default_generator().offset(), 251u);  // ceil(1001 / 4) counters
  Tensor b = dropout(x, 0.5);
  manual_seed(7);
  Tensor c = dropout(x, 0.5);
  EXPECT_TRUE(tensors_close(a, c, 0, 0));
  EXPECT_FALSE(tensors_close(a, b, 0, 0));
}

TEST(Dropout, IndependentOfThreadCount) {
  Tensor x = randn({300001});
  auto run = [&](int threads) {
    return with_threads(threads, [&] {
      manual_seed(99);
      return dropout(x, 0.25);
    });
  };
  EXPECT_TRUE(tensors_close(run(1), run(2), 0, 0));
}

TEST(Dropout, StatisticsMatchP) {
  const int64_t n = 1 << 20;
  for (double p : {0.1, 0.5, 0.8}) {
    manual_seed(2024);
    Tensor y = dropout(ones({n}), p);
    const std::vector<float> v = y.to_vector<float>();
    int64_t zeroed = 0;
    double total = 0;
    for (float e : v) {
      zeroed += e == 0.0f;
      total += e;
    }
    // Binomial standard deviation of the fraction: sqrt(p(1-p)/n) < 0.0005; allow 10 of them.
    EXPECT_NEAR(static_cast<double>(zeroed) / n, p, 0.005) << "p=" << p;
    EXPECT_NEAR(total / n, 1.0, 5 * std::sqrt(p / (1 - p) / n)) << "p=" << p;  // mean kept
  }
}

TEST(Dropout, GradientIsTheSameMaskAndScale) {
  Tensor x = test::dparam({6, 7});
  manual_seed(5);
  Tensor y = dropout(x, 0.4);
  Tensor dout = randn({6, 7}, kFloat64);
  y.backward(dout);
  manual_seed(5);
  const std::vector<double> u = rand({6, 7}).to_vector<double>();
  const std::vector<double> gv = dout.to_vector<double>();
  std::vector<double> expected;
  for (size_t i = 0; i < u.size(); ++i) expected.push_back(u[i] >= 0.4 ? gv[i] / 0.6 : 0.0);
  EXPECT_TRUE(values_are(x.grad(), expected, 1e-12));

  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        manual_seed(11);  // the same mask on every call
        return dropout(in[0], 0.5) * in[0];
      },
      {test::dparam({3, 5})});
}

TEST(Dropout, IdentityWhenOffAndZerosWhenPIsOne) {
  Tensor x = test::dparam({4, 3});
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  Tensor ints = tensor<int64_t>({1, 2});
  EXPECT_TRUE(dropout(ints, 0.5, /*training=*/false).is_same(ints));
  const uint64_t before = default_generator().offset();
  Tensor y = dropout(x, 1.0);
  EXPECT_EQ(default_generator().offset(), before);  // no draw
  EXPECT_TRUE(values_are(y, std::vector<double>(12, 0.0), 0.0));
  sum(y).backward();
  EXPECT_TRUE(values_are(x.grad(), std::vector<double>(12, 0.0), 0.0));
}

TEST(Dropout, PropagatesNaNLikeMultiplication) {
  Tensor x = full({64}, std::numeric_limits<double>::quiet_NaN(), kFloat64);
  const std::vector<double> v = dropout(x, 0.5).to_vector<double>();
  for (double e : v) EXPECT_TRUE(std::isnan(e));
}

TEST(Dropout, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_LOOM_ERROR(dropout(x, -0.1), ValueError, {"dropout", "-0.1", "[2, 3]"});
  EXPECT_LOOM_ERROR(dropout(x, 1.5), ValueError, {"dropout", "1.5"});
  EXPECT_LOOM_ERROR(dropout(x, std::nan(""), false), ValueError, {"dropout", "nan"});
  EXPECT_LOOM_ERROR(dropout(zeros({2, 3}, kInt64), 0.5), DTypeError, {"dropout", "int64"});
  EXPECT_LOOM_ERROR(dropout(zeros({2, 3}, kFloat16), 0.5), DTypeError, {"dropout", "float16"});
}

}  // namespace
}  // namespace loom
