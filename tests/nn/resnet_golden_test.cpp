// tests/nn/resnet_golden_test.cpp — weights cross between loom and PyTorch unchanged.
// PyTorch -> loom: tests/golden/resnet18_cifar_w4.safetensors (tools/make_resnet_golden.py) holds a
// PyTorch ResNet-18's state dict with torchvision's keys, an input and PyTorch's logits; loom
// loads it strictly and must give the same logits. loom -> PyTorch: loom saves its weights, an
// input and its logits, and tools/check_resnet_logits.py rebuilds the model in PyTorch and
// compares (where a Python with torch was found at configure time; skipped otherwise).

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "scratch_dir.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

NamedTensors without_golden(const NamedTensors& all) {
  NamedTensors out;
  for (const auto& [name, t] : all)
    if (name.rfind("golden.", 0) != 0) out.emplace_back(name, t);
  return out;
}

TEST(ResNetGolden, PyTorchWeightsGivePyTorchsLogits) {
  const SafetensorsFile file =
      load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/resnet18_cifar_w4.safetensors");
  EXPECT_EQ(file.metadata.at("model"), "resnet18");
  auto model = resnet18({.width = 4, .in_channels = 3, .num_classes = 10});
  model->load_state_dict(without_golden(file.tensors));  // strict: every key matches
  const Tensor x = file.at("golden.input");

  model->eval();
  {
    autograd::NoGradGuard no_grad;
    EXPECT_TRUE(tensors_close(model->forward(x), file.at("golden.logits_eval"), 1e-4, 1e-5));
  }
  model->train();  // batch statistics
  EXPECT_TRUE(tensors_close(model->forward(x), file.at("golden.logits_train"), 1e-4, 1e-5));
}

TEST(ResNetGolden, LoomWeightsGiveLoomsLogitsInPyTorch) {
  const std::string python = LOOM_TORCH_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python with PyTorch was found at configure time";
  manual_seed(11);
  auto model = resnet18({.width = 4, .in_channels = 3, .num_classes = 10});
  for (int i = 0; i < 2; ++i) model->forward(randn({4, 3, 32, 32}));  // move the running stats
  model->eval();
  const Tensor x = randn({3, 3, 32, 32});
  Tensor logits;
  {
    autograd::NoGradGuard no_grad;
    logits = model->forward(x);
  }
  NamedTensors tensors = model->state_dict();
  tensors.emplace_back("golden.input", x);
  tensors.emplace_back("golden.logits_eval", logits);
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("resnet_to_torch.safetensors");
  save_safetensors(path, tensors,
                   {{"depth", "18"},
                    {"width", "4"},
                    {"in_channels", "3"},
                    {"num_classes", "10"},
                    {"stem", "cifar"}});
  const std::string command =
      python + " " + LOOM_SOURCE_DIR + "/tools/check_resnet_logits.py " + path;
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command;
}

}  // namespace
}  // namespace loom::nn
