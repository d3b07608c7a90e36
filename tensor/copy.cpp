// tensor/copy.cpp — strided copies with conversion, fills, and moves between devices.
// Device switch per op (Decision 2): CPU work runs the strided loop of tensor/cpu/loops.h, work
// on one GPU the CUDA backend's (tensor/cuda_backend.h); Note [Copies between devices] for the
// rest.

#include "tensor/copy.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

// float32 <-> float16 in one instruction where the CPU has F16C (round to nearest even, as
// Half's own conversions): autocast converts every activation of a float16 product.
#if defined(__F16C__)
uint16_t to_half_bits(float v) {
  return static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}
#endif

Half to_half(float v) {
#if defined(__F16C__)
  Half h;
  h.bits = to_half_bits(v);
  return h;
#else
  return Half(v);
#endif
}
float from_half(Half h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return static_cast<float>(h);
#endif
}

// Converts a value between any two loom element types (through double: exact for every type
// but int64 beyond 2^53, where the converting direction already rounds). float32 and the 16-bit
// types convert directly, inline: they are autocast's casts.
template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, Half>) {
    return to_half(v);
  } else if constexpr (std::is_same_v<From, Half> && std::is_same_v<To, float>) {
    return from_half(v);
  } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, BFloat16>) {
    return BFloat16(v);
  } else if constexpr (std::is_same_v<From, BFloat16> && std::is_same_v<To, float>) {
    return static_cast<float>(v);
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<double>(v) != 0.0;
  } else if constexpr (std::is_same_v<From, int64_t> && std::is_integral_v<To>) {
    return static_cast<To>(v);
  } else {
    return static_cast<To>(static_cast<double>(v));
  }
}

// float32 <-> float16 between dense tensors of one shape and one layout (same_dense_layout),
// eight values an instruction (F16C): the casts around every float16 product of autocast.
// False when this path does not apply.
bool convert_dense_half(const Tensor& dst, const Tensor& src) {
#if defined(__F16C__)
  const bool to_half = dst.dtype() == kFloat16 && src.dtype() == kFloat32;
  const bool from_half = dst.dtype() == kFloat32 && src.dtype() == kFloat16;
  if (!(to_half || from_half) || !same_dense_layout(dst, src)) return false;
  const int64_t n = dst.numel();
  parallel_for(0, n, kParallelGrain, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
    if (to_half) {
      const float* s = static_cast<const float*>(src.data());
      auto* d = static_cast<uint16_t*>(dst.data());
      for (; i + 8 <= hi; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < hi; ++i) d[i] = to_half_bits(s[i]);
    } else {
      const auto* s = static_cast<const uint16_t*>(src.data());
      float* d = static_cast<float*>(dst.data());
      for (; i + 8 <= hi; i += 8)
        _mm256_storeu_ps(d + i,
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
      for (; i < hi; ++i) d[i] = _cvtsh_ss(s[i]);
    }
  });
  return true;
#else
  (void)dst, (void)src;
  return false;
#endif
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  if (convert_dense_half(dst, src)) return;
  dispatch_all(dst.dtype(), "copy_", [&]<typename To>() {
    dispatch_all(src.dtype(), "copy_", [&]<typename From>() {
      cpu::map<To, From>(
          dst, [](From v) { return convert<To>(v); }, src);
    });
  });
}

}  // namespace

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
    return copy_cpu(dst, src);
  }
  if (dst.device() == src.device()) return cuda_backend().copy_(dst, src);  // bumps the version
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
    return copy_cpu(dst, staged);
  }
  dst.bump_version();
  if (dst.nbytes())
    cuda_backend().copy_to_host(dst.data(), dense.data(), dst.nbytes(), src.device().index);
}

void fill_(const Tensor& dst, double value) {
  if (dst.is_cuda()) return cuda_backend().fill_(dst, value);  // bumps the version
  dst.bump_version();
  dispatch_all(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = convert<T>(value);
    cpu::map<T, T>(dst, [v]() { return v; });
  });
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
