// tensor/copy.cpp — strided copies with conversion, fills, and moves between devices.
// The front of the copy family: the checks and the device switch; CPU work runs the loops of
// tensor/cpu/copy.cpp, work on one GPU the CUDA backend's (tensor/cuda_backend.h); Note [Copies
// between devices] for the rest.

#include "tensor/copy.h"

#include "tensor/checks.h"
#include "tensor/cpu/copy.h"
#include "tensor/cuda_backend.h"
#include "tensor/view.h"

namespace loom::kernels {

bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.is_contiguous() && b.is_contiguous()) return true;
  return a.is_contiguous(MemoryFormat::kChannelsLast) &&
         b.is_contiguous(MemoryFormat::kChannelsLast);
}

bool is_dense(const Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(MemoryFormat::kChannelsLast);
}

Tensor dense_like(const Tensor& t, const Tensor& like) {
  if (same_dense_layout(t, like)) return t;
  LOOM_CHECK(t.sizes() == like.sizes(), ShapeError, "dense_like: shapes differ; got t=", t.sizes(),
             " like=", like.sizes());
  return contiguous(t, suggest_memory_format(like));
}

// Note [Copies between devices]
// On one device the copy is that device's kernel: strides, broadcasting and dtype conversion
// included. Between the host and a GPU only dense bytes of one dtype move (copy_bytes), in
// dst's memory format (contiguous or channels-last); the conversion and the layout happen on
// whichever side the bytes are not: to the GPU, the source goes over as it is (made dense in
// dst's format on the host if it is not) and the device kernel writes it into dst; from the
// GPU, the device kernel first makes a dense copy in dst's dtype and format, which comes over
// into dst (through a host staging tensor when dst is not dense). Between two GPUs the bytes
// go through the host.
void copy_(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), ShapeError,
             "copy_: source shape=", src.sizes(),
             " cannot be broadcast to destination shape=", dst.sizes());
  check_no_overlap("copy_", dst, {src});  // Note [Overlapping operands]
  if (dst.is_cpu() && src.is_cpu()) {
    dst.bump_version();
    return cpu::copy_(dst, src);
  }
  if (dst.device() == src.device()) return cuda_backend().copy_(dst, src);  // bumps the version
  // Between devices an empty tensor moves nothing. The paths below could not take it anyway:
  // they wait for a dense layout, and is_contiguous() is false for a fresh [3, 0] (strides
  // [1, 1]), so they would call themselves for ever.
  if (dst.numel() == 0) {
    dst.bump_version();
    return;
  }
  if (dst.is_cuda() && src.is_cuda()) return copy_(dst, to_device(src, kCPU));
  const MemoryFormat format = suggest_memory_format(dst);
  if (dst.is_cuda()) {  // host to device
    const Tensor dense = contiguous(src, format);
    if (dense.dtype() == dst.dtype() && same_dense_layout(dense, dst)) {
      dst.bump_version();
      if (dst.nbytes())
        cuda_backend().copy_to_device(dst.data(), dense.data(), dst.nbytes(), dst.device().index);
      return;
    }
    Tensor moved = empty(dense.sizes(), dense.dtype(), dst.device(), suggest_memory_format(dense));
    copy_(moved, dense);
    return cuda_backend().copy_(dst, moved);
  }
  // device to host
  Tensor dense = src;
  if (src.dtype() != dst.dtype() || !same_dense_layout(src, dst)) {
    dense = empty(dst.sizes(), dst.dtype(), src.device(), format);
    cuda_backend().copy_(dense, src);
  }
  if (!same_dense_layout(dst, dense)) {  // dst is a strided view
    Tensor staged = empty(dst.sizes(), dst.dtype(), kCPU, suggest_memory_format(dense));
    copy_(staged, dense);
    dst.bump_version();
    return cpu::copy_(dst, staged);
  }
  dst.bump_version();
  if (dst.nbytes())
    cuda_backend().copy_to_host(dst.data(), dense.data(), dst.nbytes(), src.device().index);
}

void fill_(const Tensor& dst, double value) {
  if (dst.is_cuda()) return cuda_backend().fill_(dst, value);  // bumps the version
  dst.bump_version();
  cpu::fill_(dst, value);
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  if (has_memory_format(t, format)) return t;
  Tensor out = empty(t.sizes(), t.dtype(), t.device(), format);
  copy_(out, t);
  return out;
}

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.sizes(), t.dtype(), t.device());
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.sizes(), dtype, t.device(), suggest_memory_format(t));
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype, MemoryFormat format) {
  if (t.dtype() == dtype && t.is_contiguous(format)) return t;
  Tensor out = empty(t.sizes(), dtype, t.device(), format);
  copy_(out, t);
  return out;
}

Tensor widened(const Tensor& t) {
  return t.defined() && is_16bit_float(t.dtype()) ? to_dtype(t, kFloat32) : t;
}

Tensor to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = empty(t.sizes(), t.dtype(), device, suggest_memory_format(t));
  copy_(out, t);
  return out;
}

}  // namespace loom::kernels
