// tensor/cuda/copy.cu — copies with conversion and broadcasting, and fills, on one CUDA device.
// Same dtype, same shape, both contiguous: one cudaMemcpyAsync. Everything else: the strided
// map of tensor/cuda/loops.cuh (Note [CUDA elementwise loops]), one element per thread, with a
// conversion that gives the CPU's bits (tensor/copy.cpp's convert, float16 and bfloat16 included).

#include <type_traits>

#include "tensor/checks.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"

namespace loom::cuda {

namespace {

// ---------------------------------------------------------------- 16-bit floats on the device
// Half and BFloat16 are plain bit containers here (their converting constructors are host
// code); these helpers round as theirs do: to nearest, ties to even.

__device__ __forceinline__ float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    return __uint_as_float(__float_as_uint(static_cast<float>(mantissa) * 5.9604644775390625e-08f) |
                           sign);
  }
  return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

__device__ __forceinline__ uint16_t float_to_half(float f) {
  const uint32_t u = __float_as_uint(f);
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

__device__ __forceinline__ float bfloat16_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t float_to_bfloat16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------- conversions (tensor/copy.cpp)

template <typename T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return static_cast<double>(half_to_float(v.bits));
  else if constexpr (std::is_same_v<T, BFloat16>)
    return static_cast<double>(bfloat16_to_float(v.bits));
  else if constexpr (std::is_same_v<T, bool>)
    return v ? 1.0 : 0.0;
  else
    return static_cast<double>(v);
}

// From double as the CPU's static_cast: 16-bit floats through float (two roundings, as there);
// uint8 through int64, so that a negative value wraps as on the x86 host instead of saturating
// at 0 as the GPU's own conversion would (out-of-range values are undefined in C++ either way).
template <typename T>
__device__ __forceinline__ T from_double(double d) {
  if constexpr (std::is_same_v<T, Half>) {
    Half h;
    h.bits = float_to_half(static_cast<float>(d));
    return h;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16 b;
    b.bits = float_to_bfloat16(static_cast<float>(d));
    return b;
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>(static_cast<int64_t>(d));
  } else {
    return static_cast<T>(d);
  }
}

// One element From -> To, the rules of tensor/copy.cpp's convert.
template <typename To, typename From>
struct Convert {
  __device__ To operator()(From v) const {
    if constexpr (std::is_same_v<To, From>)
      return v;
    else if constexpr (std::is_same_v<To, bool>)
      return to_double(v) != 0.0;
    else if constexpr (std::is_same_v<From, int64_t> && std::is_integral_v<To>)
      return static_cast<To>(v);
    else
      return from_double<To>(to_double(v));
  }
};

template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};

// The fill value as the CPU converts it (host code: the same compiler, the same bits).
template <typename T>
T host_convert(double value) {
  if constexpr (std::is_same_v<T, bool>)
    return value != 0.0;
  else
    return static_cast<T>(value);
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), ShapeError,
             "copy_: source shape=", src.sizes(),
             " cannot be broadcast to destination shape=", dst.sizes());
  const Device device = kernels::common_device("copy_", {dst, src});
  LOOM_ASSERT(device.is_cuda(), "cuda::copy_: tensors on ", device);
  DeviceGuard guard(device.index);
  dst.bump_version();
  if (dst.numel() == 0) return;
  if (dst.data() == src.data() && dst.dtype() == src.dtype() && dst.sizes() == src.sizes() &&
      dst.strides() == src.strides())
    return;  // a tensor copied onto itself
  if (dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
      src.is_contiguous()) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream_of(dst)),
                    device.index);
    return;
  }
  dispatch_all(dst.dtype(), "copy_", [&]<typename To>() {
    dispatch_all(src.dtype(), "copy_", [&]<typename From>() {
      gpu_map<To, From>("copy_", dst, Convert<To, From>{}, src);
    });
  });
}

void fill_(const Tensor& dst, double value) {
  LOOM_ASSERT(dst.is_cuda(), "cuda::fill_: tensor on ", dst.device());
  DeviceGuard guard(dst.device().index);
  dst.bump_version();
  dispatch_all(dst.dtype(), "fill_", [&]<typename T>() {
    gpu_map<T, T>("fill_", dst, Constant<T>{host_convert<T>(value)});
  });
}

}  // namespace loom::cuda
