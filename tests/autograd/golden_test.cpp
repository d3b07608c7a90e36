// tests/autograd/golden_test.cpp — loom's conv2d, batch_norm, cross_entropy and layer_norm against
// PyTorch: inputs, outputs and gradients come from tests/golden/*.safetensors, written by
// tools/make_golden.py (keys in tests/golden/README.md). float64 throughout, tight tolerances.
#include <string>

#include "autograd/ops/conv.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/norm.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom {
namespace {

// float64 against float64: only the order of summation may differ from PyTorch.
constexpr double kRtol = 1e-9;
constexpr double kAtol = 1e-11;

SafetensorsFile golden(const std::string& name) {
  return load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/" + name + ".safetensors");
}

// A fresh leaf that requires grad, holding a copy of the fixture's tensor.
Tensor leaf(const SafetensorsFile& f, const std::string& key) {
  Tensor t = f.at(key).clone();
  t.requires_grad_();
  return t;
}

::testing::AssertionResult matches(const Tensor& actual, const SafetensorsFile& f,
                                   const std::string& key) {
  if (!actual.defined()) return ::testing::AssertionFailure() << key << ": loom's is undefined";
  const auto result = test::tensors_close(actual, f.at(key), kRtol, kAtol);
  if (!result) return ::testing::AssertionFailure() << key << ": " << result.message();
  return result;
}

// The fixture was made with the parameters this test passes.
void expect_parameter(const SafetensorsFile& f, const std::string& key, const std::string& value) {
  EXPECT_EQ(f.metadata.at(key), value) << key;
}
void expect_parameter(const SafetensorsFile& f, const std::string& key, double value) {
  EXPECT_EQ(std::stod(f.metadata.at(key)), value) << key;
}

// ---------------------------------------------------------------------------------- conv2d

void check_conv2d(const std::string& c, Pair stride, Pair padding, int64_t groups) {
  const SafetensorsFile f = golden("conv2d");
  expect_parameter(f, c + ".stride", std::to_string(stride[0]) + "," + std::to_string(stride[1]));
  expect_parameter(f, c + ".padding",
                   std::to_string(padding[0]) + "," + std::to_string(padding[1]));
  expect_parameter(f, c + ".groups", std::to_string(groups));
  Tensor x = leaf(f, c + ".input"), weight = leaf(f, c + ".weight"), bias = leaf(f, c + ".bias");
  const Tensor y = conv2d(x, weight, bias, stride, padding, /*dilation=*/{1, 1}, groups);
  EXPECT_TRUE(matches(y, f, c + ".output"));
  y.backward(f.at(c + ".grad_output"));
  EXPECT_TRUE(matches(x.grad(), f, c + ".grad_input"));
  EXPECT_TRUE(matches(weight.grad(), f, c + ".grad_weight"));
  EXPECT_TRUE(matches(bias.grad(), f, c + ".grad_bias"));
}

TEST(Conv2dGolden, Plain) { check_conv2d("plain", {1, 1}, {0, 0}, 1); }
TEST(Conv2dGolden, StridedPaddedGrouped) { check_conv2d("grouped", {2, 2}, {1, 1}, 2); }

// ------------------------------------------------------------------------------ batch_norm

void check_batch_norm(const std::string& c, bool training) {
  const double momentum = 0.1, eps = 1e-5;
  const SafetensorsFile f = golden("batch_norm");
  expect_parameter(f, c + ".training", training ? "true" : "false");
  expect_parameter(f, c + ".momentum", momentum);
  expect_parameter(f, c + ".eps", eps);
  Tensor x = leaf(f, c + ".input"), weight = leaf(f, c + ".weight"), bias = leaf(f, c + ".bias");
  const Tensor running_mean = f.at(c + ".running_mean").clone();
  const Tensor running_var = f.at(c + ".running_var").clone();
  const Tensor y = batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps);
  EXPECT_TRUE(matches(y, f, c + ".output"));
  if (training) {  // updated in place: momentum toward the batch's mean and unbiased variance
    EXPECT_TRUE(matches(running_mean, f, c + ".running_mean_after"));
    EXPECT_TRUE(matches(running_var, f, c + ".running_var_after"));
  } else {  // eval leaves them alone
    EXPECT_TRUE(matches(running_mean, f, c + ".running_mean"));
    EXPECT_TRUE(matches(running_var, f, c + ".running_var"));
  }
  y.backward(f.at(c + ".grad_output"));
  EXPECT_TRUE(matches(x.grad(), f, c + ".grad_input"));
  EXPECT_TRUE(matches(weight.grad(), f, c + ".grad_weight"));
  EXPECT_TRUE(matches(bias.grad(), f, c + ".grad_bias"));
}

TEST(BatchNormGolden, Training) { check_batch_norm("train", true); }
TEST(BatchNormGolden, TrainingTwoDimensional) { check_batch_norm("train2d", true); }
TEST(BatchNormGolden, Eval) { check_batch_norm("eval", false); }

// --------------------------------------------------------------------------- cross_entropy

void check_cross_entropy(const std::string& c, int64_t ignore_index, double label_smoothing) {
  const SafetensorsFile f = golden("cross_entropy");
  expect_parameter(f, c + ".ignore_index", std::to_string(ignore_index));
  expect_parameter(f, c + ".label_smoothing", label_smoothing);
  expect_parameter(f, c + ".reduction", "mean");
  Tensor logits = leaf(f, c + ".logits");
  const Tensor& target = f.at(c + ".target");
  ASSERT_EQ(target.dtype(), kInt64);
  const Tensor loss = cross_entropy(logits, target, Reduction::Mean, ignore_index, label_smoothing);
  EXPECT_TRUE(matches(loss, f, c + ".loss"));  // a 0-d tensor, as PyTorch's
  loss.backward();
  EXPECT_TRUE(matches(logits.grad(), f, c + ".grad_logits"));
}

TEST(CrossEntropyGolden, LabelSmoothing) { check_cross_entropy("smoothing", -100, 0.1); }
TEST(CrossEntropyGolden, IgnoreIndex) { check_cross_entropy("ignore", -1, 0.0); }
TEST(CrossEntropyGolden, LabelSmoothingWithIgnoredTargets) {
  check_cross_entropy("smoothing_ignore", -100, 0.1);
}
TEST(CrossEntropyGolden, SpatialTargets) { check_cross_entropy("spatial", -100, 0.1); }

// ------------------------------------------------------------------------------ layer_norm

void check_layer_norm(const std::string& c, const Shape& normalized_shape) {
  const double eps = 1e-5;
  const SafetensorsFile f = golden("layer_norm");
  std::string shape_text;
  for (size_t i = 0; i < normalized_shape.size(); ++i) {
    if (i) shape_text += ',';
    shape_text += std::to_string(normalized_shape[i]);
  }
  expect_parameter(f, c + ".normalized_shape", shape_text);
  expect_parameter(f, c + ".eps", eps);
  Tensor x = leaf(f, c + ".input"), weight = leaf(f, c + ".weight"), bias = leaf(f, c + ".bias");
  const Tensor y = layer_norm(x, normalized_shape, weight, bias, eps);
  EXPECT_TRUE(matches(y, f, c + ".output"));
  y.backward(f.at(c + ".grad_output"));
  EXPECT_TRUE(matches(x.grad(), f, c + ".grad_input"));
  EXPECT_TRUE(matches(weight.grad(), f, c + ".grad_weight"));
  EXPECT_TRUE(matches(bias.grad(), f, c + ".grad_bias"));
}

TEST(LayerNormGolden, TwoTrailingDims) { check_layer_norm("two_dims", {4, 5}); }
TEST(LayerNormGolden, LastDim) { check_layer_norm("last_dim", {6}); }

}  // namespace
}  // namespace loom
