// tensor/dtype.h — element types, their sizes and names, and the two 16-bit float storage
// types. Half and BFloat16 are storage formats: kernels compute on them in float (math_t below,
// Note [16-bit arithmetic] in tensor/cuda/float16.h), and the conversions below are their only
// arithmetic.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

namespace loom {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8, Bool };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kBool = DType::Bool;

size_t itemsize(DType dtype);
const char* dtype_name(DType dtype);  // "float32", ... as PyTorch prints them
bool is_floating(DType dtype);        // float32, float64, float16, bfloat16
bool is_integral(DType dtype);        // int64, int32, uint8 (not bool)
bool is_16bit_float(DType dtype);     // float16, bfloat16: the mixed-precision dtypes
// The type two operands promote to (PyTorch's rules for the types loom has).
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

// IEEE 754 binary16, converted with correct rounding (round to nearest even).
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value);  // NOLINT(google-explicit-constructor): behaves like a float
  operator float() const;
};

// bfloat16: the top 16 bits of a float32, rounded to nearest even; NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value) {  // NOLINT(google-explicit-constructor)
    uint32_t u;
    std::memcpy(&u, &value, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// The type an element of type T is computed in: float for the 16-bit floats, T otherwise.
template <typename T>
struct MathType {
  using type = T;
};
template <>
struct MathType<Half> {
  using type = float;
};
template <>
struct MathType<BFloat16> {
  using type = float;
};
template <typename T>
using math_t = typename MathType<T>::type;

// The C++ type of each dtype, and back.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = kFloat32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = kFloat64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = kFloat16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = kBFloat16;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = kInt64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = kInt32;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = kUInt8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = kBool;
};

}  // namespace loom
