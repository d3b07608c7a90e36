// tensor/cuda/copy.h — copies and fills on one CUDA device: any strides, broadcasting, and
// conversion between all eight dtypes (rounding as the CPU's: to nearest, ties to even).
// tensor/copy.cpp calls them for device-to-device work; copies between the host and a device
// stay there. Host-only header; defined in tensor/cuda/copy.cu.
#pragma once

#include "tensor/copy.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// dst[...] = src broadcast to dst's shape and converted to dst's dtype; dst and src on the same
// CUDA device. Checks the shapes (ShapeError, as kernels::copy_) and devices (DeviceError) and
// bumps dst's version: it replaces kernels::copy_ for such pairs rather than following it (a
// second bump would be harmless). Queued on the current stream; returns without waiting.
void copy_(const Tensor& dst, const Tensor& src);
// Every element of dst (any dtype, any strides) set to value converted to dst's dtype as the CPU
// converts it. Bumps dst's version.
void fill_(const Tensor& dst, double value);

}  // namespace loom::cuda
