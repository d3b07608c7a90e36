// tensor/cpu/copy.cpp — the CPU loops of tensor/copy.h: the strided copy with conversion between
// any two element types (float32 <-> float16 through F16C where the CPU has it) and the fill.

#include "tensor/cpu/copy.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "tensor/copy.h"
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

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
  if (!(to_half || from_half) || !kernels::same_dense_layout(dst, src)) return false;
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

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  if (convert_dense_half(dst, src)) return;
  dispatch_all(dst.dtype(), "copy_", [&]<typename To>() {
    dispatch_all(src.dtype(), "copy_", [&]<typename From>() {
      cpu::map<To, From>(
          dst, [](From v) { return convert<To>(v); }, src);
    });
  });
}

void fill_(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = convert<T>(value);
    cpu::map<T, T>(dst, [v]() { return v; });
  });
}

}  // namespace loom::cpu
