// nn/layers.cpp — the layers of nn/layers.h: construction (shapes, PyTorch's default
// initialisation), forward through the differentiable ops, and PyTorch's printed form.

#include "nn/layers.h"

#include <cmath>

#include "autograd/graph.h"
#include "autograd/ops.h"
#include "nn/init.h"
#include "tensor/elementwise.h"

namespace loom::nn {

namespace {

std::string pair_str(Pair p) { return detail::str("(", p[0], ", ", p[1], ")"); }
const char* bool_str(bool b) { return b ? "True" : "False"; }

void check_positive(const char* layer, const char* what, int64_t value) {
  LOOM_CHECK(value > 0, ValueError, layer, ": ", what, " must be positive; got ", value);
}

// PyTorch's default for Linear and Conv2d: kaiming_uniform_(a = sqrt(5)) for the weight, which
// is uniform in +-1/sqrt(fan_in), and the bias uniform in +-1/sqrt(fan_in).
void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(init::fans(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}

}  // namespace

// ------------------------------------------------------------------ Linear

Linear::Linear(int64_t in, int64_t out, bool with_bias)
    : Module("Linear"), in_features(in), out_features(out) {
  check_positive("Linear", "in_features", in);
  check_positive("Linear", "out_features", out);
  weight = register_parameter("weight", empty({out, in}));
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());
  default_init(weight, bias);
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::extra_repr() const {
  return detail::str("in_features=", in_features, ", out_features=", out_features,
                     ", bias=", bool_str(bias.defined()));
}

// ------------------------------------------------------------------ Embedding

namespace {

// The checked sizes' padding_idx, wrapped into [0, rows) as PyTorch wraps a negative one.
std::optional<int64_t> checked_padding_idx(int64_t rows, int64_t dim,
                                           std::optional<int64_t> padding_idx) {
  check_positive("Embedding", "num_embeddings", rows);
  check_positive("Embedding", "embedding_dim", dim);
  if (!padding_idx) return std::nullopt;
  const int64_t p = *padding_idx;
  LOOM_CHECK(p >= -rows && p < rows, ValueError, "Embedding: padding_idx must be in [", -rows, ", ",
             rows, ") for ", rows, " embeddings; got ", p);
  return p < 0 ? p + rows : p;
}

}  // namespace

Embedding::Embedding(int64_t rows, int64_t dim, std::optional<int64_t> padding)
    : Module("Embedding"),
      num_embeddings(rows),
      embedding_dim(dim),
      padding_idx(checked_padding_idx(rows, dim, padding)) {
  weight = register_parameter("weight", empty({rows, dim}));
  init::normal_(weight);
  if (padding_idx) {
    autograd::NoGradGuard no_grad;
    weight.select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& index) {
  return embedding(weight, index, padding_idx.value_or(-1));
}

std::string Embedding::extra_repr() const {
  std::string s = detail::str(num_embeddings, ", ", embedding_dim);
  if (padding_idx) s += detail::str(", padding_idx=", *padding_idx);
  return s;
}

// ------------------------------------------------------------------ Conv2d

Conv2d::Conv2d(int64_t in, int64_t out, Pair kernel, Conv2dOptions opt)
    : Module("Conv2d"), in_channels(in), out_channels(out), kernel_size(kernel), options(opt) {
  check_positive("Conv2d", "in_channels", in);
  check_positive("Conv2d", "out_channels", out);
  check_positive("Conv2d", "groups", opt.groups);
  LOOM_CHECK(in % opt.groups == 0 && out % opt.groups == 0, ValueError, "Conv2d: in_channels (", in,
             ") and out_channels (", out, ") must be divisible by groups (", opt.groups, ")");
  check_positive("Conv2d", "kernel height", kernel[0]);
  check_positive("Conv2d", "kernel width", kernel[1]);
  weight = register_parameter("weight", empty({out, in / opt.groups, kernel[0], kernel[1]}));
  bias = register_parameter("bias", opt.bias ? empty({out}) : Tensor());
  default_init(weight, bias);
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

std::string Conv2d::extra_repr() const {
  std::string s =
      detail::str(in_channels, ", ", out_channels, ", kernel_size=", pair_str(kernel_size),
                  ", stride=", pair_str(options.stride));
  if (options.padding != Pair{0, 0}) s += ", padding=" + pair_str(options.padding);
  if (options.dilation != Pair{1, 1}) s += ", dilation=" + pair_str(options.dilation);
  if (options.groups != 1) s += detail::str(", groups=", options.groups);
  if (!options.bias) s += ", bias=False";
  return s;
}

// ------------------------------------------------------------------ BatchNorm2d

BatchNorm2d::BatchNorm2d(int64_t c, BatchNormOptions opt)
    : Module("BatchNorm2d"), num_features(c), options(opt) {
  check_positive("BatchNorm2d", "num_features", c);
  LOOM_CHECK(opt.eps > 0, ValueError, "BatchNorm2d: eps must be positive; got ", opt.eps);
  if (opt.affine) {
    weight = register_parameter("weight", ones({c}));
    bias = register_parameter("bias", zeros({c}));
  }
  if (opt.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) { return normalise(x, false, Tensor()); }

Tensor BatchNorm2d::forward_relu(const Tensor& x, const Tensor& residual) {
  return normalise(x, true, residual);
}

Tensor BatchNorm2d::normalise(const Tensor& x, bool relu, const Tensor& residual) {
  LOOM_CHECK(x.dim() == 4, ShapeError,
             "BatchNorm2d: expected a 4-D input [N, C, H, W]; got x=", x.sizes());
  const bool use_batch_stats = is_training() || !options.track_running_stats;
  if (is_training() && options.track_running_stats) {
    autograd::NoGradGuard no_grad;
    kernels::add_scalar_(num_batches_tracked, 1.0);
  }
  if (sync_ && is_training()) {
    const Tensor y = sync_->forward(*this, x);
    if (!relu) return y;
    return loom::relu(residual.defined() ? y + residual : y);
  }
  if (!relu)
    return batch_norm(x, running_mean, running_var, weight, bias, use_batch_stats, options.momentum,
                      options.eps);
  return batch_norm_relu(x, running_mean, running_var, weight, bias, use_batch_stats,
                         options.momentum, options.eps, residual);
}

void BatchNorm2d::set_sync(std::shared_ptr<BatchNormSync> sync) {
  sync_ = std::move(sync);
  set_type_name(sync_ ? "SyncBatchNorm" : "BatchNorm2d");
}

std::string BatchNorm2d::extra_repr() const {
  return detail::str(num_features, ", eps=", options.eps, ", momentum=", options.momentum,
                     ", affine=", bool_str(options.affine),
                     ", track_running_stats=", bool_str(options.track_running_stats));
}

// ------------------------------------------------------------------ LayerNorm

LayerNorm::LayerNorm(Shape shape, LayerNormOptions opt)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), options(opt) {
  LOOM_CHECK(!normalized_shape.empty(), ValueError,
             "LayerNorm: normalized_shape must name at least one dim");
  for (int64_t size : normalized_shape) check_positive("LayerNorm", "each normalized size", size);
  LOOM_CHECK(opt.eps > 0, ValueError, "LayerNorm: eps must be positive; got ", opt.eps);
  if (opt.elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", opt.bias ? zeros(normalized_shape) : Tensor());
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape, weight, bias, options.eps);
}

std::string LayerNorm::extra_repr() const {
  std::string shape = "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i)
    shape += detail::str(normalized_shape[i], normalized_shape.size() == 1 ? "," : "",
                         i + 1 < normalized_shape.size() ? ", " : "");
  return detail::str(shape, "), eps=", options.eps,
                     ", elementwise_affine=", bool_str(options.elementwise_affine));
}

// ------------------------------------------------------------------ activations, dropout

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

GELU::GELU(std::string approx) : Module("GELU"), approximate(std::move(approx)) {
  LOOM_CHECK(approximate == "none" || approximate == "tanh", ValueError,
             "GELU: approximate must be 'none' or 'tanh'; got '", approximate, "'");
}
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
std::string GELU::extra_repr() const {
  return approximate == "none" ? "" : "approximate='" + approximate + "'";
}

Dropout::Dropout(double prob) : Module("Dropout"), p(prob) {
  LOOM_CHECK(p >= 0 && p <= 1, ValueError, "Dropout: p must be in [0, 1]; got ", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }
std::string Dropout::extra_repr() const { return detail::str("p=", p, ", inplace=False"); }

// ------------------------------------------------------------------ pooling, shape

MaxPool2d::MaxPool2d(Pair k, Pair s, Pair pad)
    : Module("MaxPool2d"), kernel_size(k), stride(s == Pair{0, 0} ? k : s), padding(pad) {}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_size, stride, padding); }
std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(stride) +
         ", padding=" + pair_str(padding);
}

AvgPool2d::AvgPool2d(Pair k, Pair s, Pair pad)
    : Module("AvgPool2d"), kernel_size(k), stride(s == Pair{0, 0} ? k : s), padding(pad) {}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, kernel_size, stride, padding); }
std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(stride) +
         ", padding=" + pair_str(padding);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Pair out) : Module("AdaptiveAvgPool2d"), output_size(out) {}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }
std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(output_size); }

Flatten::Flatten(int64_t start, int64_t end) : Module("Flatten"), start_dim(start), end_dim(end) {}
Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim, end_dim); }
std::string Flatten::extra_repr() const {
  return detail::str("start_dim=", start_dim, ", end_dim=", end_dim);
}

// ------------------------------------------------------------------ Sequential

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (const ModulePtr& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr module) {
  register_module(std::to_string(named_children().size()), std::move(module));
}

ModulePtr Sequential::operator[](int64_t index) const {
  LOOM_CHECK(index >= 0 && index < size(), IndexError, "Sequential: index ", index,
             " is out of range for ", size(), " modules");
  return named_children()[static_cast<size_t>(index)].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& [name, m] : named_children()) y = (*m)(y);
  return y;
}

}  // namespace loom::nn
