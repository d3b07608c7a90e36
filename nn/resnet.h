// nn/resnet.h — ResNet-18 and ResNet-34 (BasicBlock ResNets) with torchvision's structure and
// key names ("layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "fc.bias"), so weights
// move between loom and PyTorch through safetensors unchanged.
//
// Two stems: the ImageNet one (7x7 stride-2 conv, then 3x3 stride-2 max-pool) and the CIFAR one
// (3x3 stride-1 conv, no max-pool: 32x32 images keep their resolution into layer1). The CIFAR
// form keeps a `maxpool` child as an Identity, so both forms have the same keys. `width` scales
// every stage (64, 128, 256, 512 by default): width 16 trains Fashion-MNIST in minutes on a CPU.
#pragma once

#include <memory>
#include <string>

#include "nn/layers.h"

namespace loom::nn {

// conv3x3 - bn - relu - conv3x3 - bn, plus the input (through a 1x1 conv and bn where the shape
// changes), then relu. With fuse_bn_relu each batch norm applies the ReLU (and the add) that
// follows it as it writes its output (BatchNorm2d::forward_relu); the `relu` child stays, unused
// then, so the module tree and its keys are the same either way.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t channels, int64_t stride, bool fuse_bn_relu = true);
  Tensor forward(const Tensor& x) override;

  const bool fuse_bn_relu;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;  // null when the shapes already match
};

struct ResNetOptions {
  int depth = 18;           // 18 or 34
  int64_t width = 64;       // channels of the first stage; later stages double it
  int64_t in_channels = 3;  // 1 for Fashion-MNIST
  int64_t num_classes = 10;
  bool cifar_stem = true;           // false: the ImageNet stem
  bool zero_init_residual = false;  // each block's last bn starts at weight 0 (torchvision's flag)
  // Batch norms apply the ReLU (and residual add) after them in one op, Note [Batch norm with
  // ReLU] in tensor/norm.h. false: the ops one by one, as torchvision's forward.
  bool fuse_bn_relu = true;
};

class ResNet : public Module {
 public:
  explicit ResNet(ResNetOptions options);
  Tensor forward(const Tensor& x) override;  // x [N, in_channels, H, W] -> logits [N, classes]
  // "resnet18" or "resnet34".
  std::string name() const { return "resnet" + std::to_string(options.depth); }

  const ResNetOptions options;
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  ModulePtr maxpool;
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;
};

std::shared_ptr<ResNet> resnet18(ResNetOptions options = {});
std::shared_ptr<ResNet> resnet34(ResNetOptions options = {});

}  // namespace loom::nn
