// tensor/cuda/elementwise.cu — the elementwise kernels on CUDA: each op a __device__ lambda over
// the strided map of tensor/cuda/loops.cuh (Note [CUDA elementwise loops]: one element, or one
// 4-element vector, per thread per grid-stride step). Mirrors tensor/cpu/elementwise.cpp: same
// checks, dtypes, promotion, outputs and version bumps; inputs are converted with cuda::copy_.
// float16 and bfloat16 elements are widened to float and the result rounded once (InMath, Note
// [16-bit arithmetic] in tensor/cuda/float16.h).

#include <cmath>
#include <type_traits>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/float16.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"

namespace loom::cuda {

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
constexpr double kGeluCubic = 0.044715;

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
int device_of(const char* op, std::initializer_list<Tensor> tensors) {
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
DType scalar_result(const Tensor& a, double s) {
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

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("add", a, b, [] __device__(auto x, auto y) { return x + y; });
  return arithmetic("add", a, b, [alpha] __device__(auto x, auto y) {
    return x + static_cast<decltype(y)>(alpha) * y;
  });
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("sub", a, b, [] __device__(auto x, auto y) { return x - y; });
  return arithmetic("sub", a, b, [alpha] __device__(auto x, auto y) {
    return x - static_cast<decltype(y)>(alpha) * y;
  });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return arithmetic("mul", a, b, [] __device__(auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  // True division: integers divide as float32, as in PyTorch.
  DType t = promote_types(a.dtype(), b.dtype());
  if (!is_floating(t)) t = kFloat32;
  return binary<false>("div", a, b, t, [] __device__(auto x, auto y) { return x / y; });
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return arithmetic("pow", a, b, [] __device__(auto x, auto y) { return generic_pow(x, y); });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return arithmetic("maximum", a, b, [] __device__(auto x, auto y) {
    return (x != x || x > y) ? x : y;  // NaN propagates
  });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return arithmetic("minimum", a, b,
                    [] __device__(auto x, auto y) { return (x != x || x < y) ? x : y; });
}

Tensor add_scalar(const Tensor& a, double b) {
  return with_scalar("add", a, b, [] __device__(auto x, auto v) { return x + v; });
}
Tensor mul_scalar(const Tensor& a, double b) {
  return with_scalar("mul", a, b, [] __device__(auto x, auto v) { return x * v; });
}
Tensor rsub_scalar(const Tensor& a, double b) {
  return with_scalar("rsub", a, b, [] __device__(auto x, auto v) { return v - x; });
}
Tensor div_scalar(const Tensor& a, double b) {
  const Tensor af = is_floating(a.dtype()) ? a : kernels::to_dtype(a, kFloat32);
  return with_scalar("div", af, b, [] __device__(auto x, auto v) { return x / v; });
}
Tensor pow_scalar(const Tensor& a, double exponent) {
  if (exponent == 2.0)
    return with_scalar("pow", a, exponent, [] __device__(auto x, auto) { return x * x; });
  if (exponent == 0.5 && is_floating(a.dtype()))
    return unary_float("pow", a, [] __device__(auto x) { return dev_sqrt(x); });
  return with_scalar("pow", a, exponent,
                     [] __device__(auto x, auto v) { return generic_pow(x, v); });
}

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  return compare("eq", a, b, [] __device__(auto x, auto y) { return x == y; });
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare("ne", a, b, [] __device__(auto x, auto y) { return x != y; });
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare("lt", a, b, [] __device__(auto x, auto y) { return x < y; });
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare("le", a, b, [] __device__(auto x, auto y) { return x <= y; });
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare("gt", a, b, [] __device__(auto x, auto y) { return x > y; });
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare("ge", a, b, [] __device__(auto x, auto y) { return x >= y; });
}
Tensor eq_scalar(const Tensor& a, double b) {
  return compare_scalar("eq", a, b, [] __device__(double x, double y) { return x == y; });
}
Tensor gt_scalar(const Tensor& a, double b) {
  return compare_scalar("gt", a, b, [] __device__(double x, double y) { return x > y; });
}
Tensor lt_scalar(const Tensor& a, double b) {
  return compare_scalar("lt", a, b, [] __device__(double x, double y) { return x < y; });
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  return unary_numeric("neg", x, [] __device__(auto v) { return -v; });
}
Tensor abs(const Tensor& x) {
  return unary_numeric("abs", x, [] __device__(auto v) {
    if constexpr (std::is_unsigned_v<decltype(v)>)
      return v;  // uint8 (spelled apart: nvcc warns on an unsigned v < 0)
    else
      return v < 0 ? -v : v;
  });
}
Tensor sign(const Tensor& x) {
  return unary_numeric("sign", x, [] __device__(auto v) {
    if constexpr (std::is_unsigned_v<decltype(v)>)
      return static_cast<int>(v > 0);
    else
      return (v > 0) - (v < 0);
  });
}
Tensor exp(const Tensor& x) {
  return unary_float("exp", x, [] __device__(auto v) { return dev_exp(v); });
}
Tensor log(const Tensor& x) {
  return unary_float("log", x, [] __device__(auto v) { return dev_log(v); });
}
Tensor sqrt(const Tensor& x) {
  return unary_float("sqrt", x, [] __device__(auto v) { return dev_sqrt(v); });
}
Tensor rsqrt(const Tensor& x) {
  return unary_float("rsqrt", x, [] __device__(auto v) { return decltype(v)(1) / dev_sqrt(v); });
}
Tensor tanh(const Tensor& x) {
  return unary_float("tanh", x, [] __device__(auto v) { return dev_tanh(v); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_float("sigmoid", x, [] __device__(auto v) {
    using T = decltype(v);
    return T(1) / (T(1) + dev_exp(-v));
  });
}
Tensor relu(const Tensor& x) {
  return unary_numeric("relu", x, [] __device__(auto v) { return v > 0 ? v : decltype(v)(0); });
}
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  if (tanh_approximation) {
    return unary_float("gelu", x, [] __device__(auto v) {
      using T = decltype(v);
      const T inner = T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v);
      return T(0.5) * v * (T(1) + dev_tanh(inner));
    });
  }
  return unary_float("gelu", x, [] __device__(auto v) {
    using T = decltype(v);
    return T(0.5) * v * (T(1) + dev_erf(v * T(kSqrt1_2)));
  });
}
Tensor clamp(const Tensor& x, double min, double max) {
  LOOM_CHECK(!(min > max), ValueError, "clamp: min ", min, " is greater than max ", max);
  return unary_numeric("clamp", x, [min, max] __device__(auto v) {
    using T = decltype(v);
    if (v != v) return v;  // NaN stays NaN
    const double d = static_cast<double>(v);
    return d < min ? static_cast<T>(min) : d > max ? static_cast<T>(max) : v;
  });
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  DeviceGuard guard(device_of("where", {condition, a, b}));
  LOOM_CHECK(condition.dtype() == kBool, DTypeError, "where: condition must be bool; got ",
             condition.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType t = promote_types(a.dtype(), b.dtype());
  const Tensor ac = kernels::to_dtype(a, t), bc = kernels::to_dtype(b, t);
  Tensor out = empty(shape, t, a.device(), result_format(shape, {condition, a, b}));
  // The condition is read as bool (the CPU converts it to T and tests != 0: the same).
  const auto select = [] __device__(bool c, auto x, auto y) { return c ? x : y; };
  dispatch_numeric_and_16bit(t, "where", [&]<typename T>() {
    gpu_map_mixed<T, bool, T, T>("where", out, InMath<T, decltype(select)>{select}, condition, ac,
                                 bc);
  });
  return out;
}

// ---------------------------------------------------------------- fused backwards

Tensor relu_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("relu_backward", dout, out,
                         [] __device__(auto g, auto y) { return y > 0 ? g : decltype(g)(0); });
}
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("sigmoid_backward", dout, out,
                         [] __device__(auto g, auto y) { return g * y * (decltype(g)(1) - y); });
}
Tensor tanh_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("tanh_backward", dout, out,
                         [] __device__(auto g, auto y) { return g * (decltype(g)(1) - y * y); });
}
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation) {
  if (tanh_approximation) {
    // d/dx 0.5x(1+tanh(u)), u = k(x + c x^3): 0.5(1+t) + 0.5x(1-t^2) k (1 + 3c x^2)
    return backward_binary("gelu_backward", dout, x, [] __device__(auto g, auto v) {
      using T = decltype(g);
      const T t = dev_tanh(T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v));
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v * v);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
    });
  }
  // d/dx x Phi(x) = Phi(x) + x phi(x)
  return backward_binary("gelu_backward", dout, x, [] __device__(auto g, auto v) {
    using T = decltype(g);
    const T cdf = T(0.5) * (T(1) + dev_erf(v * T(kSqrt1_2)));
    const T pdf = T(kInvSqrt2Pi) * dev_exp(T(-0.5) * v * v);
    return g * (cdf + v * pdf);
  });
}
Tensor clamp_backward(const Tensor& dout, const Tensor& x, double min, double max) {
  return backward_binary("clamp_backward", dout, x, [min, max] __device__(auto g, auto v) {
    const double d = static_cast<double>(v);
    return d >= min && d <= max ? g : decltype(g)(0);
  });
}

// ---------------------------------------------------------------- in place

void add_(const Tensor& self, const Tensor& other, double alpha) {
  if (alpha == 1.0)
    return inplace_binary("add_", self, other, [] __device__(auto x, auto y) { return x + y; });
  inplace_binary("add_", self, other, [alpha] __device__(auto x, auto y) {
    return x + static_cast<decltype(x)>(alpha) * y;
  });
}
void sub_(const Tensor& self, const Tensor& other, double alpha) {
  inplace_binary("sub_", self, other, [alpha] __device__(auto x, auto y) {
    return x - static_cast<decltype(x)>(alpha) * y;
  });
}
void mul_(const Tensor& self, const Tensor& other) {
  inplace_binary("mul_", self, other, [] __device__(auto x, auto y) { return x * y; });
}
void div_(const Tensor& self, const Tensor& other) {
  LOOM_CHECK(is_floating(self.dtype()), DTypeError, "div_: true division cannot write into a ",
             self.dtype(), " tensor");
  inplace_binary("div_", self, other, [] __device__(auto x, auto y) { return x / y; });
}
void mul_scalar_(const Tensor& self, double value) {
  inplace_scalar("mul_", self, value, [] __device__(auto x, auto v) { return x * v; });
}
void add_scalar_(const Tensor& self, double value) {
  inplace_scalar("add_", self, value, [] __device__(auto x, auto v) { return x + v; });
}

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  inplace_ternary("addcmul_", self, a, b, [alpha] __device__(auto x, auto p, auto q) {
    using T = decltype(x);
    return x + static_cast<T>(alpha) * p * q;
  });
}
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  inplace_ternary("addcdiv_", self, a, b, [alpha] __device__(auto x, auto p, auto q) {
    using T = decltype(x);
    return x + static_cast<T>(alpha) * p / q;
  });
}

}  // namespace loom::cuda
