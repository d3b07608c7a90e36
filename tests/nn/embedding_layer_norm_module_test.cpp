// tests/nn/embedding_layer_norm_module_test.cpp — the Transformer's table and norm layers:
// nn::Embedding (rows of its weight, N(0, 1) init, padding_idx zero and without gradient, a
// negative padding_idx wrapped) and nn::LayerNorm (ones and zeros, the functional op's numbers,
// without affine or bias), their state-dict keys and PyTorch's printed forms, and the errors.

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "autograd/ops.h"
#include "nn/nn.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

std::vector<std::string> keys(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(name);
  return out;
}

TEST(EmbeddingModule, LooksUpRowsOfItsWeight) {
  manual_seed(3);
  Embedding table(10, 4);
  const Tensor index = tensor(std::vector<int64_t>{7, 0, 7, 9, 2, 3}, {2, 3});
  const Tensor out = table.forward(index);
  ASSERT_EQ(out.sizes(), (Shape{2, 3, 4}));
  const std::vector<int64_t> rows = index.to_vector<int64_t>();
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_TRUE(tensors_close(out.reshape({6, 4})[i], table.weight[rows[i]], 0, 0)) << i;
  EXPECT_EQ(keys(table), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(table.repr(), "Embedding(10, 4)");
}

TEST(EmbeddingModule, StartsFromAStandardNormal) {
  manual_seed(5);
  Embedding table(200, 100);  // 20000 draws
  const std::vector<double> w = table.weight.to_vector<double>();
  const double mean = std::accumulate(w.begin(), w.end(), 0.0) / w.size();
  double var = 0;
  for (double v : w) var += (v - mean) * (v - mean);
  var /= w.size();
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.03);
}

TEST(EmbeddingModule, ThePaddingRowStartsAtZeroAndGetsNoGradient) {
  manual_seed(7);
  Embedding table(6, 3, /*padding_idx=*/-2);  // wraps to 4, as PyTorch's
  ASSERT_EQ(table.padding_idx, 4);
  EXPECT_TRUE(tensors_close(table.weight[4], zeros({3}), 0, 0));
  EXPECT_GT(sum(abs(table.weight[3])).item<float>(), 0.0f);
  const Tensor index = tensor(std::vector<int64_t>{4, 1, 4, 1});
  sum(table.forward(index)).backward();
  const Tensor g = table.weight.grad();
  EXPECT_TRUE(tensors_close(g[4], zeros({3}), 0, 0));
  EXPECT_TRUE(tensors_close(g[1], full({3}, 2.0), 0, 0));
  EXPECT_EQ(table.repr(), "Embedding(6, 3, padding_idx=4)");
}

TEST(EmbeddingModule, RefusesBadSizesAndPaddingIndices) {
  EXPECT_LOOM_ERROR(Embedding(0, 3), ValueError, {"Embedding", "num_embeddings"});
  EXPECT_LOOM_ERROR(Embedding(4, 0), ValueError, {"Embedding", "embedding_dim"});
  EXPECT_LOOM_ERROR(Embedding(4, 3, 4), ValueError, {"padding_idx", "[-4, 4)", "got 4"});
  EXPECT_LOOM_ERROR(Embedding(4, 3, -5), ValueError, {"padding_idx", "got -5"});
}

TEST(LayerNormModule, OnesAndZerosThenTheFunctionalNumbers) {
  LayerNorm norm(Shape{2, 3});
  EXPECT_EQ(keys(norm), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(tensors_close(norm.weight, ones({2, 3}), 0, 0));
  EXPECT_TRUE(tensors_close(norm.bias, zeros({2, 3}), 0, 0));
  manual_seed(11);
  const Tensor x = randn({4, 2, 3});
  {
    autograd::NoGradGuard no_grad;
    norm.weight.copy_(randn({2, 3}));
    norm.bias.copy_(randn({2, 3}));
  }
  EXPECT_TRUE(
      tensors_close(norm.forward(x), layer_norm(x, {2, 3}, norm.weight, norm.bias, 1e-5), 0, 0));
  // Each row of 6 has mean 0 and variance 1 before the affine part.
  LayerNorm plain(Shape{2, 3}, {.elementwise_affine = false});
  const Tensor y = plain.forward(x).reshape({4, 6});
  EXPECT_TRUE(tensors_close(mean(y, {1}), zeros({4}), 0, 1e-6));
  EXPECT_TRUE(tensors_close(var(y, {1}, /*unbiased=*/false), ones({4}), 1e-4, 1e-4));
  EXPECT_EQ(norm.repr(), "LayerNorm((2, 3), eps=1e-05, elementwise_affine=True)");
}

TEST(LayerNormModule, WithoutAffineOrBias) {
  LayerNorm plain(8, {.eps = 1e-6, .elementwise_affine = false});
  EXPECT_TRUE(keys(plain).empty());
  EXPECT_FALSE(plain.weight.defined());
  EXPECT_EQ(plain.repr(), "LayerNorm((8,), eps=1e-06, elementwise_affine=False)");
  LayerNorm no_bias(8, {.bias = false});
  EXPECT_EQ(keys(no_bias), (std::vector<std::string>{"weight"}));
  manual_seed(13);
  const Tensor x = randn({3, 8});
  EXPECT_TRUE(
      tensors_close(no_bias.forward(x), layer_norm(x, {8}, no_bias.weight, Tensor(), 1e-5), 0, 0));
}

TEST(LayerNormModule, RefusesBadShapesAndEps) {
  EXPECT_LOOM_ERROR(LayerNorm(Shape{}), ValueError, {"LayerNorm", "normalized_shape"});
  EXPECT_LOOM_ERROR(LayerNorm(Shape{4, 0}), ValueError, {"LayerNorm", "positive"});
  EXPECT_LOOM_ERROR(LayerNorm(4, {.eps = 0}), ValueError, {"LayerNorm", "eps"});
  LayerNorm norm(4);
  EXPECT_THROW(norm.forward(zeros({2, 5})), ShapeError);
}

}  // namespace
}  // namespace loom::nn
