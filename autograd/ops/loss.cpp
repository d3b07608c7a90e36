// autograd/ops/loss.cpp — softmax, log_softmax and the losses: argument checks, the fused
// kernels of tensor/loss.h, and each backward right below its forward.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/loss.h"

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "autograd/ops/view.h"
#include "tensor/elementwise.h"
#include "tensor/loss.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

namespace {

// A class loss of one sample: input [C] with a 0-d target runs as a batch of one.
template <typename Loss>
Tensor as_batch_of_one(const char* op, const Tensor& input, const Tensor& target,
                       Reduction reduction, Loss&& loss) {
  LOOM_CHECK(target.dim() == 0, ShapeError, op,
             ": expected a 0-d target for input of shape [C]; got input=", input.sizes(),
             " target=", target.sizes());
  Tensor out = loss(unsqueeze(input, 0), k::unsqueeze(target, 0));
  return reduction == Reduction::None ? squeeze(out, 0) : out;
}

}  // namespace

// d softmax: dx = y (dy - sum(dy y))
Tensor ops_impl::softmax(const Tensor& x, int64_t dim) {
  Tensor y = k::softmax(x, dim);
  return record("softmax", y, {x}, {y}, [dim](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::softmax_backward(dout[0], s[0], dim);
  });
}

// d log_softmax: dx = dy - exp(y) sum(dy)
Tensor ops_impl::log_softmax(const Tensor& x, int64_t dim) {
  Tensor y = k::log_softmax(x, dim);
  return record("log_softmax", y, {x}, {y}, [dim](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::log_softmax_backward(dout[0], s[0], dim);
  });
}

// d cross_entropy: dlogits = g (softmax(logits) - (1 - ls) onehot(target) - ls / C), 0 where
// the target is ignored; g = dloss, or dloss / count for Mean
Tensor ops_impl::cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                               int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy";
  LOOM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, op,
             ": label_smoothing must be in [0, 1]; got ", label_smoothing);
  LOOM_CHECK(logits.dim() >= 1, ShapeError, op,
             ": expected logits of shape [N, C, ...] or [C]; got logits=", logits.sizes(),
             " target=", target.sizes());
  if (logits.dim() == 1)
    return as_batch_of_one(op, logits, target, reduction, [&](const Tensor& l, const Tensor& t) {
      return loom::cross_entropy(l, t, reduction, ignore_index, label_smoothing);
    });
  k::CrossEntropyForward f =
      k::cross_entropy_forward(logits, target, reduction, ignore_index, label_smoothing);
  return record(op, f.loss, {logits}, {logits, target, f.lse},
                [reduction, ignore_index, label_smoothing, count = f.count](const Grads& dout,
                                                                            Saved& s, Grads& g) {
                  g[0] = k::cross_entropy_backward(dout[0], s[0], s[1], s[2], reduction,
                                                   ignore_index, label_smoothing, count);
                });
}

// d nll_loss: dlog_probs = -g weight[target] at the target class, 0 elsewhere; g = dloss, or
// dloss / sum(weight[target]) for Mean. The class weights are constants (no gradient).
Tensor ops_impl::nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                          Reduction reduction, int64_t ignore_index) {
  const char* op = "nll_loss";
  LOOM_CHECK(log_probs.dim() >= 1, ShapeError, op,
             ": expected log_probs of shape [N, C, ...] or [C]; got log_probs=", log_probs.sizes(),
             " target=", target.sizes());
  LOOM_CHECK(!weight.defined() || weight.dtype() == log_probs.dtype(), DTypeError, op,
             ": expected weight of log_probs' dtype ", log_probs.dtype(), "; got ", weight.dtype());
  if (log_probs.dim() == 1)
    return as_batch_of_one(op, log_probs, target, reduction, [&](const Tensor& l, const Tensor& t) {
      return loom::nll_loss(l, t, weight, reduction, ignore_index);
    });
  k::NllLossForward f = k::nll_loss_forward(log_probs, target, weight, reduction, ignore_index);
  return record(op, f.loss, {log_probs}, {target, weight},
                [reduction, ignore_index, total = f.total_weight, shape = log_probs.sizes()](
                    const Grads& dout, Saved& s, Grads& g) {
                  g[0] = k::nll_loss_backward(dout[0], shape, s[0], s[1], reduction, ignore_index,
                                              total);
                });
}

// d mse_loss: dinput = 2 (input - target) g ; dtarget = -dinput; g = dloss, or dloss / numel
// for Mean
Tensor ops_impl::mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return record("mse_loss", k::mse_loss(input, target, reduction), {input, target}, {input, target},
                [reduction](const Grads& dout, Saved& s, Grads& g) {
                  const Tensor dinput = k::mse_loss_backward(dout[0], s[0], s[1], reduction);
                  if (s.needs_grad(0)) g[0] = dinput;
                  if (s.needs_grad(1)) g[1] = k::neg(dinput);
                });
}

}  // namespace loom
