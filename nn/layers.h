// nn/layers.h — the layers a ResNet, an MLP or a Transformer is built from, with PyTorch's
// parameter names, defaults and initialisation: Linear, Embedding, Conv2d, BatchNorm2d,
// LayerNorm, ReLU, GELU, Dropout, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten, Identity,
// and Sequential to chain them.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "autograd/ops/conv.h"
#include "nn/module.h"

namespace loom::nn {

// y = x W^T + b; weight [out, in], bias [out]. Both uniform in +-1/sqrt(in) (PyTorch's default).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  Tensor weight, bias;
};

// A table of num_embeddings rows of embedding_dim: index [...] -> [..., embedding_dim]. weight
// N(0, 1) as PyTorch's; the row padding_idx (negative counts from the end) starts at zero and
// gets no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& index) override;
  std::string extra_repr() const override;

  const int64_t num_embeddings, embedding_dim;
  const std::optional<int64_t> padding_idx;  // in [0, num_embeddings) once constructed
  Tensor weight;
};

struct Conv2dOptions {
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

// NCHW convolution; weight [out, in/groups, kh, kw], bias [out]. PyTorch's default
// initialisation (kaiming_uniform_ with a = sqrt(5), bias uniform in +-1/sqrt(fan_in)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions options = {});
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions options = {})
      : Conv2d(in_channels, out_channels, Pair{kernel_size, kernel_size}, options) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_channels, out_channels;
  const Pair kernel_size;
  const Conv2dOptions options;
  Tensor weight, bias;
};

class BatchNorm2d;

// The cross-replica half of SyncBatchNorm. nn/ knows nothing of distribution: dist/ supplies
// the implementation (statistics gathered over a process group) and
// dist::convert_sync_batchnorm installs it into a model's BatchNorm2d layers in place.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // The training-mode forward of `bn` on x with statistics over every replica's batch.
  virtual Tensor forward(BatchNorm2d& bn, const Tensor& x) = 0;
};

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) running + momentum batch
  bool affine = true;
  bool track_running_stats = true;
};

// Batch normalisation over N, H, W per channel. Training: batch statistics, and the running
// mean and (unbiased) variance updated in place, num_batches_tracked counted. Eval: the running
// statistics (or the batch's, when track_running_stats is off). With a BatchNormSync installed
// (set_sync) the training statistics are those of every replica's batch together, and the
// module prints as SyncBatchNorm.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  // relu(forward(x) + residual) (residual optional) in one op, batch_norm_relu; a
  // SyncBatchNorm runs its forward, the add and the ReLU one by one.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = Tensor());
  std::string extra_repr() const override;
  void set_sync(std::shared_ptr<BatchNormSync> sync);
  bool is_sync() const { return sync_ != nullptr; }

  const int64_t num_features;
  const BatchNormOptions options;
  Tensor weight, bias;                                    // [C], when affine
  Tensor running_mean, running_var, num_batches_tracked;  // when track_running_stats

 private:
  Tensor normalise(const Tensor& x, bool relu, const Tensor& residual);
  std::shared_ptr<BatchNormSync> sync_;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // a weight (ones) and a bias (zeros) of normalized_shape
  bool bias = true;                // with elementwise_affine: false leaves the bias out
};

// Normalises over the trailing dims normalized_shape, with statistics in float32 or wider
// (Note [Autocast policy]); PyTorch's nn.LayerNorm.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  explicit LayerNorm(int64_t normalized_size, LayerNormOptions options = {})
      : LayerNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Shape normalized_shape;
  const LayerNormOptions options;
  Tensor weight, bias;  // undefined without elementwise_affine (bias: without options.bias)
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const std::string approximate;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;  // identity in eval mode
  std::string extra_repr() const override;
  const double p;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Pair kernel_size, Pair stride = {0, 0}, Pair padding = {0, 0});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Pair kernel_size, stride, padding;  // stride {0, 0}: the kernel size
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pair kernel_size, Pair stride = {0, 0}, Pair padding = {0, 0});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Pair kernel_size, stride, padding;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Pair output_size;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const int64_t start_dim, end_dim;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

// Children named "0", "1", ... run in order.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  void push_back(ModulePtr module);
  int64_t size() const { return static_cast<int64_t>(named_children().size()); }
  ModulePtr operator[](int64_t index) const;  // IndexError out of range
  Tensor forward(const Tensor& x) override;
};

}  // namespace loom::nn
