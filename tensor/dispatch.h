// tensor/dispatch.h — from a runtime dtype to a C++ type: one switch, called with a templated
// lambda, so each kernel is written once as a template:
//   dispatch_floating(x.dtype(), "exp", [&]<typename T>() { ...T... });
// dispatch_floating accepts the compute types (float32, float64); dispatch_numeric adds the
// integer types; the _and_16bit variants add float16 and bfloat16 for the kernels that widen
// them to float (Note [16-bit arithmetic] in tensor/cuda/float16.h); dispatch_all adds bool too
// (for copies and conversions).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace loom {

template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    default:
      throw DTypeError(
          detail::str(op, ": expected a float32 or float64 tensor; got ", dtype,
                      is_floating(dtype) ? " (a storage type: convert with .to())" : ""));
  }
}

template <typename F>
decltype(auto) dispatch_numeric(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::UInt8:
      return f.template operator()<uint8_t>();
    default:
      throw DTypeError(
          detail::str(op, ": expected a float32, float64 or integer tensor; got ", dtype));
  }
}

// f for the 16-bit floats, rest() for every other dtype.
template <typename F, typename Rest>
decltype(auto) dispatch_16bit_or(DType dtype, F& f, Rest&& rest) {
  if (dtype == DType::Float16) return f.template operator()<Half>();
  if (dtype == DType::BFloat16) return f.template operator()<BFloat16>();
  return rest();
}

template <typename F>
decltype(auto) dispatch_floating_and_16bit(DType dtype, const char* op, F&& f) {
  return dispatch_16bit_or(dtype, f,
                           [&]() -> decltype(auto) { return dispatch_floating(dtype, op, f); });
}

template <typename F>
decltype(auto) dispatch_numeric_and_16bit(DType dtype, const char* op, F&& f) {
  return dispatch_16bit_or(dtype, f,
                           [&]() -> decltype(auto) { return dispatch_numeric(dtype, op, f); });
}

template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* /*op*/, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Float16:
      return f.template operator()<Half>();
    case DType::BFloat16:
      return f.template operator()<BFloat16>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::UInt8:
      return f.template operator()<uint8_t>();
    case DType::Bool:
      return f.template operator()<bool>();
  }
  throw InternalError("dispatch_all: unknown dtype");
}

// The index types accepted by gather, embedding, cross_entropy targets, ...
template <typename F>
decltype(auto) dispatch_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    default:
      throw DTypeError(detail::str(op, ": expected an int64 or int32 index tensor; got ", dtype));
  }
}

}  // namespace loom
