// tensor/checks.h — argument checks shared by kernels: devices that must agree, and the test
// behind each op's device switch (Decision 2: one switch per op).
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

// The device switch of an op (Decision 2): true when its operands live on a CUDA device, whose
// kernel (tensor/cuda/<family>.cu) then runs. Operands on different devices are refused here,
// once for both backends (DeviceError), so that no kernel is handed a pointer it cannot read.
inline bool on_cuda(const char* op, std::initializer_list<Tensor> tensors) {
  return common_device(op, tensors).is_cuda();
}

}  // namespace loom::kernels
