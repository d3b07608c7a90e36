// dist/reductions.h — the element-wise reductions of the CPU collectives, one definition for
// both of gloo's transports (its TCP pairs and the shared-memory segment of
// dist/shm_collectives.h), so that the two give the same bits for the same pair of operands.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dist/process_group.h"
#include "tensor/dispatch.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace loom::dist::reduction {

// Half and bfloat16 compute in float; every other type in itself.
template <typename T>
using Compute =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
T reduce_one(T a, T b, ReduceOp op) {
  using C = Compute<T>;
  const C x = static_cast<C>(a), y = static_cast<C>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<T>) {  // wraps around, as integer tensors do elsewhere
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
      } else {
        return static_cast<T>(x + y);
      }
    case ReduceOp::Max:
    case ReduceOp::Min:
      if constexpr (!std::is_integral_v<T>) {  // NaN wins, as in PyTorch's max and min
        if (x != x) return a;
        if (y != y) return b;
      }
      return (op == ReduceOp::Max ? x < y : y < x) ? b : a;
  }
  return a;
}

// out[i] = a[i] op b[i]; out may be a or b. The op is a template argument of the loop, so that
// its body holds no branch on it.
template <typename T>
void reduce_into(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  auto each = [&]<ReduceOp kOp>() {
    for (int64_t i = 0; i < n; ++i) out[i] = reduce_one(a[i], b[i], kOp);
  };
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return each.template operator()<ReduceOp::Sum>();
    case ReduceOp::Max:
      return each.template operator()<ReduceOp::Max>();
    case ReduceOp::Min:
      return each.template operator()<ReduceOp::Min>();
  }
}

// Avg is Sum followed by this (integers divide with truncation toward zero).
template <typename T>
void divide(T* data, int64_t n, int divisor) {
  using C = Compute<T>;
  for (int64_t i = 0; i < n; ++i)
    data[i] = static_cast<T>(static_cast<C>(data[i]) / static_cast<C>(divisor));
}

// Calls f.template operator()<T>() with dtype's C++ type: every dtype but bool, which raises
// DTypeError naming `op`.
template <typename F>
void dispatch_reducible(DType dtype, const char* op, F&& f) {
  LOOM_CHECK(dtype != kBool, DTypeError, op,
             ": gloo reduces float32, float64, float16, bfloat16, int64, int32 and uint8 tensors; "
             "got ",
             dtype);
  dispatch_all(dtype, op, [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) f.template operator()<T>();
  });
}

}  // namespace loom::dist::reduction
