// autograd/ops/norm.cpp — batch_norm and layer_norm: the argument checks, the fused kernels of
// tensor/norm.h, and each backward right below its forward.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/norm.h"

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "autograd/ops/elementwise.h"
#include "tensor/copy.h"
#include "tensor/norm.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

namespace {

// A defined `param` must have `shape` and `dtype` (x's, or float32 for a batch norm's 16-bit x).
void check_param(const char* op, const char* name, const Tensor& param, const Shape& shape,
                 const char* what, const Tensor& x, DType dtype) {
  if (!param.defined()) return;
  LOOM_CHECK(param.sizes() == shape, ShapeError, op, ": expected ", name, " of shape ", shape, " (",
             what, " of x=", x.sizes(), "); got ", name, "=", param.sizes());
  LOOM_CHECK(param.dtype() == dtype, DTypeError, op, ": expected ", name, " of dtype ", dtype,
             " for x of dtype ", x.dtype(), "; got ", param.dtype(), " (", name, "=", param.sizes(),
             ")");
}

}  // namespace

// d batch_norm (training, through the batch statistics; Note [Batch norm pieces]):
//   dx = weight invstd (dy - mean(dy) - x_hat mean(dy x_hat)); eval: dx = weight invstd dy;
//   dweight = sum(dy x_hat) ; dbias = sum(dy)
// With the epilogue of batch_norm_relu, dy is first masked where y is 0 (relu_backward), and the
// residual's gradient is that masked dy (Note [Batch norm with ReLU], tensor/norm.h).
// A 16-bit x keeps its dtype (y and dx too) with float32 parameters and statistics (in a region,
// x arrives widened where it is a CPU tensor or the parameters are 16-bit: Note [Autocast
// policy]).
Tensor ops_impl::batch_norm_with(const char* op, const Tensor& x, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& weight,
                                 const Tensor& bias, bool training, double momentum, double eps,
                                 const k::BatchNormEpilogue& epilogue) {
  LOOM_CHECK(x.dim() >= 2, ShapeError, op, ": expected x of shape [N, C, ...]; got x=", x.sizes());
  const Shape channels{x.size(1)};
  const DType pd = k::batch_norm_param_dtype(x.dtype());
  check_param(op, "weight", weight, channels, "one per channel", x, pd);
  check_param(op, "bias", bias, channels, "one per channel", x, pd);
  check_param(op, "running_mean", running_mean, channels, "one per channel", x, pd);
  check_param(op, "running_var", running_var, channels, "one per channel", x, pd);
  LOOM_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
             ": give both running_mean and running_var, or neither");

  Tensor y, mean, invstd;
  if (training) {
    LOOM_CHECK(x.numel() / std::max<int64_t>(x.size(1), 1) > 1, ValueError, op,
               ": expected more than 1 value per channel when training; got x=", x.sizes());
    auto [out, stats] = k::batch_norm_forward_train(x, weight, bias, eps, epilogue);
    if (running_mean.defined()) {
      NoGradGuard no_grad;
      k::batch_norm_update_running_stats_(running_mean, running_var, stats, momentum);
    }
    y = out;
    mean = stats.mean;
    invstd = stats.invstd;
  } else {
    LOOM_CHECK(running_mean.defined(), ValueError, op,
               ": eval mode normalises with running_mean and running_var; got neither (x=",
               x.sizes(), ")");
    // Copies: the backward must see the statistics used here, whatever later updates do.
    mean = k::clone(running_mean);
    invstd = k::batch_norm_invstd(running_var, eps);
    y = k::batch_norm_elemt(x, mean, invstd, weight, bias, epilogue);
  }
  // The output saved for the ReLU's mask is y itself: the next layer keeps it anyway.
  const bool relu = epilogue.relu;
  return record(
      op, y, {x, weight, bias, epilogue.residual}, {x, weight, mean, invstd, relu ? y : Tensor()},
      [training, relu](const Grads& dout, Saved& s, Grads& g) {
        k::NormGrads r = k::batch_norm_backward(dout[0], s[0], s[2], s[3], s[1], training,
                                                {s.needs_grad(0), s.needs_grad(1), s.needs_grad(2)},
                                                relu ? s[4] : Tensor(), s.needs_grad(3));
        g[0] = r.dx;
        g[1] = r.dweight;
        g[2] = r.dbias;
        g[3] = r.dresidual;
      });
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_with("batch_norm", x, running_mean, running_var, weight, bias, training,
                         momentum, eps, {});
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps, const Tensor& residual) {
  // A residual the fused kernels cannot read element for element with x (broadcast, another
  // dtype or device): the same result from the ops one by one.
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.dtype() != x.dtype() ||
                             residual.device() != x.device()))
    return relu(add(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps),
                    residual));
  return batch_norm_with("batch_norm_relu", x, running_mean, running_var, weight, bias, training,
                         momentum, eps, {residual, true});
}

// d layer_norm: dx = rstd (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat)), dx_hat = dy weight;
//   dweight = sum_rows(dy x_hat) ; dbias = sum_rows(dy)
Tensor ops_impl::layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                            const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  const int64_t lead = x.dim() - static_cast<int64_t>(normalized_shape.size());
  LOOM_CHECK(lead >= 0 && Shape(x.sizes().begin() + lead, x.sizes().end()) == normalized_shape,
             ShapeError, op, ": normalized_shape=", normalized_shape,
             " does not match the trailing dims of x=", x.sizes());
  check_param(op, "weight", weight, normalized_shape, "normalized_shape", x, x.dtype());
  check_param(op, "bias", bias, normalized_shape, "normalized_shape", x, x.dtype());
  const int64_t cols = shape_numel(normalized_shape);
  k::LayerNormForward f = k::layer_norm_forward(x, cols, weight, bias, eps);
  return record(op, f.out, {x, weight, bias}, {x, weight, f.mean, f.rstd},
                [cols, normalized_shape](const Grads& dout, Saved& s, Grads& g) {
                  k::NormGrads r =
                      k::layer_norm_backward(dout[0], s[0], s[2], s[3], s[1], cols,
                                             {s.needs_grad(0), s.needs_grad(1), s.needs_grad(2)});
                  g[0] = r.dx;
                  if (r.dweight.defined()) g[1] = k::reshape(r.dweight, normalized_shape);
                  if (r.dbias.defined()) g[2] = k::reshape(r.dbias, normalized_shape);
                });
}

}  // namespace loom
