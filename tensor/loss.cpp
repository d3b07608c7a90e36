// tensor/loss.cpp — the front of softmax and the losses (tensor/loss.h): the line and class
// layouts both backends use, the argument checks (devices, shapes, dtypes, and on the CPU the
// target values), then the one device switch per entry to tensor/cpu/loss.cpp or the CUDA backend
// (tensor/cuda_backend.h).

#include "tensor/loss.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/loss.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"

namespace loom::kernels {

namespace {

// dy and y of a softmax backward, read element for element: one shape.
void check_softmax_grad(const char* op, const Tensor& dy, const Tensor& y) {
  LOOM_CHECK(y.sizes() == dy.sizes(), ShapeError, op, ": dy and y differ; got dy=", dy.sizes(),
             " y=", y.sizes());
}

// What the host can check of a class loss's target against input [N, C, *]: the shapes and the
// dtype. Its values are checked where they live, after the device switch.
void check_class_shapes(const char* op, const Tensor& input, const Tensor& target) {
  LOOM_CHECK(input.dim() >= 2, ShapeError, op,
             ": expected input of shape [N, C, ...]; got input=", input.sizes(),
             " target=", target.sizes());
  LOOM_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, DTypeError, op,
             ": expected target of int64 class indices; got ", target.dtype(),
             " target=", target.sizes(), " input=", input.sizes());
  bool match = target.dim() == input.dim() - 1 && target.size(0) == input.size(0);
  for (int64_t d = 1; match && d < target.dim(); ++d) match = target.size(d) == input.size(d + 1);
  LOOM_CHECK(match, ShapeError, op,
             ": expected target of shape [N, ...] for input [N, C, ...]; got input=", input.sizes(),
             " target=", target.sizes());
}

// The values of a CPU target (shapes checked): each in [0, C) or ignore_index, else IndexError.
// Returns the number of positions not ignored.
int64_t count_class_targets(const char* op, const Tensor& input, const Tensor& target,
                            int64_t ignore_index) {
  const int64_t classes = input.size(1);
  const Tensor tc = contiguous(target);
  return dispatch_index(target.dtype(), op, [&]<typename I>() -> int64_t {
    const I* tp = tc.data_ptr<I>();
    int64_t count = 0;
    for (int64_t p = 0; p < tc.numel(); ++p) {
      const int64_t t = static_cast<int64_t>(tp[p]);
      if (t == ignore_index) continue;
      LOOM_CHECK(t >= 0 && t < classes, IndexError, op, ": target ", t, " is out of range [0, ",
                 classes, ") (ignore_index=", ignore_index, "); got input=", input.sizes(),
                 " target=", target.sizes());
      ++count;
    }
    return count;
  });
}

// A loss backward's dloss: one value per position (None) or a single value (Mean, Sum).
void check_dloss(const char* op, const Tensor& dloss, Reduction reduction, int64_t positions) {
  if (reduction == Reduction::None)
    LOOM_CHECK(dloss.numel() == positions, ShapeError, op, ": expected dloss with ", positions,
               " elements; got dloss=", dloss.sizes());
  else
    LOOM_CHECK(dloss.numel() == 1, ShapeError, op,
               ": expected a one-element dloss for a reduced loss; got dloss=", dloss.sizes());
}

}  // namespace

DimLayout dim_layout(const Tensor& x, int64_t dim, const char* op) {
  DimLayout l;
  if (x.dim() == 0) {
    wrap_dim(dim, 1, op);
    return l;
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  for (int64_t i = 0; i < d; ++i) l.outer *= x.size(i);
  l.n = x.size(d);
  for (int64_t i = d + 1; i < x.dim(); ++i) l.inner *= x.size(i);
  return l;
}

ClassLayout class_layout(const Shape& input) {
  LOOM_ASSERT(input.size() >= 2, "class losses need input [N, C, ...]");
  ClassLayout l;
  l.n = input[0];
  l.c = input[1];
  for (size_t d = 2; d < input.size(); ++d) l.s *= input[d];
  return l;
}

// ---------------------------------------------------------------- softmax

Tensor softmax(const Tensor& x, int64_t dim) {
  if (on_cuda("softmax", {x})) return cuda_backend().softmax(x, dim);
  return cpu::softmax(x, dim_layout(x, dim, "softmax"));
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (on_cuda("log_softmax", {x})) return cuda_backend().log_softmax(x, dim);
  return cpu::log_softmax(x, dim_layout(x, dim, "log_softmax"));
}
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim) {
  common_device("softmax_backward", {dy, y});
  check_softmax_grad("softmax_backward", dy, y);
  if (on_cuda("softmax_backward", {dy, y})) return cuda_backend().softmax_backward(dy, y, dim);
  return cpu::softmax_backward(dy, y, dim_layout(y, dim, "softmax_backward"));
}
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim) {
  common_device("log_softmax_backward", {dy, y});
  check_softmax_grad("log_softmax_backward", dy, y);
  if (on_cuda("log_softmax_backward", {dy, y}))
    return cuda_backend().log_softmax_backward(dy, y, dim);
  return cpu::log_softmax_backward(dy, y, dim_layout(y, dim, "log_softmax_backward"));
}

// ---------------------------------------------------------------- class losses

// The shapes on the host; the values where they live (cuda_backend().check_class_target reads them
// on the device).
int64_t check_class_target(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index) {
  common_device(op, {input, target});
  check_class_shapes(op, input, target);
  if (on_cuda(op, {input, target}))
    return cuda_backend().check_class_target(op, input, target, ignore_index);
  return count_class_targets(op, input, target, ignore_index);
}

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                          Reduction reduction, int64_t ignore_index,
                                          double label_smoothing) {
  const char* op = "cross_entropy";
  common_device("cross_entropy_forward", {logits, target});
  check_class_shapes(op, logits, target);
  if (on_cuda("cross_entropy_forward", {logits, target}))
    return cuda_backend().cross_entropy_forward(logits, target, reduction, ignore_index,
                                                label_smoothing);
  const int64_t count = count_class_targets(op, logits, target, ignore_index);
  return cpu::cross_entropy_forward(logits, target, reduction, ignore_index, label_smoothing,
                                    count);
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count) {
  const char* op = "cross_entropy_backward";
  common_device(op, {dloss, logits, target, lse, count});
  LOOM_CHECK(count.numel() == 1, ShapeError, op, ": expected one count; got count=", count.sizes());
  const ClassLayout l = class_layout(logits.sizes());
  LOOM_CHECK(lse.numel() == l.positions() && target.numel() == l.positions(), ShapeError, op,
             ": lse and target need one value per position; got logits=", logits.sizes(),
             " target=", target.sizes(), " lse=", lse.sizes());
  check_dloss(op, dloss, reduction, l.positions());
  if (on_cuda(op, {dloss, logits, target, lse, count}))
    return cuda_backend().cross_entropy_backward(dloss, logits, target, lse, reduction,
                                                 ignore_index, label_smoothing, count);
  return cpu::cross_entropy_backward(dloss, logits, target, lse, reduction, ignore_index,
                                     label_smoothing, count);
}

NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                                Reduction reduction, int64_t ignore_index) {
  const char* op = "nll_loss";
  common_device("nll_loss_forward", {log_probs, target, weight});
  check_class_shapes(op, log_probs, target);
  const ClassLayout l = class_layout(log_probs.sizes());
  LOOM_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == l.c), ShapeError, op,
             ": expected weight of shape [", l.c, "] (one per class); got weight=", weight.sizes(),
             " input=", log_probs.sizes());
  if (on_cuda("nll_loss_forward", {log_probs, target, weight}))
    return cuda_backend().nll_loss_forward(log_probs, target, weight, reduction, ignore_index);
  count_class_targets(op, log_probs, target, ignore_index);
  return cpu::nll_loss_forward(log_probs, target, weight, reduction, ignore_index);
}

Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight) {
  const char* op = "nll_loss_backward";
  common_device(op, {dloss, target, weight});
  const ClassLayout l = class_layout(input_shape);
  LOOM_CHECK(target.numel() == l.positions(), ShapeError, op,
             ": target needs one value per position; got log_probs=", input_shape,
             " target=", target.sizes());
  LOOM_CHECK(!weight.defined() || weight.numel() == l.c, ShapeError, op,
             ": expected weight of shape [", l.c, "] (one per class); got weight=", weight.sizes(),
             " input=", input_shape);
  check_dloss(op, dloss, reduction, l.positions());
  if (on_cuda(op, {dloss, target, weight}))
    return cuda_backend().nll_loss_backward(dloss, input_shape, target, weight, reduction,
                                            ignore_index, total_weight);
  return cpu::nll_loss_backward(dloss, input_shape, target, weight, reduction, ignore_index,
                                total_weight);
}

// ---------------------------------------------------------------- mse

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  common_device(op, {input, target});
  LOOM_CHECK(input.sizes() == target.sizes(), ShapeError, op,
             ": input and target differ in shape; got input=", input.sizes(),
             " target=", target.sizes());
  LOOM_CHECK(input.dtype() == target.dtype(), DTypeError, op, ": input is ", input.dtype(),
             " but target is ", target.dtype(), "; got input=", input.sizes(),
             " target=", target.sizes());
  if (on_cuda(op, {input, target})) return cuda_backend().mse_loss(input, target, reduction);
  return cpu::mse_loss(input, target, reduction);
}

Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction) {
  const char* op = "mse_loss_backward";
  common_device(op, {dloss, input, target});
  LOOM_CHECK(input.numel() == target.numel(), ShapeError, op,
             ": input and target differ in shape; got input=", input.sizes(),
             " target=", target.sizes());
  check_dloss(op, dloss, reduction, input.numel());
  if (on_cuda(op, {dloss, input, target}))
    return cuda_backend().mse_loss_backward(dloss, input, target, reduction);
  return cpu::mse_loss_backward(dloss, input, target, reduction);
}

}  // namespace loom::kernels
