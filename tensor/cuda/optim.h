// tensor/cuda/optim.h — the optimizers' fused updates on CUDA tensors: one kernel per parameter
// that reads the gradient and the state buffers once and writes the parameter and the buffers,
// with the arithmetic of optim/sgd.cpp and optim/adam.cpp (in the parameter's type, the scalar
// factors computed on the host in double). Host-only header.
#pragma once

#include "tensor/tensor.h"

namespace loom::cuda {

struct SgdStep {
  double lr, weight_decay, momentum, dampening;
  bool nesterov;
  bool first;  // the momentum buffer takes the first direction as it is
};
// param, grad (and buffer, when momentum is on; else an undefined Tensor): contiguous, one
// dtype (float32 or float64), one device.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buffer, const SgdStep& s);

struct AdamStep {
  double beta1, beta2, eps;
  double l2;            // Adam's L2 term (0 for AdamW)
  double decay_factor;  // AdamW's 1 - lr * wd (applied when decoupled)
  double step_size;     // lr / (1 - beta1^t)
  double bias_correction2_sqrt;
  bool decoupled;
};
// max_exp_avg_sq: undefined without amsgrad.
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStep& s);

// GradScaler's unscale: grad <- grad * inv_scale in place, and found_inf (int32 [1] on grad's
// device) set to 1 when a result is not finite. grad: contiguous float32 or float64. Does not
// bump grad's version.
void unscale_and_check_(const Tensor& grad, double inv_scale, const Tensor& found_inf);

}  // namespace loom::cuda
