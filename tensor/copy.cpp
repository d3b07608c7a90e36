// tensor/copy.cpp — strided copies with conversion, fills, and moves between devices.
// Device switch per op (Decision 2): CPU work runs the strided loop of tensor/cpu/loops.h;
// CUDA copies go through tensor/cuda/runtime.h as contiguous byte copies.

#include "tensor/copy.h"

#include "tensor/cpu/loops.h"
#include "tensor/cuda/runtime.h"
#include "tensor/dispatch.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

// Converts a value between any two loom element types (through double: exact for every type
// but int64 beyond 2^53, where the converting direction already rounds).
template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<double>(v) != 0.0;
  } else if constexpr (std::is_same_v<From, int64_t> && std::is_integral_v<To>) {
    return static_cast<To>(v);
  } else {
    return static_cast<To>(static_cast<double>(v));
  }
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), "copy_", [&]<typename To>() {
    dispatch_all(src.dtype(), "copy_", [&]<typename From>() {
      cpu::map<To, From>(
          dst, [](From v) { return convert<To>(v); }, src);
    });
  });
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), ShapeError,
             "copy_: source shape=", src.sizes(),
             " cannot be broadcast to destination shape=", dst.sizes());
  dst.bump_version();
  if (dst.is_cpu() && src.is_cpu()) return copy_cpu(dst, src);
  // A device is involved: move contiguous bytes of matching dtype and shape, converting and
  // broadcasting on the CPU side (the CUDA issue adds device kernels for the rest).
  if (dst.is_cuda() && src.is_cuda() && dst.device() != src.device())
    return copy_(dst, to_device(src, kCPU));
  if (src.sizes() != dst.sizes() || src.dtype() != dst.dtype() || !src.is_contiguous()) {
    LOOM_CHECK(src.is_cpu(), NotImplementedError, "copy_: converting or broadcasting on ",
               src.device(), " is not available yet; got src=", src.sizes(), " ", src.dtype(),
               " dst=", dst.sizes(), " ", dst.dtype());
    Tensor staged = empty(dst.sizes(), dst.dtype(), kCPU);
    copy_cpu(staged, src);
    return copy_(dst, staged);
  }
  if (!dst.is_contiguous()) {
    Tensor staged = empty(dst.sizes(), dst.dtype(), src.device());
    copy_(staged, src);
    return copy_(dst, staged);
  }
  using cuda::CopyKind;
  const CopyKind kind = dst.is_cuda() && src.is_cuda() ? CopyKind::DeviceToDevice
                        : dst.is_cuda()                ? CopyKind::HostToDevice
                                                       : CopyKind::DeviceToHost;
  const int device = dst.is_cuda() ? dst.device().index : src.device().index;
  if (dst.nbytes()) cuda::copy_bytes(dst.data(), src.data(), dst.nbytes(), kind, device);
}

void fill_(const Tensor& dst, double value) {
  if (!dst.is_cpu()) {
    Tensor host = full(dst.sizes(), value, dst.dtype(), kCPU);
    return copy_(dst, host);
  }
  dst.bump_version();
  dispatch_all(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = convert<T>(value);
    cpu::map<T, T>(dst, [v]() { return v; });
  });
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.sizes(), t.dtype(), t.device());
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.sizes(), dtype, t.device());
  copy_(out, t);
  return out;
}

Tensor to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = empty(t.sizes(), t.dtype(), device);
  copy_(out, t);
  return out;
}

}  // namespace loom::kernels
