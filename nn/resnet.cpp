// nn/resnet.cpp — BasicBlock and ResNet: construction with torchvision's layout and
// initialisation, and the forward pass.

#include "nn/resnet.h"

#include <array>

#include "autograd/ops.h"
#include "nn/init.h"

namespace loom::nn {

namespace {
Conv2dOptions conv_options(int64_t stride, int64_t padding) {
  Conv2dOptions o;
  o.stride = {stride, stride};
  o.padding = {padding, padding};
  o.bias = false;
  return o;
}
}  // namespace

BasicBlock::BasicBlock(int64_t in, int64_t channels, int64_t stride, bool fuse)
    : Module("BasicBlock"), fuse_bn_relu(fuse) {
  conv1 = register_module("conv1", make<Conv2d>(in, channels, 3, conv_options(stride, 1)));
  bn1 = register_module("bn1", make<BatchNorm2d>(channels));
  relu = register_module("relu", make<ReLU>());
  conv2 = register_module("conv2", make<Conv2d>(channels, channels, 3, conv_options(1, 1)));
  bn2 = register_module("bn2", make<BatchNorm2d>(channels));
  if (stride != 1 || in != channels)
    downsample = register_module(
        "downsample",
        std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
            make<Conv2d>(in, channels, 1, conv_options(stride, 0)), make<BatchNorm2d>(channels)}));
}

Tensor BasicBlock::forward(const Tensor& x) {
  // torchvision's order: the main branch up to conv2, then the shortcut.
  if (fuse_bn_relu) {
    const Tensor out = conv2->forward(bn1->forward_relu(conv1->forward(x)));
    const Tensor identity = downsample ? downsample->forward(x) : x;
    return bn2->forward_relu(out, identity);
  }
  Tensor out = relu->forward(bn1->forward(conv1->forward(x)));
  out = bn2->forward(conv2->forward(out));
  const Tensor identity = downsample ? downsample->forward(x) : x;
  return relu->forward(out + identity);
}

ResNet::ResNet(ResNetOptions opt) : Module("ResNet"), options(opt) {
  LOOM_CHECK(opt.depth == 18 || opt.depth == 34, ValueError,
             "ResNet: depth must be 18 or 34 (BasicBlock ResNets); got ", opt.depth);
  LOOM_CHECK(opt.width > 0 && opt.in_channels > 0 && opt.num_classes > 0, ValueError,
             "ResNet: width, in_channels and num_classes must be positive; got width=", opt.width,
             " in_channels=", opt.in_channels, " num_classes=", opt.num_classes);
  const int64_t w = opt.width;
  conv1 = register_module("conv1", opt.cifar_stem
                                       ? make<Conv2d>(opt.in_channels, w, 3, conv_options(1, 1))
                                       : make<Conv2d>(opt.in_channels, w, 7, conv_options(2, 3)));
  bn1 = register_module("bn1", make<BatchNorm2d>(w));
  relu = register_module("relu", make<ReLU>());
  maxpool = opt.cifar_stem
                ? register_module("maxpool", ModulePtr(make<Identity>()))
                : register_module("maxpool",
                                  ModulePtr(make<MaxPool2d>(Pair{3, 3}, Pair{2, 2}, Pair{1, 1})));
  const std::array<int, 4> blocks =
      opt.depth == 18 ? std::array<int, 4>{2, 2, 2, 2} : std::array<int, 4>{3, 4, 6, 3};
  int64_t in = w;
  std::array<std::shared_ptr<Sequential>*, 4> stages = {&layer1, &layer2, &layer3, &layer4};
  for (int s = 0; s < 4; ++s) {
    const int64_t channels = w << s;
    auto stage = std::make_shared<Sequential>();
    for (int b = 0; b < blocks[s]; ++b) {
      stage->push_back(make<BasicBlock>(in, channels, (b == 0 && s > 0) ? 2 : 1, opt.fuse_bn_relu));
      in = channels;
    }
    *stages[s] = register_module("layer" + std::to_string(s + 1), stage);
  }
  avgpool = register_module("avgpool", make<AdaptiveAvgPool2d>(Pair{1, 1}));
  fc = register_module("fc", make<Linear>(in, opt.num_classes));

  // torchvision's initialisation: convs kaiming-normal for fan_out and relu; batch norms 1, 0.
  apply([&](Module& m) {
    if (auto* conv = dynamic_cast<Conv2d*>(&m))
      init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");
    else if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
      init::ones_(bn->weight);
      init::zeros_(bn->bias);
    }
  });
  if (opt.zero_init_residual)
    for (auto* stage : stages)
      for (const auto& [name, block] : (*stage)->named_children())
        init::zeros_(static_cast<BasicBlock&>(*block).bn2->weight);
}

Tensor ResNet::forward(const Tensor& x) {
  LOOM_CHECK(x.dim() == 4 && x.size(1) == options.in_channels, ShapeError, name(),
             ": expected input [N, ", options.in_channels, ", H, W]; got x=", x.sizes());
  const Tensor stem = options.fuse_bn_relu ? bn1->forward_relu(conv1->forward(x))
                                           : relu->forward(bn1->forward(conv1->forward(x)));
  Tensor y = maxpool->forward(stem);
  y = (*layer4)((*layer3)((*layer2)((*layer1)(y))));  // through the hooks (Module::operator())
  return fc->forward(avgpool->forward(y).flatten(1));
}

std::shared_ptr<ResNet> resnet18(ResNetOptions options) {
  options.depth = 18;
  return std::make_shared<ResNet>(options);
}

std::shared_ptr<ResNet> resnet34(ResNetOptions options) {
  options.depth = 34;
  return std::make_shared<ResNet>(options);
}

}  // namespace loom::nn
