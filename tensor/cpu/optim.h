// tensor/cpu/optim.h — the CPU loops of the fused optimizer updates (tensor/optim.h, whose
// front checks the arguments and calls these for CPU tensors).
#pragma once

#include <span>

#include "tensor/optim.h"

namespace loom::cpu {

void sgd_update(std::span<const kernels::SgdTensors> list, const kernels::SgdStep& s);
void adam_update(std::span<const kernels::AdamTensors> list, const kernels::AdamStep& s);
void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf);

}  // namespace loom::cpu
