// tensor/checks.h — argument checks shared by kernels: devices that must agree, the test
// behind each op's device switch (Decision 2: one switch per op), and operands that overlap
// the tensor an op writes.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

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

// Note [Overlapping operands]
// An op that writes `out` while it reads `inputs` element by element (copy_, the in-place
// arithmetic) would read values it has already overwritten wherever the two share memory in any
// other way than element for element, and its result would depend on the loop order. loom
// refuses that, as PyTorch does, with a ValueError that says to clone() first:
//   - out with more than one element at one address (a dim of size > 1 with stride 0: an
//     expand()ed tensor);
//   - an input in out's storage whose span meets out's without being out's exact view
//     (x[1:] copied into x[:-1], x added to its own transpose). This is decided where both are
//     dense in some order of their dims (their elements fill their span); other strided views
//     may interleave without meeting and are let through, as PyTorch lets them.

// t's elements fill [offset, offset + numel) in some order of its dims (no gap, no element
// twice): PyTorch's is_non_overlapping_and_dense.
inline bool fills_its_span(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

inline void check_no_overlap(const char* op, const Tensor& out,
                             std::initializer_list<Tensor> inputs) {
  if (out.numel() == 0) return;
  for (int64_t d = 0; d < out.dim(); ++d)
    LOOM_CHECK(out.size(d) <= 1 || out.stride(d) != 0, ValueError, op,
               ": more than one element of the written-to tensor refers to one memory location "
               "(shape=",
               out.sizes(), " strides=", out.strides(), "); clone() it first");
  for (const Tensor& in : inputs) {
    if (!in.defined() || in.numel() == 0 || in.storage().get() != out.storage().get()) continue;
    if (in.offset() == out.offset() && in.sizes() == out.sizes() && in.strides() == out.strides() &&
        in.dtype() == out.dtype())
      continue;  // element for element
    if (!fills_its_span(in) || !fills_its_span(out)) continue;
    const int64_t in_begin = in.offset() * static_cast<int64_t>(in.itemsize());
    const int64_t in_end = in_begin + in.numel() * static_cast<int64_t>(in.itemsize());
    const int64_t out_begin = out.offset() * static_cast<int64_t>(out.itemsize());
    const int64_t out_end = out_begin + out.numel() * static_cast<int64_t>(out.itemsize());
    LOOM_CHECK(in_end <= out_begin || out_end <= in_begin, ValueError, op,
               ": some elements of an input (shape=", in.sizes(), " strides=", in.strides(),
               " offset=", in.offset(), ") and of the written-to tensor (shape=", out.sizes(),
               " strides=", out.strides(), " offset=", out.offset(),
               ") refer to one memory location; clone() the input first");
  }
}

}  // namespace loom::kernels
