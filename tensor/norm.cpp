// tensor/norm.cpp — the front of the batch norm and layer norm kernels (tensor/norm.h): each
// entry checks its arguments, takes its one device switch to the CUDA backend
// (tensor/cuda_backend.h) or to the loops of tensor/cpu/norm.cpp, and for the CPU widens a
// 16-bit x to float32 and rounds the results shaped like x back once. Most entries check the
// devices first, so that a mixed-device call raises DeviceError before any shape error; their
// switch, on_cuda, then asks the same tensors. The layout helpers that both backends call
// (channel_layout, layer_norm_rows) live here.

#include "tensor/norm.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/norm.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"

namespace loom::kernels {

namespace {

// ---------------------------------------------------------------- checks
// Every entry point checks its arguments with these before its device switch, so the CUDA
// kernels (tensor/cuda/norm.cu) and the CPU loops receive validated inputs.

// A vector of `count` values (per channel, per row, ...); undefined passes (optional ones).
void check_vector(const char* op, const char* name, const Tensor& t, int64_t count) {
  LOOM_CHECK(!t.defined() || t.numel() == count, ShapeError, op, ": expected ", name, " with ",
             count, " elements; got ", name, "=", t.sizes());
}

// dy and x of a backward, read element for element: one shape.
void check_grad_shape(const char* op, const Tensor& dy, const Tensor& x) {
  LOOM_CHECK(dy.sizes() == x.sizes(), ShapeError, op, ": dy and x differ; got dy=", dy.sizes(),
             " x=", x.sizes());
}

// A tensor read element for element with x (a residual, a ReLU's output): x's shape and dtype.
void check_like_x(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  if (!t.defined()) return;
  LOOM_CHECK(t.sizes() == x.sizes(), ShapeError, op, ": ", name, " and x differ; got ", name, "=",
             t.sizes(), " x=", x.sizes());
  LOOM_CHECK(t.dtype() == x.dtype(), DTypeError, op, ": expected ", name, " of x's dtype ",
             x.dtype(), "; got ", t.dtype(), " (", name, "=", t.sizes(), ")");
}

// The DTypeError the kernels' dispatch_floating raises for x's dtype, raised with the checks.
void require_floating(const char* op, DType dtype) {
  dispatch_floating(dtype, op, []<typename T>() {});
}
// Batch norm also takes 16-bit x, computed in float32 with each output shaped like x rounded
// once (Note [16-bit arithmetic]): CUDA widens element by element, and so do the CPU loops for
// bfloat16 in batch_norm_elemt, batch_norm_forward_train and batch_norm_backward (Note [Batch
// norm on bfloat16] in tensor/cpu/norm.cpp); elsewhere on the CPU a 16-bit x is widened to a
// float32 copy first.
void require_batch_norm_dtype(const char* op, DType dtype) {
  dispatch_floating_and_16bit(dtype, op, []<typename T>() {});
}

// ---------------------------------------------------------------- 16-bit inputs

// The epilogue with its residual widened, for a 16-bit x computed in float32.
BatchNormEpilogue widened(const BatchNormEpilogue& e) {
  return {e.residual.defined() ? kernels::widened(e.residual) : Tensor(), e.relu};
}

// dy in x's dtype, widened: the gradient of a 16-bit x computed in float32.
Tensor widened_grad(const Tensor& dy, const Tensor& x) {
  return kernels::widened(to_dtype(dy, x.dtype()));
}

// Statistics converted to `dtype`.
BatchNormStats stats_in(const BatchNormStats& s, DType dtype) {
  return {to_dtype(s.mean, dtype), to_dtype(s.invstd, dtype), to_dtype(s.var, dtype), s.count};
}

}  // namespace

DType batch_norm_param_dtype(DType x) { return is_16bit_float(x) ? kFloat32 : x; }

ChannelLayout channel_layout(const char* op, const Tensor& x) {
  LOOM_CHECK(x.dim() >= 2, ShapeError, op, ": expected x of shape [N, C, ...]; got x=", x.sizes());
  ChannelLayout l;
  l.n = x.size(0);
  l.c = x.size(1);
  for (int64_t d = 2; d < x.dim(); ++d) l.s *= x.size(d);
  return l;
}

int64_t layer_norm_rows(const char* op, const Tensor& x, int64_t normalized_numel) {
  const int64_t cols = normalized_numel;
  LOOM_CHECK(cols >= 0 && (cols == 0 ? x.numel() == 0 : x.numel() % cols == 0), ShapeError, op,
             ": ", cols, " normalised elements do not divide x=", x.sizes());
  return cols == 0 ? 0 : x.numel() / cols;
}

// ---------------------------------------------------------------- batch norm statistics

BatchNormSums batch_norm_sums(const Tensor& x) {
  channel_layout("batch_norm_sums", x);  // ShapeError for an x of fewer than 2 dims
  if (on_cuda("batch_norm_sums", {x})) return cuda_backend().batch_norm_sums(x);
  if (is_16bit_float(x.dtype())) return cpu::batch_norm_sums(widened(x));
  return cpu::batch_norm_sums(x);
}

BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq, int64_t count,
                                          double eps, DType dtype) {
  const char* op = "batch_norm_stats_from_sums";
  common_device(op, {sum, sum_sq});
  LOOM_CHECK(sum.numel() == sum_sq.numel(), ShapeError,
             "batch_norm_stats_from_sums: sum and sum_sq differ; got sum=", sum.sizes(),
             " sum_sq=", sum_sq.sizes());
  LOOM_CHECK(count > 0, ValueError, "batch_norm_stats_from_sums: expected a positive count; got ",
             count);
  require_floating(op, dtype);
  if (on_cuda(op, {sum, sum_sq}))
    return cuda_backend().batch_norm_stats_from_sums(sum, sum_sq, count, eps, dtype);
  return cpu::batch_norm_stats_from_sums(sum, sum_sq, count, eps, dtype);
}

BatchNormStats batch_norm_stats(const Tensor& x, double eps) {
  return batch_norm_stats(x, eps, batch_norm_param_dtype(x.dtype()));
}

BatchNormStats batch_norm_stats(const Tensor& x, double eps, DType dtype) {
  const char* op = "batch_norm_stats";
  channel_layout(op, x);  // ShapeError for an x of fewer than 2 dims
  require_floating(op, dtype);
  if (on_cuda(op, {x})) return stats_in(cuda_backend().batch_norm_stats(x, eps), dtype);
  if (is_16bit_float(x.dtype())) return cpu::batch_norm_stats(widened(x), eps, dtype);
  return cpu::batch_norm_stats(x, eps, dtype);
}

Tensor batch_norm_invstd(const Tensor& var, double eps) {
  if (on_cuda("batch_norm_invstd", {var})) return cuda_backend().batch_norm_invstd(var, eps);
  return cpu::batch_norm_invstd(var, eps);
}

void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const BatchNormStats& stats, double momentum) {
  const char* op = "batch_norm_update_running_stats_";
  common_device(op, {running_mean, running_var, stats.mean});
  if (running_mean.defined())
    LOOM_CHECK(running_mean.numel() == stats.mean.numel(), ShapeError, op,
               ": running_mean does not match the statistics; got running_mean=",
               running_mean.sizes(), " mean=", stats.mean.sizes());
  if (running_var.defined()) {
    common_device(op, {running_var, stats.var});
    LOOM_CHECK(running_var.numel() == stats.var.numel(), ShapeError, op,
               ": running_var does not match the statistics; got running_var=", running_var.sizes(),
               " var=", stats.var.sizes());
    LOOM_CHECK(
        stats.count > 1, ValueError, op,
        ": the unbiased variance needs more than one value per channel; got count=", stats.count);
  }
  if (on_cuda(op, {running_mean, running_var, stats.mean}))
    return cuda_backend().batch_norm_update_running_stats_(running_mean, running_var, stats,
                                                           momentum);
  return cpu::batch_norm_update_running_stats_(running_mean, running_var, stats, momentum);
}

// ---------------------------------------------------------------- batch norm forward

Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm_elemt";
  common_device(op, {x, mean, invstd, weight, bias, epilogue.residual});
  const ChannelLayout l = channel_layout(op, x);
  check_vector(op, "mean", mean, l.c);
  check_vector(op, "invstd", invstd, l.c);
  check_vector(op, "weight", weight, l.c);
  check_vector(op, "bias", bias, l.c);
  check_like_x(op, "residual", epilogue.residual, x);
  require_batch_norm_dtype(op, x.dtype());
  if (on_cuda(op, {x, mean, invstd, weight, bias, epilogue.residual}))
    return cuda_backend().batch_norm_elemt(x, mean, invstd, weight, bias, epilogue);
  if (x.dtype() == kFloat16)
    return to_dtype(
        cpu::batch_norm_elemt(widened(x), mean, invstd, weight, bias, widened(epilogue)),
        x.dtype());
  return cpu::batch_norm_elemt(x, mean, invstd, weight, bias, epilogue);
}

std::pair<Tensor, BatchNormStats> batch_norm_forward_train(const Tensor& x, const Tensor& weight,
                                                           const Tensor& bias, double eps,
                                                           const BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm";
  common_device("batch_norm_forward_train", {x, weight, bias, epilogue.residual});
  const ChannelLayout l = channel_layout(op, x);
  check_vector(op, "weight", weight, l.c);
  check_vector(op, "bias", bias, l.c);
  check_like_x(op, "residual", epilogue.residual, x);
  require_batch_norm_dtype(op, x.dtype());
  if (on_cuda("batch_norm_forward_train", {x, weight, bias, epilogue.residual}))
    return cuda_backend().batch_norm_forward_train(x, weight, bias, eps, epilogue);
  if (x.dtype() == kFloat16) {
    auto [y, stats] =
        cpu::batch_norm_forward_train(widened(x), weight, bias, eps, widened(epilogue));
    return {to_dtype(y, x.dtype()), stats};
  }
  return cpu::batch_norm_forward_train(x, weight, bias, eps, epilogue);
}

// ---------------------------------------------------------------- batch norm backward

std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd) {
  const char* op = "batch_norm_backward_reduce";
  common_device(op, {dy, x, mean, invstd});
  const ChannelLayout l = channel_layout(op, x);
  check_grad_shape(op, dy, x);
  check_vector(op, "mean", mean, l.c);
  check_vector(op, "invstd", invstd, l.c);
  require_batch_norm_dtype(op, x.dtype());
  if (on_cuda(op, {dy, x, mean, invstd}))
    return cuda_backend().batch_norm_backward_reduce(dy, x, mean, invstd);
  if (is_16bit_float(x.dtype()))
    return cpu::batch_norm_backward_reduce(widened_grad(dy, x), widened(x), mean, invstd);
  return cpu::batch_norm_backward_reduce(dy, x, mean, invstd);
}

Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count) {
  const char* op = "batch_norm_backward_elemt";
  common_device(op, {dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat});
  const ChannelLayout l = channel_layout(op, x);
  check_grad_shape(op, dy, x);
  LOOM_CHECK(sum_dy.defined() == sum_dy_xhat.defined(), ValueError, op,
             ": give both sum_dy and sum_dy_xhat (training) or neither (eval)");
  const bool training = sum_dy.defined();
  LOOM_CHECK(!training || count > 0, ValueError, op, ": expected a positive count; got ", count);
  check_vector(op, "mean", mean, l.c);
  check_vector(op, "invstd", invstd, l.c);
  check_vector(op, "weight", weight, l.c);
  check_vector(op, "sum_dy", sum_dy, l.c);
  check_vector(op, "sum_dy_xhat", sum_dy_xhat, l.c);
  require_batch_norm_dtype(op, x.dtype());
  if (on_cuda(op, {dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat}))
    return cuda_backend().batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy,
                                                    sum_dy_xhat, count);
  if (is_16bit_float(x.dtype()))
    return to_dtype(cpu::batch_norm_backward_elemt(widened_grad(dy, x), widened(x), mean, invstd,
                                                   weight, sum_dy, sum_dy_xhat, count),
                    x.dtype());
  return cpu::batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count);
}

NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& invstd, const Tensor& weight, bool training,
                              std::array<bool, 3> need, const Tensor& relu_y, bool need_dresidual) {
  const char* op = "batch_norm_backward";
  common_device(op, {dy, x, mean, invstd, weight, relu_y});
  const ChannelLayout l = channel_layout(op, x);
  check_grad_shape(op, dy, x);
  check_vector(op, "mean", mean, l.c);
  check_vector(op, "invstd", invstd, l.c);
  check_vector(op, "weight", weight, l.c);
  check_like_x(op, "relu_y", relu_y, x);
  LOOM_CHECK(!need_dresidual || relu_y.defined(), ValueError, op,
             ": dresidual is the ReLU's gradient; give relu_y (x=", x.sizes(), ")");
  require_batch_norm_dtype(op, x.dtype());
  if (on_cuda(op, {dy, x, mean, invstd, weight, relu_y}))
    return cuda_backend().batch_norm_backward(dy, x, mean, invstd, weight, training, need, relu_y,
                                              need_dresidual);
  if (x.dtype() == kFloat16) {
    NormGrads g = cpu::batch_norm_backward(
        widened_grad(dy, x), widened(x), mean, invstd, weight, training, need,
        relu_y.defined() ? widened(relu_y) : Tensor(), need_dresidual);
    if (g.dx.defined()) g.dx = to_dtype(g.dx, x.dtype());
    if (g.dresidual.defined()) g.dresidual = to_dtype(g.dresidual, x.dtype());
    return g;
  }
  return cpu::batch_norm_backward(dy, x, mean, invstd, weight, training, need, relu_y,
                                  need_dresidual);
}

// ---------------------------------------------------------------- layer norm

LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel, const Tensor& weight,
                                    const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  common_device("layer_norm_forward", {x, weight, bias});
  const int64_t cols = normalized_numel;
  layer_norm_rows(op, x, cols);  // ShapeError when cols does not divide x
  check_vector(op, "weight", weight, cols);
  check_vector(op, "bias", bias, cols);
  require_floating(op, x.dtype());
  if (on_cuda("layer_norm_forward", {x, weight, bias}))
    return cuda_backend().layer_norm_forward(x, normalized_numel, weight, bias, eps);
  return cpu::layer_norm_forward(x, normalized_numel, weight, bias, eps);
}

NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight, int64_t normalized_numel,
                              std::array<bool, 3> need) {
  const char* op = "layer_norm_backward";
  common_device(op, {dy, x, mean, rstd, weight});
  check_grad_shape(op, dy, x);
  const int64_t cols = normalized_numel;
  const int64_t rows = layer_norm_rows(op, x, cols);
  check_vector(op, "mean", mean, rows);
  check_vector(op, "rstd", rstd, rows);
  check_vector(op, "weight", weight, cols);
  require_floating(op, x.dtype());
  if (on_cuda(op, {dy, x, mean, rstd, weight}))
    return cuda_backend().layer_norm_backward(dy, x, mean, rstd, weight, normalized_numel, need);
  return cpu::layer_norm_backward(dy, x, mean, rstd, weight, normalized_numel, need);
}

}  // namespace loom::kernels
