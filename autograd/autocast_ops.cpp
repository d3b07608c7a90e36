// autograd/autocast_ops.cpp — Note [Autocast policy] applied: the entries of every op whose
// dtype autocast decides, grouped by the table's classes. Each entry casts the operands its
// rule names and calls the op's body (autograd/ops/bodies.h); operands no rule names (indices,
// a condition, a target) pass as they are. Ops that call other ops call these entries, so each
// op's rule holds wherever it is called from.

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "autograd/ops/bodies.h"

namespace loom {

namespace {

// A rule of the table, decided for one call from the operands it reads: cast(t) is t as the
// op's body takes it, cast where the rule applies (an operand only as far as it needs: float64,
// integer and bool tensors never change), as it is otherwise.
class Rule {
 public:
  Tensor operator()(const Tensor& t) const {
    if (!applies_) return t;
    return to_low_ ? autocast::to_low(t) : autocast::to_float32(t);
  }

 protected:
  Rule(bool applies, bool to_low) : applies_(applies), to_low_(to_low) {}
  const bool applies_;
  const bool to_low_;
};

// Low precision: where an operand is float32 (or of the other 16-bit type), each such operand
// is cast to the region's dtype.
struct LowPrecision : Rule {
  LowPrecision(std::initializer_list<Tensor> operands)
      : Rule(autocast::needs_low(operands), /*to_low=*/true) {}
  using Rule::operator();
  // Cast straight into `format` (conv2d's weight into its input's: Note [The cast cache]).
  Tensor operator()(const Tensor& t, MemoryFormat format) const {
    return applies_ ? autocast::to_low(t, format) : t;
  }
};

// Float32: where an operand is 16-bit, each 16-bit operand is widened.
struct Float32 : Rule {
  Float32(std::initializer_list<Tensor> operands)
      : Rule(autocast::needs_float32(operands), /*to_low=*/false) {}
};

// As is, on the CPU: where an operand is a 16-bit CPU tensor, each 16-bit operand is widened (a
// 16-bit CUDA tensor alone keeps its dtype).
struct WidenOnCpu : Rule {
  WidenOnCpu(std::initializer_list<Tensor> operands)
      : Rule(autocast::widens_on_cpu(operands), /*to_low=*/false) {}
};

// batch_norm's: x keeps its dtype beside float32 parameters and statistics. Every operand is
// widened where a parameter or statistic is 16-bit, or where x is a float16 CPU tensor (the CPU
// loops read and write a bfloat16 x as it is: Note [Batch norm on bfloat16]).
struct BatchNormRule : Rule {
  BatchNormRule(const Tensor& x, std::initializer_list<Tensor> parameters_and_statistics)
      : Rule(autocast::needs_float32(parameters_and_statistics) ||
                 (x.defined() && x.dtype() != kBFloat16 && autocast::widens_on_cpu({x})),
             /*to_low=*/false) {}
};

// cat and stack's: in a region, where the operands' dtypes differ and one of them is 16-bit, the
// 16-bit ones are widened and the join promotes the others as outside a region (float64 stays
// float64). Operands of one dtype are joined as they are.
bool joins_widened(const std::vector<Tensor>& tensors) {
  if (!autocast::is_enabled() || tensors.empty()) return false;
  bool mixed = false, any_16bit = false;
  for (const Tensor& t : tensors) {
    mixed = mixed || t.dtype() != tensors[0].dtype();
    any_16bit = any_16bit || is_16bit_float(t.dtype());
  }
  return mixed && any_16bit;
}

std::vector<Tensor> widened(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(autocast::to_float32(t));
  return out;
}

}  // namespace

// ---------------------------------------------------------------- low precision
// matmul reaches mm or bmm below, each under this rule.

Tensor mm(const Tensor& a, const Tensor& b) {
  const LowPrecision cast{a, b};
  return ops_impl::mm(cast(a), cast(b));
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  const LowPrecision cast{a, b};
  return ops_impl::bmm(cast(a), cast(b));
}

Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, double beta, double alpha) {
  const LowPrecision cast{input, a, b};
  return ops_impl::addmm(cast(input), cast(a), cast(b), beta, alpha);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const LowPrecision cast{x, weight, bias};
  return ops_impl::linear(cast(x), cast(weight), cast(bias));
}

// A float mask is cast with q, k and v (the kernels add it in their dtype); a bool mask passes.
// The kernels keep the softmax statistics in float32 (Note [Fused attention]).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  const LowPrecision cast{q, k, v};
  return ops_impl::scaled_dot_product_attention(cast(q), cast(k), cast(v), cast(attn_mask),
                                                dropout_p, is_causal, scale);
}

// The weight is cast into x's memory format: for a channels-last x, the cached 16-bit weight is
// in the order the NHWC kernels read (Note [The cast cache]).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding,
              Pair dilation, int64_t groups) {
  const LowPrecision cast{x, weight, bias};
  return ops_impl::conv2d(cast(x), cast(weight, suggest_memory_format(x)), cast(bias), stride,
                          padding, dilation, groups);
}

// ---------------------------------------------------------------- float32
// std is sqrt(var(x)) and max(x) is amax(x): each reaches an entry below.

Tensor pow(const Tensor& a, const Tensor& b) {
  const Float32 cast{a, b};
  return ops_impl::pow(cast(a), cast(b));
}

Tensor pow(const Tensor& a, double exponent) {
  const Float32 cast{a};
  return ops_impl::pow(cast(a), exponent);
}

Tensor exp(const Tensor& x) {
  const Float32 cast{x};
  return ops_impl::exp(cast(x));
}

Tensor log(const Tensor& x) {
  const Float32 cast{x};
  return ops_impl::log(cast(x));
}

Tensor sqrt(const Tensor& x) {
  const Float32 cast{x};
  return ops_impl::sqrt(cast(x));
}

Tensor rsqrt(const Tensor& x) {
  const Float32 cast{x};
  return ops_impl::rsqrt(cast(x));
}

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::sum(cast(x), dims, keepdim);
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::mean(cast(x), dims, keepdim);
}

Tensor var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::var(cast(x), dims, unbiased, keepdim);
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::amax(cast(x), dims, keepdim);
}

Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::amin(cast(x), dims, keepdim);
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::max(cast(x), dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::min(cast(x), dim, keepdim);
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::argmax(cast(x), dim, keepdim);
}

Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::argmin(cast(x), dim, keepdim);
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  const Float32 cast{x};
  return ops_impl::logsumexp(cast(x), dims, keepdim);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  const Float32 cast{x};
  return ops_impl::softmax(cast(x), dim);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  const Float32 cast{x};
  return ops_impl::log_softmax(cast(x), dim);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                     int64_t ignore_index, double label_smoothing) {
  const Float32 cast{logits};
  return ops_impl::cross_entropy(cast(logits), target, reduction, ignore_index, label_smoothing);
}

// The class weights are widened with the log-probabilities (the body needs them of one dtype).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                Reduction reduction, int64_t ignore_index) {
  const Float32 cast{log_probs, weight};
  return ops_impl::nll_loss(cast(log_probs), target, cast(weight), reduction, ignore_index);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const Float32 cast{input, target};
  return ops_impl::mse_loss(cast(input), cast(target), reduction);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Float32 cast{x, weight, bias};
  return ops_impl::layer_norm(cast(x), normalized_shape, cast(weight), cast(bias), eps);
}

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                  bool ceil_mode) {
  const Float32 cast{x};
  return ops_impl::max_pool2d(cast(x), kernel, stride, padding, dilation, ceil_mode);
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool ceil_mode,
                  bool count_include_pad) {
  const Float32 cast{x};
  return ops_impl::avg_pool2d(cast(x), kernel, stride, padding, ceil_mode, count_include_pad);
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  const Float32 cast{x};
  return ops_impl::adaptive_avg_pool2d(cast(x), output_size);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  const Float32 cast{x};
  return ops_impl::dropout(cast(x), p, training);
}

// Their backwards add into zeros of x's shape: in float32. The index is never cast.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const Float32 cast{x};
  return ops_impl::index_select(cast(x), dim, index);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const Float32 cast{x};
  return ops_impl::gather(cast(x), dim, index);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const Float32 cast{x, src};
  return ops_impl::scatter_add(cast(x), dim, index, cast(src));
}

// Of different dtypes, one of them 16-bit: in float32 (joins_widened above).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (joins_widened(tensors)) return ops_impl::cat(widened(tensors), dim);
  return ops_impl::cat(tensors, dim);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (joins_widened(tensors)) return ops_impl::stack(widened(tensors), dim);
  return ops_impl::stack(tensors, dim);
}

// ---------------------------------------------------------------- as is (widened on the CPU)
// The comparisons, views, copies, and cat and stack of one dtype have no rule: they do no
// arithmetic. The other scalar operators (a - s, s + a, s - a, s * a) reach the entries below.

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  const WidenOnCpu cast{a, b};
  return ops_impl::add(cast(a), cast(b), alpha);
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  const WidenOnCpu cast{a, b};
  return ops_impl::sub(cast(a), cast(b), alpha);
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const WidenOnCpu cast{a, b};
  return ops_impl::mul(cast(a), cast(b));
}

Tensor div(const Tensor& a, const Tensor& b) {
  const WidenOnCpu cast{a, b};
  return ops_impl::div(cast(a), cast(b));
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  const WidenOnCpu cast{a, b};
  return ops_impl::maximum(cast(a), cast(b));
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  const WidenOnCpu cast{a, b};
  return ops_impl::minimum(cast(a), cast(b));
}

Tensor neg(const Tensor& x) {
  const WidenOnCpu cast{x};
  return ops_impl::neg(cast(x));
}

Tensor abs(const Tensor& x) {
  const WidenOnCpu cast{x};
  return ops_impl::abs(cast(x));
}

Tensor tanh(const Tensor& x) {
  const WidenOnCpu cast{x};
  return ops_impl::tanh(cast(x));
}

Tensor sigmoid(const Tensor& x) {
  const WidenOnCpu cast{x};
  return ops_impl::sigmoid(cast(x));
}

Tensor relu(const Tensor& x) {
  const WidenOnCpu cast{x};
  return ops_impl::relu(cast(x));
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  const WidenOnCpu cast{x};
  return ops_impl::gelu(cast(x), approximate);
}

Tensor clamp(const Tensor& x, double min, double max) {
  const WidenOnCpu cast{x};
  return ops_impl::clamp(cast(x), min, max);
}

// The condition is a bool tensor, read as it is.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const WidenOnCpu cast{a, b};
  return ops_impl::where(condition, cast(a), cast(b));
}

Tensor operator+(const Tensor& a, double b) {
  const WidenOnCpu cast{a};
  return ops_impl::add_scalar(cast(a), b);
}

Tensor operator*(const Tensor& a, double b) {
  const WidenOnCpu cast{a};
  return ops_impl::mul_scalar(cast(a), b);
}

Tensor operator/(const Tensor& a, double b) {
  const WidenOnCpu cast{a};
  return ops_impl::div_scalar(cast(a), b);
}

Tensor operator/(double a, const Tensor& b) {
  const WidenOnCpu cast{b};
  return ops_impl::scalar_div(a, cast(b));
}

// batch_norm, and batch_norm_relu's fused case: the residual is widened with x, but not read by
// the rule (batch_norm_relu fuses it only where it has x's dtype).
Tensor batch_norm_with(const char* op, const Tensor& x, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                       bool training, double momentum, double eps,
                       const kernels::BatchNormEpilogue& epilogue) {
  const BatchNormRule cast(x, {running_mean, running_var, weight, bias});
  return ops_impl::batch_norm_with(op, cast(x), cast(running_mean), cast(running_var), cast(weight),
                                   cast(bias), training, momentum, eps,
                                   {cast(epilogue.residual), epilogue.relu});
}

// SyncBatchNorm's x (dist/sync_batchnorm.cpp): batch_norm's rule for x. Its parameters and
// statistics are not cast: SyncBatchNorm takes them in batch norm's dtype for x only.
Tensor autocast::sync_batch_norm_input(const Tensor& x) {
  const WidenOnCpu cast{x};
  return cast(x);
}

}  // namespace loom
