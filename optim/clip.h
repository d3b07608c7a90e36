// optim/clip.h — gradient clipping by the total norm over many parameters, as
// torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

// The norm of order norm_type (> 0, or infinity for the largest |g|) over the gradients of all
// `params` together, as if concatenated; parameters without a gradient are left out. When
// max_norm / (total + 1e-6) < 1 every gradient is scaled in place by that factor. Returns the
// total norm before clipping (0 when no parameter has a gradient). Norms accumulate in double.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace loom::optim
