// tensor/optim.h — the optimizers' fused updates as a kernel family: SGD, Adam/AdamW and
// GradScaler's unscale, each over a list of parameters on one device and of one dtype. Each
// element's gradient and state buffers are read once and the parameter and buffers written, in
// the parameter's type, with the scalar factors computed on the host in double (as PyTorch
// computes them in Python). optim/ groups its parameters by device and dtype and calls these;
// tensor/cpu/optim.cpp and tensor/cuda/optim.cu hold the loops and the kernels.
#pragma once

#include <span>

#include "tensor/tensor.h"

namespace loom::kernels {

// Every call takes tensors of one dtype (float32 or float64) on one device, the same for every
// entry of the list, and dense: row-major or channels-last, the tensors of one entry in the same
// order (Note [Update layouts] in optim/optimizer.h). ValueError, DTypeError or DeviceError
// otherwise.

struct SgdStep {
  double lr, weight_decay, momentum, dampening;
  bool nesterov;
};
struct SgdTensors {
  Tensor param, grad;
  Tensor buffer;  // the momentum buffer; undefined when momentum is off
  bool first;     // the buffer takes this first direction as it is
};
void sgd_update(std::span<const SgdTensors> list, const SgdStep& s);

// The factors that depend on the step count: one call takes parameters at the same step.
struct AdamStep {
  double beta1, beta2, eps;
  double l2;            // Adam's L2 term (0 for AdamW)
  double decay_factor;  // AdamW's 1 - lr * wd (applied when decoupled)
  double step_size;     // lr / (1 - beta1^t)
  double bias_correction2_sqrt;
  bool decoupled;
};
struct AdamTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  Tensor max_exp_avg_sq;  // undefined without amsgrad
};
void adam_update(std::span<const AdamTensors> list, const AdamStep& s);

// GradScaler's unscale: each grad <- grad * inv_scale in place, and found_inf (int32 [1] on the
// grads' device) set to 1 when a result is not finite. Does not bump the grads' versions.
void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf);

}  // namespace loom::kernels
