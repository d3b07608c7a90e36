// tensor/cuda/float16.h — float16 and bfloat16 on the device: the conversions to and from
// float that the CUDA kernels use, and the type each element type computes in.
//
// loom::Half and loom::BFloat16 are plain bit containers on the device (their converting
// constructors are host code). The functions below round as those constructors do, to nearest
// with ties to even, so a value converted on the GPU has the CPU's bits. They are plain integer
// code, host and device: tests/tensor/float16_bits_test.cpp checks them on the CPU against
// the host conversions, every half and a sweep of floats, without a GPU.
//
// Note [16-bit arithmetic]
//   Elementwise ops and batch norm accept float16 and bfloat16 tensors: each element is widened
//   to float, the op computes in float (math_t), and the result is rounded once to the
//   tensor's dtype. This is PyTorch's "opmath": a 16-bit add rounds exactly once, as a float32
//   add of the widened operands followed by a narrowing would, so the CPU (which widens the
//   same way) and the GPU agree bit for bit on +, -, * and /. Under autocast a ResNet's batch
//   norm, ReLU and residual add thus stay 16-bit between its convolutions (Note [Autocast
//   policy]): half the bytes per activation, and no cast kernels between the layers.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/dtype.h"

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOOM_HOST_DEVICE inline
#endif

namespace loom::cuda {

LOOM_HOST_DEVICE float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
LOOM_HOST_DEVICE uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

LOOM_HOST_DEVICE float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0)  // zero or subnormal: mantissa * 2^-24, exact in float
    return bits_to_float(float_to_bits(static_cast<float>(mantissa) * 5.9604644775390625e-08f) |
                         sign);
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

LOOM_HOST_DEVICE uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN (quiet)
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // inf, overflow
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a subnormal half, a count of 2^-24 steps. The float is m * 2^(e - 150) with
    // m the 24-bit significand, so the count is m >> (126 - e), rounded to nearest even.
    const uint32_t e = magnitude >> 23;
    const uint32_t shift = 126 - e;                      // >= 14
    if (shift > 24) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t m = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t count = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (count & 1u))) ++count;  // may reach 2^-14: fine
    return static_cast<uint16_t>(sign | count);
  }
  // Normal: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even.
  uint32_t rebiased = magnitude - (112u << 23);
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rebiased >> 13));
}

LOOM_HOST_DEVICE float bfloat16_to_float(uint16_t b) {
  return bits_to_float(static_cast<uint32_t>(b) << 16);
}

LOOM_HOST_DEVICE uint16_t float_to_bfloat16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// An element widened to its math type, and a math value rounded back to the element type.
template <typename T>
LOOM_HOST_DEVICE math_t<T> to_math(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return half_to_float(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return bfloat16_to_float(v.bits);
  else
    return v;
}
template <typename T, typename V>
LOOM_HOST_DEVICE T from_math(V v) {
  if constexpr (std::is_same_v<T, Half>) {
    Half h;
    h.bits = float_to_half(static_cast<float>(v));
    return h;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16 b;
    b.bits = float_to_bfloat16(static_cast<float>(v));
    return b;
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace loom::cuda
