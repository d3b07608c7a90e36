// autograd/ops/bodies.h — the bodies of the ops whose dtype autocast decides: each computes its
// op in the dtypes its operands arrive in. The entries callers use (the functions of
// autograd/ops/*.h) are defined in autograd/autocast_ops.cpp, where each applies its rule of
// Note [Autocast policy] and calls its body here. Private to autograd/: only
// autograd/autocast_ops.cpp and autograd/ops/*.cpp include it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/conv.h"  // Pair
#include "tensor/loss.h"        // Reduction
#include "tensor/norm.h"        // kernels::BatchNormEpilogue
#include "tensor/tensor.h"

namespace loom {

// Two steps of public ops carry a rule of their own. Their entries are defined with the others
// in autograd/autocast_ops.cpp and declared here, for autograd/ops/ alone.
// matmul's 2-D case: a [M,K] @ b [K,N]
Tensor mm(const Tensor& a, const Tensor& b);
// batch_norm, and batch_norm_relu where the residual can be fused (`op` names the error's op)
Tensor batch_norm_with(const char* op, const Tensor& x, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                       bool training, double momentum, double eps,
                       const kernels::BatchNormEpilogue& epilogue);

}  // namespace loom

namespace loom::ops_impl {

// autograd/ops/attention.cpp
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale);

// autograd/ops/elementwise.cpp
Tensor add(const Tensor& a, const Tensor& b, double alpha);
Tensor sub(const Tensor& a, const Tensor& b, double alpha);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, const std::string& approximate);
Tensor clamp(const Tensor& x, double min, double max);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, double b);  // a + b
Tensor mul_scalar(const Tensor& a, double b);  // a * b
Tensor div_scalar(const Tensor& a, double b);  // a / b
Tensor scalar_div(double b, const Tensor& x);  // b / x

// autograd/ops/linalg.cpp
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, double beta, double alpha);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// autograd/ops/conv.cpp
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding,
              Pair dilation, int64_t groups);
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                  bool ceil_mode);
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool ceil_mode,
                  bool count_include_pad);
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

// autograd/ops/loss.cpp
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                     int64_t ignore_index, double label_smoothing);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                Reduction reduction, int64_t ignore_index);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction);

// autograd/ops/norm.cpp
Tensor batch_norm_with(const char* op, const Tensor& x, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                       bool training, double momentum, double eps,
                       const kernels::BatchNormEpilogue& epilogue);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps);

// autograd/ops/reduce.cpp
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim);
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim);
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim);
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim);
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim);
Tensor var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim);
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim);

// autograd/ops/index.cpp
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor dropout(const Tensor& x, double p, bool training);

}  // namespace loom::ops_impl
