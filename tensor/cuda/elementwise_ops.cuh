// tensor/cuda/elementwise_ops.cuh — what the elementwise kernel files share: device math, the
// functors that widen 16-bit operands (InMath), and the host side of each op shape (checks,
// promotion, the output, the dispatch to gpu_map). CUDA sources only.
//
// The ops live in four files: elementwise.cu (binary arithmetic), elementwise_compare.cu
// (comparisons), elementwise_unary.cu (unary ops, where, the fused backwards) and
// elementwise_inplace.cu (the in-place ops). Each op instantiates its loops for every dtype it
// takes, so one file of them all would be the build's longest compile by far: four files
// compile side by side, which shortens the build that tools/gpu_check.sh fits into a GPU's few
// minutes.
#pragma once

#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/float16.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"

namespace loom::cuda::elementwise_detail {

inline constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
inline constexpr double kGeluCubic = 0.044715;

// ---------------------------------------------------------------- device math (float, double)
// Named apart from the tensor functions of this namespace (exp, log, ...), which would hide
// the math library's overloads.

__device__ __forceinline__ float dev_exp(float v) { return ::expf(v); }
__device__ __forceinline__ double dev_exp(double v) { return ::exp(v); }
__device__ __forceinline__ float dev_log(float v) { return ::logf(v); }
__device__ __forceinline__ double dev_log(double v) { return ::log(v); }
__device__ __forceinline__ float dev_sqrt(float v) { return ::sqrtf(v); }
__device__ __forceinline__ double dev_sqrt(double v) { return ::sqrt(v); }
__device__ __forceinline__ float dev_tanh(float v) { return ::tanhf(v); }
__device__ __forceinline__ double dev_tanh(double v) { return ::tanh(v); }
__device__ __forceinline__ float dev_erf(float v) { return ::erff(v); }
__device__ __forceinline__ double dev_erf(double v) { return ::erf(v); }
__device__ __forceinline__ float dev_pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double dev_pow(double x, double y) { return ::pow(x, y); }

// Integer power by squaring; a negative exponent gives 1 for base 1 and 0 otherwise (as the CPU).
template <typename T>
__device__ T int_pow(T base, T exponent) {
  if constexpr (std::is_signed_v<T>) {
    if (exponent < 0) return base == 1 ? T(1) : T(0);
  }
  T result = 1;
  while (exponent) {
    if (exponent & 1) result = static_cast<T>(result * base);
    base = static_cast<T>(base * base);
    exponent = static_cast<T>(exponent >> 1);
  }
  return result;
}

template <typename T>
__device__ T generic_pow(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return dev_pow(x, y);
  else
    return int_pow(x, y);
}

// ---------------------------------------------------------------- functors

// f over elements stored as their own types and computed in their math types: 16-bit operands
// widened to float, the result rounded once to Out. A plain call for every other type.
template <typename Out, typename F>
struct InMath {
  F f;
  template <typename... V>
  __device__ Out operator()(V... v) const {
    return from_math<Out>(f(to_math(v)...));
  }
};

// f(x, v) with the scalar v already converted to the compute type (on the host, as the CPU).
template <typename F, typename T>
struct BindScalar {
  F f;
  T v;
  __device__ auto operator()(T x) const { return f(x, v); }
};

// f(double(x), s): the comparisons with a scalar compare in double.
template <typename F, typename T>
struct CompareScalar {
  F f;
  double s;
  __device__ bool operator()(T x) const { return f(static_cast<double>(x), s); }
};

// ---------------------------------------------------------------- op shapes (as the CPU's)

// All tensors on one CUDA device; sets it current for the guard's scope.
inline int device_of(const char* op, std::initializer_list<Tensor> tensors) {
  const Device d = kernels::common_device(op, tensors);
  LOOM_ASSERT(d.is_cuda(), op, ": cuda kernel called with tensors on ", d);
  return d.index;
}

// out = f(a, b) over the broadcast shape, computing in `compute`; bool output for comparisons.
template <bool kCompare, typename F>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, DType compute, const F& f) {
  DeviceGuard guard(device_of(op, {a, b}));
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  const Tensor ac = kernels::to_dtype(a, compute), bc = kernels::to_dtype(b, compute);
  Tensor out = empty(shape, kCompare ? kBool : compute, a.device(), result_format(shape, {a, b}));
  dispatch_numeric_and_16bit(compute, op, [&]<typename T>() {
    using Out = std::conditional_t<kCompare, bool, T>;
    gpu_map<Out, T>(op, out, InMath<Out, F>{f}, ac, bc);
  });
  return out;
}

template <typename F>
Tensor arithmetic(const char* op, const Tensor& a, const Tensor& b, const F& f) {
  return binary<false>(op, a, b, promote_types(a.dtype(), b.dtype()), f);
}

template <typename F>
Tensor compare(const char* op, const Tensor& a, const Tensor& b, const F& f) {
  return binary<true>(op, a, b, promote_types(a.dtype(), b.dtype()), f);
}

// Float unary op: out = f(x) in x's dtype.
template <typename F>
Tensor unary_float(const char* op, const Tensor& x, const F& f) {
  DeviceGuard guard(device_of(op, {x}));
  Tensor out = empty_like_format(x);
  dispatch_floating_and_16bit(x.dtype(), op,
                              [&]<typename T>() { gpu_map<T, T>(op, out, InMath<T, F>{f}, x); });
  return out;
}

// Unary op for any numeric dtype.
template <typename F>
Tensor unary_numeric(const char* op, const Tensor& x, const F& f) {
  DeviceGuard guard(device_of(op, {x}));
  Tensor out = empty_like_format(x);
  dispatch_numeric_and_16bit(x.dtype(), op,
                             [&]<typename T>() { gpu_map<T, T>(op, out, InMath<T, F>{f}, x); });
  return out;
}

// Fused backward: out = f(dout, saved) in dout's dtype.
template <typename F>
Tensor backward_binary(const char* op, const Tensor& dout, const Tensor& saved, const F& f) {
  DeviceGuard guard(device_of(op, {dout, saved}));
  LOOM_CHECK(dout.dtype() == saved.dtype(), DTypeError, op, ": gradient is ", dout.dtype(),
             " but the saved tensor is ", saved.dtype());
  const Shape shape = broadcast_shapes(dout.sizes(), saved.sizes(), op);
  Tensor out = empty(shape, dout.dtype(), dout.device(), result_format(shape, {dout, saved}));
  dispatch_floating_and_16bit(dout.dtype(), op, [&]<typename T>() {
    gpu_map<T, T>(op, out, InMath<T, F>{f}, dout, saved);
  });
  return out;
}

// The dtype an op with a scalar operand computes in: the tensor's, unless an integer tensor
// meets a fractional scalar (then float32, as PyTorch).
inline DType scalar_result(const Tensor& a, double s) {
  return is_integral(a.dtype()) && s != std::floor(s) ? kFloat32 : a.dtype();
}

template <typename F>
Tensor with_scalar(const char* op, const Tensor& a, double s, const F& f) {
  DeviceGuard guard(device_of(op, {a}));
  const DType t = scalar_result(a, s);
  const Tensor ac = kernels::to_dtype(a, t);
  Tensor out = empty(a.sizes(), t, a.device(), suggest_memory_format(a));
  dispatch_numeric_and_16bit(t, op, [&]<typename T>() {
    using M = math_t<T>;
    gpu_map<T, T>(op, out, InMath<T, BindScalar<F, M>>{{f, static_cast<M>(s)}}, ac);
  });
  return out;
}

template <typename F>
Tensor compare_scalar(const char* op, const Tensor& a, double s, const F& f) {
  DeviceGuard guard(device_of(op, {a}));
  Tensor out = empty(a.sizes(), kBool, a.device(), suggest_memory_format(a));
  dispatch_numeric_and_16bit(a.dtype(), op, [&]<typename T>() {
    gpu_map<bool, T>(op, out, InMath<bool, CompareScalar<F, math_t<T>>>{{f, s}}, a);
  });
  return out;
}

// In place: self = f(self, other), other broadcast to self's shape and converted to its dtype.
template <typename F>
void inplace_binary(const char* op, const Tensor& self, const Tensor& other, const F& f) {
  DeviceGuard guard(device_of(op, {self, other}));
  LOOM_CHECK(broadcast_shapes(self.sizes(), other.sizes(), op) == self.sizes(), ShapeError, op,
             ": cannot broadcast other=", other.sizes(), " into self=", self.sizes());
  const Tensor oc = kernels::to_dtype(other, self.dtype());
  self.bump_version();
  dispatch_numeric_and_16bit(
      self.dtype(), op, [&]<typename T>() { gpu_map<T, T>(op, self, InMath<T, F>{f}, self, oc); });
}

// In place with a scalar: self = f(self, value converted to self's dtype).
template <typename F>
void inplace_scalar(const char* op, const Tensor& self, double value, const F& f) {
  DeviceGuard guard(device_of(op, {self}));
  self.bump_version();
  dispatch_numeric_and_16bit(self.dtype(), op, [&]<typename T>() {
    using M = math_t<T>;
    gpu_map<T, T>(op, self, InMath<T, BindScalar<F, M>>{{f, static_cast<M>(value)}}, self);
  });
}

// In place: self = f(self, a, b) in self's float dtype (addcmul_, addcdiv_). Unlike the CPU
// loop, a and b are checked to broadcast to self: a wrong shape must not read out of bounds.
template <typename F>
void inplace_ternary(const char* op, const Tensor& self, const Tensor& a, const Tensor& b,
                     const F& f) {
  DeviceGuard guard(device_of(op, {self, a, b}));
  for (const Tensor* t : {&a, &b})
    LOOM_CHECK(broadcast_shapes(self.sizes(), t->sizes(), op) == self.sizes(), ShapeError, op,
               ": cannot broadcast ", t == &a ? "tensor1=" : "tensor2=", t->sizes(),
               " into self=", self.sizes());
  const Tensor ac = kernels::to_dtype(a, self.dtype()), bc = kernels::to_dtype(b, self.dtype());
  self.bump_version();
  dispatch_floating(self.dtype(), op,
                    [&]<typename T>() { gpu_map<T, T>(op, self, f, self, ac, bc); });
}

}  // namespace loom::cuda::elementwise_detail
