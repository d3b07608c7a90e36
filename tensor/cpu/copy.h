// tensor/cpu/copy.h — the CPU loops behind tensor/copy.h's copy_ and fill_ (whose front checks
// the shapes, the overlap and the devices, and bumps the version).
#pragma once

#include "tensor/tensor.h"

namespace loom::cpu {

// dst = src converted to dst's dtype, element by element over dst's shape (src broadcast to it);
// both on the CPU.
void copy_(const Tensor& dst, const Tensor& src);
// Every element of dst (on the CPU) = value converted to dst's dtype.
void fill_(const Tensor& dst, double value);

}  // namespace loom::cpu
