// tensor/checks.h — argument checks shared by kernels: devices that must agree, and the
// stand-in for CUDA kernels that have not been written yet (Decision 2: one switch per op).
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

// All defined tensors on one device; DeviceError names the op and the devices otherwise.
inline Device common_device(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    LOOM_CHECK(t.device() == first->device(), DeviceError, op,
               ": expected all tensors on one device; got ", first->device(),
               " (shape=", first->sizes(), ") and ", t.device(), " (shape=", t.sizes(), ")");
  }
  LOOM_ASSERT(first != nullptr, op, ": no defined tensor");
  return first->device();
}

// The CUDA branch of an op whose CUDA kernel is not written yet.
[[noreturn]] inline void no_cuda_kernel(const char* op) {
  throw NotImplementedError(
      detail::str(op, ": no CUDA kernel yet; move the tensors to the CPU with .to(kCPU)"));
}

}  // namespace loom::kernels
