// tests/nn/module_test.cpp — nn::Module and the layers: registration order and key names,
// state_dict round trips and strict-loading errors, train/eval, to(dtype), zero_grad, printing,
// PyTorch's default initialisation, batch norm's running statistics, and ResNet's structure.

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "scratch_dir.h"
#include "tensor/accelerator.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

std::vector<std::string> keys(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

class Tiny : public Module {
 public:
  Tiny() : Module("Tiny") {
    fc = register_module("fc", make<Linear>(3, 2));
    bn = register_module("bn", make<BatchNorm2d>(2));
    scale = register_parameter("scale", ones({1}));
    steps = register_buffer("steps", zeros({}, kInt64));
  }
  std::shared_ptr<Linear> fc;
  std::shared_ptr<BatchNorm2d> bn;
  Tensor scale, steps;
};

TEST(Module, StateDictKeysFollowPyTorchsOrder) {
  Tiny m;
  // Own parameters, own buffers, then children in registration order.
  EXPECT_EQ(
      keys(m.state_dict()),
      (std::vector<std::string>{"scale", "steps", "fc.weight", "fc.bias", "bn.weight", "bn.bias",
                                "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(keys(m.named_parameters()),
            (std::vector<std::string>{"scale", "fc.weight", "fc.bias", "bn.weight", "bn.bias"}));
  EXPECT_EQ(m.num_parameters(), 1 + 6 + 2 + 2 + 2);
  for (const Tensor& p : m.parameters()) EXPECT_TRUE(p.requires_grad());
  for (const Tensor& b : m.buffers()) EXPECT_FALSE(b.requires_grad());
  std::vector<std::string> modules;
  for (const auto& [name, mod] : m.named_modules()) modules.push_back(name);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "fc", "bn"}));
}

TEST(Module, DuplicateOrDottedNamesAreRefused) {
  class Bad : public Module {
   public:
    explicit Bad(int which) : Module("Bad") {
      register_parameter("w", ones({1}));
      if (which == 0) register_buffer("w", ones({1}));
      if (which == 1) register_parameter("a.b", ones({1}));
      if (which == 2) register_parameter("i", ones({1}, kInt64));
    }
  };
  EXPECT_LOOM_ERROR(Bad(0), ValueError, {"Bad", "'w'", "already registered"});
  EXPECT_LOOM_ERROR(Bad(1), ValueError, {"Bad", "'a.b'"});
  EXPECT_LOOM_ERROR(Bad(2), DTypeError, {"Bad", "'i'", "int64"});
}

TEST(Module, LoadStateDictCopiesValuesIntoTheLiveTensors) {
  manual_seed(1);
  Tiny a, b;
  const Tensor weight_handle = b.fc->weight;
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict())
    for (const auto& [name2, t2] : b.state_dict())
      if (name == name2) {
        EXPECT_TRUE(tensors_close(t2, t, 0, 0)) << name;
      }
  EXPECT_TRUE(weight_handle.is_same(b.fc->weight));  // same tensor, new values
  EXPECT_TRUE(tensors_close(weight_handle, a.fc->weight, 0, 0));
}

TEST(Module, StrictLoadListsEveryProblemAtOnce) {
  Tiny m;
  NamedTensors state = m.state_dict();
  state.erase(state.begin());                      // "scale" missing
  state.emplace_back("extra.weight", zeros({2}));  // unexpected
  for (auto& [name, t] : state)
    if (name == "fc.weight") t = zeros({2, 4});  // shape mismatch
  try {
    m.load_state_dict(state);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    for (const char* part :
         {"Tiny", "missing keys (1)", "scale", "unexpected keys (1)", "extra.weight",
          "shape mismatches (1)", "fc.weight", "checkpoint [2, 4], model [2, 3]"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
  // Non-strict: missing and unexpected keys are ignored, shape mismatches are not.
  state.erase(std::remove_if(state.begin(), state.end(),
                             [](const auto& e) { return e.first == "fc.weight"; }),
              state.end());
  EXPECT_NO_THROW(m.load_state_dict(state, /*strict=*/false));
}

TEST(Module, TrainEvalReachesEveryChild) {
  Tiny m;
  m.eval();
  EXPECT_FALSE(m.is_training());
  EXPECT_FALSE(m.bn->is_training());
  m.train();
  EXPECT_TRUE(m.fc->is_training());
}

TEST(Module, ToDtypeConvertsInPlaceAndKeepsIntegerBuffers) {
  Tiny m;
  const Tensor w = m.fc->weight;
  const std::vector<double> before = w.to_vector<double>();
  m.to(kFloat64);
  EXPECT_EQ(w.dtype(), kFloat64);  // the layer's member and the registered entry are one tensor
  EXPECT_EQ(m.fc->weight.dtype(), kFloat64);
  EXPECT_TRUE(m.fc->weight.requires_grad());
  EXPECT_EQ(m.bn->running_mean.dtype(), kFloat64);
  EXPECT_EQ(m.bn->num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(m.steps.dtype(), kInt64);
  EXPECT_EQ(w.to_vector<double>(), before);
  // It still trains: gradients reach the converted parameters.
  Tensor y = m.fc->forward(ones({4, 3}, kFloat64)).sum();
  y.backward();
  ASSERT_TRUE(m.fc->weight.grad().defined());
  EXPECT_EQ(m.fc->weight.grad().dtype(), kFloat64);
}

TEST(Module, ToAnotherDeviceNeedsCuda) {
  Tiny m;
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(m.to(Device("cuda:0")), DeviceError);
}

TEST(Module, ZeroGradClearsOrZeroes) {
  Tiny m;
  m.fc->forward(ones({2, 3})).sum().backward();
  ASSERT_TRUE(m.fc->weight.grad().defined());
  m.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(test::values_are(m.fc->weight.grad(), std::vector<double>(6, 0.0)));
  m.zero_grad();
  EXPECT_FALSE(m.fc->weight.grad().defined());
}

TEST(Module, ApplyVisitsChildrenFirst) {
  Tiny m;
  std::vector<std::string> order;
  m.apply([&](Module& mod) { order.push_back(mod.type_name()); });
  EXPECT_EQ(order, (std::vector<std::string>{"Linear", "BatchNorm2d", "Tiny"}));
}

TEST(Module, PrintsLikePyTorch) {
  Sequential seq{make<Conv2d>(3, 8, 3, Conv2dOptions{{1, 1}, {1, 1}, {1, 1}, 1, false}),
                 make<BatchNorm2d>(8),
                 make<ReLU>(),
                 make<AdaptiveAvgPool2d>(Pair{1, 1}),
                 make<Flatten>(),
                 make<Linear>(8, 10)};
  EXPECT_EQ(seq.repr(),
            "Sequential(\n"
            "  (0): Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
            "  (1): BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, "
            "track_running_stats=True)\n"
            "  (2): ReLU()\n"
            "  (3): AdaptiveAvgPool2d(output_size=(1, 1))\n"
            "  (4): Flatten(start_dim=1, end_dim=-1)\n"
            "  (5): Linear(in_features=8, out_features=10, bias=True)\n"
            ")");
}

TEST(Layers, LinearAndConvUsePyTorchsDefaultInitBounds) {
  manual_seed(3);
  Linear fc(50, 40);
  const double bound = 1.0 / std::sqrt(50.0);
  for (const Tensor& t : {fc.weight, fc.bias})
    for (double v : t.to_vector<double>()) EXPECT_LE(std::fabs(v), bound);
  // Uniform: the variance is bound^2 / 3.
  double var = 0;
  for (double v : fc.weight.to_vector<double>()) var += v * v;
  var /= 2000.0;
  EXPECT_NEAR(var, bound * bound / 3.0, 0.15 * bound * bound / 3.0);
  Conv2d conv(4, 6, 3);
  const double conv_bound = 1.0 / std::sqrt(4.0 * 9.0);
  for (double v : conv.weight.to_vector<double>()) EXPECT_LE(std::fabs(v), conv_bound);
}

TEST(Layers, LinearComputesXWtPlusB) {
  Linear fc(3, 2);
  fc.to(kFloat64);
  Tensor x = tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto w = fc.weight.to_vector<double>(), b = fc.bias.to_vector<double>();
  const auto y = fc.forward(x).to_vector<double>();
  const auto xv = x.to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < 2; ++o) {
      double ref = b[o];
      for (int j = 0; j < 3; ++j) ref += xv[i * 3 + j] * w[o * 3 + j];
      EXPECT_NEAR(y[i * 2 + o], ref, 1e-12);
    }
  EXPECT_LOOM_ERROR(fc.forward(ones({2, 4}, kFloat64)), ShapeError, {"linear", "[2, 4]"});
  EXPECT_LOOM_ERROR(Linear(0, 3), ValueError, {"Linear", "in_features"});
}

TEST(Layers, BatchNormTracksRunningStatisticsInTraining) {
  BatchNorm2d bn(2);
  bn.to(kFloat64);
  manual_seed(5);
  Tensor x = randn({4, 2, 3, 3}, kFloat64);
  bn.forward(x);
  bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  // running = 0.9^2 * init + (1 - 0.9^2) * batch statistic (variance unbiased).
  const auto xv = x.to_vector<double>();
  for (int c = 0; c < 2; ++c) {
    double sum = 0, sq = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 9; ++i) sum += xv[(n * 2 + c) * 9 + i];
    const double mean = sum / 36;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 9; ++i) sq += std::pow(xv[(n * 2 + c) * 9 + i] - mean, 2);
    const double var = sq / 35;
    EXPECT_NEAR(bn.running_mean.to_vector<double>()[c], 0.19 * mean, 1e-12);
    EXPECT_NEAR(bn.running_var.to_vector<double>()[c], 0.81 + 0.19 * var, 1e-12);
  }
  // Eval normalises with the running statistics and leaves them alone.
  bn.eval();
  const auto mean_before = bn.running_mean.to_vector<double>();
  Tensor y = bn.forward(x);
  EXPECT_EQ(bn.running_mean.to_vector<double>(), mean_before);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  const double rm = mean_before[0], rv = bn.running_var.to_vector<double>()[0];
  EXPECT_NEAR(y.to_vector<double>()[0], (xv[0] - rm) / std::sqrt(rv + 1e-5), 1e-12);
  EXPECT_LOOM_ERROR(bn.forward(ones({2, 2}, kFloat64)), ShapeError, {"BatchNorm2d", "[2, 2]"});
}

TEST(Layers, DropoutIsIdentityInEval) {
  Dropout d(0.5);
  Tensor x = ones({1000});
  Tensor y = d.forward(x);
  int zeros_seen = 0;
  for (double v : y.to_vector<double>()) {
    EXPECT_TRUE(v == 0.0 || v == 2.0);
    zeros_seen += v == 0.0;
  }
  EXPECT_GT(zeros_seen, 400);
  EXPECT_LT(zeros_seen, 600);
  d.eval();
  EXPECT_TRUE(tensors_close(d.forward(x), x, 0, 0));
}

TEST(Layers, SequentialChainsAndIndexes) {
  Sequential seq{make<Linear>(4, 3), make<ReLU>(), make<Linear>(3, 2)};
  EXPECT_EQ(seq.size(), 3);
  EXPECT_EQ(seq.forward(ones({5, 4})).sizes(), (Shape{5, 2}));
  EXPECT_EQ(seq[1]->type_name(), "ReLU");
  EXPECT_LOOM_ERROR(seq[3], IndexError, {"Sequential", "3"});
  EXPECT_EQ(keys(seq.state_dict()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
}

TEST(Layers, LossModulesMatchTheOps) {
  manual_seed(2);
  Tensor logits = randn({6, 4}, kFloat64);
  Tensor target = tensor<int64_t>({0, 1, 2, 3, 1, 0}, {6});
  CrossEntropyLoss ce({Reduction::Mean, -100, 0.1});
  EXPECT_TRUE(tensors_close(ce(logits, target),
                            cross_entropy(logits, target, Reduction::Mean, -100, 0.1), 0, 0));
  MSELoss mse;
  EXPECT_TRUE(tensors_close(mse(logits, zeros({6, 4}, kFloat64)), mean(logits * logits), 1e-12));
}

TEST(ResNet, Resnet18HasTorchvisionsKeysAndSize) {
  auto model = resnet18({.num_classes = 10});
  const NamedTensors state = model->state_dict();
  EXPECT_EQ(state.size(), 122u);  // torchvision's resnet18().state_dict() has 122 entries
  const std::vector<std::string> k = keys(state);
  for (const char* key :
       {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
        "layer1.1.bn2.bias", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
        "layer4.1.conv2.weight", "fc.weight", "fc.bias"})
    EXPECT_NE(std::find(k.begin(), k.end(), key), k.end()) << key;
  EXPECT_EQ(k.front(), "conv1.weight");
  EXPECT_EQ(k.back(), "fc.bias");
  // 11,181,642 parameters with the 7x7 stem and 10 classes; the 3x3 stem saves 9408 - 1728.
  EXPECT_EQ(model->num_parameters(), 11173962);
  EXPECT_EQ(resnet18({.num_classes = 10, .cifar_stem = false})->num_parameters(), 11181642);
  // ResNet-34 at width 16 (full width: 21,797,672 with the ImageNet stem and 1000 classes, as
  // torchvision's; too slow to initialise in a unit test). Counts from tools/torch_resnet.py.
  auto r34 = resnet34({.width = 16});
  EXPECT_EQ(r34->state_dict().size(), 218u);
  EXPECT_EQ(r34->num_parameters(), 1334618);
}

TEST(ResNet, ForwardShapesAndGradientsReachEveryParameter) {
  manual_seed(0);
  auto model = resnet18({.width = 4, .in_channels = 1, .num_classes = 7});
  Tensor x = randn({2, 1, 16, 16});
  Tensor logits = model->forward(x);
  EXPECT_EQ(logits.sizes(), (Shape{2, 7}));
  cross_entropy(logits, tensor<int64_t>({3, 5}, {2})).backward();
  for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  EXPECT_LOOM_ERROR(model->forward(randn({2, 3, 16, 16})), ShapeError,
                    {"resnet18", "[2, 3, 16, 16]"});
  auto imagenet = resnet18({.width = 4, .num_classes = 5, .cifar_stem = false});
  EXPECT_EQ(imagenet->forward(randn({1, 3, 64, 64})).sizes(), (Shape{1, 5}));
  EXPECT_LOOM_ERROR(ResNet({.depth = 50}), ValueError, {"ResNet", "50"});
}

TEST(ResNet, InitialisationFollowsTorchvision) {
  manual_seed(4);
  auto model = resnet18({.width = 16});
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out * 3 * 3)) for layer3's convs.
  const Tensor w = model->layer3->named_children()[1].second->named_parameters()[0].second;
  ASSERT_EQ(w.sizes(), (Shape{64, 64, 3, 3}));
  double sq = 0;
  for (double v : w.to_vector<double>()) sq += v * v;
  const double expected_var = 2.0 / (64 * 9);
  EXPECT_NEAR(sq / static_cast<double>(w.numel()), expected_var, 0.05 * expected_var);
  EXPECT_TRUE(test::values_are(model->bn1->weight, std::vector<double>(16, 1.0)));
  auto zero_res = resnet18({.width = 4, .zero_init_residual = true});
  const auto& block = static_cast<BasicBlock&>(*zero_res->layer1->named_children()[0].second);
  EXPECT_TRUE(test::values_are(block.bn2->weight, std::vector<double>(4, 0.0)));
}

TEST(ResNet, SafetensorsRoundTripGivesTheSameLogits) {
  manual_seed(6);
  auto a = resnet18({.width = 4});
  auto b = resnet18({.width = 4});
  a->eval();
  b->eval();
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("resnet.safetensors");
  save_safetensors(path, a->state_dict());
  SafetensorsFile file = load_safetensors(path);
  b->load_state_dict(file.tensors);
  Tensor x = randn({2, 3, 32, 32});
  EXPECT_TRUE(tensors_close(b->forward(x), a->forward(x), 0, 0));
}

}  // namespace
}  // namespace loom::nn
