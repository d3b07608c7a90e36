// tensor/cpu/elementwise.cpp — the elementwise loops on the CPU, every one a lambda over the
// strided loop of tensor/cpu/loops.h, in float32, float64 or an integer type. The front
// (tensor/elementwise.cpp) checks the arguments, switches devices and widens 16-bit types.

#include "tensor/cpu/elementwise.h"

#include <cmath>

#include "tensor/copy.h"
#include "tensor/cpu/loops.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/dispatch.h"

namespace loom::cpu {

namespace {

using kernels::to_dtype;

constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2*pi)

// out = f(a, b) over the broadcast shape, computing in the promoted dtype `compute`; the output
// is bool for comparisons (kCompare), else of dtype `compute`.
template <bool kCompare, typename F>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, DType compute, F f) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  const Tensor ac = to_dtype(a, compute), bc = to_dtype(b, compute);
  Tensor out = empty(shape, kCompare ? kBool : compute, a.device(), result_format(shape, {a, b}));
  dispatch_numeric(compute, op, [&]<typename T>() {
    using Out = std::conditional_t<kCompare, bool, T>;
    cpu::map<Out, T>(
        out, [&](T x, T y) { return static_cast<Out>(f(x, y)); }, ac, bc);
  });
  return out;
}

template <typename F>
Tensor arithmetic(const char* op, const Tensor& a, const Tensor& b, F f) {
  return binary<false>(op, a, b, promote_types(a.dtype(), b.dtype()), f);
}

template <typename F>
Tensor compare(const char* op, const Tensor& a, const Tensor& b, F f) {
  return binary<true>(op, a, b, promote_types(a.dtype(), b.dtype()), f);
}

// Float unary op: out = f(x) in x's dtype.
template <typename F>
Tensor unary_float(const char* op, const Tensor& x, F f) {
  Tensor out = empty_like_format(x);
  dispatch_floating(x.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, x); });
  return out;
}

// Unary op for any numeric dtype.
template <typename F>
Tensor unary_numeric(const char* op, const Tensor& x, F f) {
  Tensor out = empty_like_format(x);
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    cpu::map<T, T>(
        out, [&](T v) { return static_cast<T>(f(v)); }, x);
  });
  return out;
}

// Fused backward: out = f(dout, saved) in dout's dtype.
template <typename F>
Tensor backward_binary(const char* op, const Tensor& dout, const Tensor& saved, F f) {
  const Shape shape = broadcast_shapes(dout.sizes(), saved.sizes(), op);
  Tensor out = empty(shape, dout.dtype(), dout.device(), result_format(shape, {dout, saved}));
  dispatch_floating(dout.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, dout, saved); });
  return out;
}

// The dtype an op with a scalar operand computes in: the tensor's, unless an integer tensor
// meets a fractional scalar (then float32, as PyTorch).
DType scalar_result(const Tensor& a, double s) {
  return is_integral(a.dtype()) && s != std::floor(s) ? kFloat32 : a.dtype();
}

template <typename F>
Tensor with_scalar(const char* op, const Tensor& a, double s, F f) {
  const DType t = scalar_result(a, s);
  const Tensor ac = to_dtype(a, t);
  Tensor out = empty(a.sizes(), t, a.device(), suggest_memory_format(a));
  dispatch_numeric(t, op, [&]<typename T>() {
    const T v = static_cast<T>(s);
    cpu::map<T, T>(
        out, [&](T x) { return static_cast<T>(f(x, v)); }, ac);
  });
  return out;
}

template <typename F>
Tensor compare_scalar(const char* op, const Tensor& a, double s, F f) {
  Tensor out = empty(a.sizes(), kBool, a.device(), suggest_memory_format(a));
  dispatch_numeric(a.dtype(), op, [&]<typename T>() {
    cpu::map<bool, T>(
        out, [&](T x) { return f(static_cast<double>(x), s); }, a);
  });
  return out;
}

// In place: self = f(self, other) with other broadcast to self's shape and converted to its dtype.
template <typename F>
void inplace_binary(const char* op, const Tensor& self, const Tensor& other, F f) {
  const Tensor oc = to_dtype(other, self.dtype());
  self.bump_version();
  dispatch_numeric(self.dtype(), op, [&]<typename T>() {
    cpu::map<T, T>(
        self, [&](T x, T y) { return static_cast<T>(f(x, y)); }, self, oc);
  });
}

template <typename T>
T int_pow(T base, T exp) {
  if (exp < 0) return base == 1 ? 1 : 0;
  T result = 1;
  while (exp) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}

template <typename T>
T generic_pow(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return std::pow(x, y);
  else
    return int_pow(x, y);
}

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("add", a, b, [](auto x, auto y) { return x + y; });
  return arithmetic("add", a, b,
                    [alpha](auto x, auto y) { return x + static_cast<decltype(y)>(alpha) * y; });
}
Tensor add_bfloat16(const Tensor& a, const Tensor& b, double alpha) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "add");
  Tensor out = empty(shape, kBFloat16, a.device(), result_format(shape, {a, b}));
  const float scale = static_cast<float>(alpha);
  if (alpha == 1.0)
    cpu::map<BFloat16, BFloat16>(
        out, [](BFloat16 x, BFloat16 y) { return BFloat16(float(x) + float(y)); }, a, b);
  else
    cpu::map<BFloat16, BFloat16>(
        out, [scale](BFloat16 x, BFloat16 y) { return BFloat16(float(x) + scale * float(y)); }, a,
        b);
  return out;
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) return arithmetic("sub", a, b, [](auto x, auto y) { return x - y; });
  return arithmetic("sub", a, b,
                    [alpha](auto x, auto y) { return x - static_cast<decltype(y)>(alpha) * y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return arithmetic("mul", a, b, [](auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  // True division: integers divide as float32, as in PyTorch.
  DType t = promote_types(a.dtype(), b.dtype());
  if (!is_floating(t)) t = kFloat32;
  return binary<false>("div", a, b, t, [](auto x, auto y) { return x / y; });
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return arithmetic("pow", a, b, [](auto x, auto y) { return generic_pow(x, y); });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return arithmetic("maximum", a, b, [](auto x, auto y) {
    return (x != x || x > y) ? x : y;  // NaN propagates
  });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return arithmetic("minimum", a, b, [](auto x, auto y) { return (x != x || x < y) ? x : y; });
}

Tensor add_scalar(const Tensor& a, double b) {
  return with_scalar("add", a, b, [](auto x, auto v) { return x + v; });
}
Tensor mul_scalar(const Tensor& a, double b) {
  return with_scalar("mul", a, b, [](auto x, auto v) { return x * v; });
}
Tensor rsub_scalar(const Tensor& a, double b) {
  return with_scalar("rsub", a, b, [](auto x, auto v) { return v - x; });
}
Tensor div_scalar(const Tensor& a, double b) {
  const Tensor af = is_floating(a.dtype()) ? a : to_dtype(a, kFloat32);
  return with_scalar("div", af, b, [](auto x, auto v) { return x / v; });
}
Tensor pow_scalar(const Tensor& a, double exponent) {
  if (exponent == 2.0) return with_scalar("pow", a, exponent, [](auto x, auto) { return x * x; });
  if (exponent == 0.5 && is_floating(a.dtype()))
    return unary_float("pow", a, [](auto x) { return std::sqrt(x); });
  return with_scalar("pow", a, exponent, [](auto x, auto v) { return generic_pow(x, v); });
}

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  return compare("eq", a, b, [](auto x, auto y) { return x == y; });
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare("ne", a, b, [](auto x, auto y) { return x != y; });
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare("lt", a, b, [](auto x, auto y) { return x < y; });
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare("le", a, b, [](auto x, auto y) { return x <= y; });
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare("gt", a, b, [](auto x, auto y) { return x > y; });
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare("ge", a, b, [](auto x, auto y) { return x >= y; });
}
Tensor eq_scalar(const Tensor& a, double b) {
  return compare_scalar("eq", a, b, [](double x, double y) { return x == y; });
}
Tensor gt_scalar(const Tensor& a, double b) {
  return compare_scalar("gt", a, b, [](double x, double y) { return x > y; });
}
Tensor lt_scalar(const Tensor& a, double b) {
  return compare_scalar("lt", a, b, [](double x, double y) { return x < y; });
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  return unary_numeric("neg", x, [](auto v) { return -v; });
}
Tensor abs(const Tensor& x) {
  return unary_numeric("abs", x, [](auto v) { return v < 0 ? -v : v; });
}
Tensor sign(const Tensor& x) {
  return unary_numeric("sign", x, [](auto v) { return (v > 0) - (v < 0); });
}
Tensor exp(const Tensor& x) {
  return unary_float("exp", x, [](auto v) { return std::exp(v); });
}
Tensor log(const Tensor& x) {
  return unary_float("log", x, [](auto v) { return std::log(v); });
}
Tensor sqrt(const Tensor& x) {
  return unary_float("sqrt", x, [](auto v) { return std::sqrt(v); });
}
Tensor rsqrt(const Tensor& x) {
  return unary_float("rsqrt", x, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
}
Tensor tanh(const Tensor& x) {
  return unary_float("tanh", x, [](auto v) { return std::tanh(v); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_float("sigmoid", x, [](auto v) {
    using T = decltype(v);
    return T(1) / (T(1) + std::exp(-v));
  });
}
Tensor relu(const Tensor& x) {
  return unary_numeric("relu", x, [](auto v) { return v > 0 ? v : decltype(v)(0); });
}
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  if (tanh_approximation) {
    return unary_float("gelu", x, [](auto v) {
      using T = decltype(v);
      if constexpr (std::is_same_v<T, float>) return gelu_tanh_float(v);
      const T inner = T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v);
      return T(0.5) * v * (T(1) + std::tanh(inner));
    });
  }
  return unary_float("gelu", x, [](auto v) {
    using T = decltype(v);
    return T(0.5) * v * (T(1) + std::erf(v * T(kSqrt1_2)));
  });
}
Tensor clamp(const Tensor& x, double min, double max) {
  return unary_numeric("clamp", x, [min, max](auto v) {
    using T = decltype(v);
    if (v != v) return v;  // NaN stays NaN
    const double d = static_cast<double>(v);
    return d < min ? static_cast<T>(min) : d > max ? static_cast<T>(max) : v;
  });
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const Shape shape =
      broadcast_shapes(broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType t = promote_types(a.dtype(), b.dtype());
  const Tensor ac = to_dtype(a, t), bc = to_dtype(b, t), cc = to_dtype(condition, t);
  Tensor out = empty(shape, t, a.device(), result_format(shape, {condition, a, b}));
  dispatch_numeric(t, "where", [&]<typename T>() {
    cpu::map<T, T>(
        out, [](T c, T x, T y) { return c != T(0) ? x : y; }, cc, ac, bc);
  });
  return out;
}

// ---------------------------------------------------------------- fused backwards

Tensor relu_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("relu_backward", dout, out,
                         [](auto g, auto y) { return y > 0 ? g : decltype(g)(0); });
}
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("sigmoid_backward", dout, out,
                         [](auto g, auto y) { return g * y * (decltype(g)(1) - y); });
}
Tensor tanh_backward(const Tensor& dout, const Tensor& out) {
  return backward_binary("tanh_backward", dout, out,
                         [](auto g, auto y) { return g * (decltype(g)(1) - y * y); });
}
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation) {
  if (tanh_approximation) {
    // d/dx 0.5x(1+tanh(u)), u = k(x + c x^3): 0.5(1+t) + 0.5x(1-t^2) k (1 + 3c x^2)
    return backward_binary("gelu_backward", dout, x, [](auto g, auto v) {
      using T = decltype(g);
      if constexpr (std::is_same_v<T, float>) return gelu_tanh_backward_float(g, v);
      const T t = std::tanh(T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v));
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v * v);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
    });
  }
  // d/dx x Phi(x) = Phi(x) + x phi(x)
  return backward_binary("gelu_backward", dout, x, [](auto g, auto v) {
    using T = decltype(g);
    const T cdf = T(0.5) * (T(1) + std::erf(v * T(kSqrt1_2)));
    const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
    return g * (cdf + v * pdf);
  });
}
Tensor clamp_backward(const Tensor& dout, const Tensor& x, double min, double max) {
  return backward_binary("clamp_backward", dout, x, [min, max](auto g, auto v) {
    const double d = static_cast<double>(v);
    return d >= min && d <= max ? g : decltype(g)(0);
  });
}

// ---------------------------------------------------------------- in place

void add_(const Tensor& self, const Tensor& other, double alpha) {
  if (alpha == 1.0)
    return inplace_binary("add_", self, other, [](auto x, auto y) { return x + y; });
  inplace_binary("add_", self, other,
                 [alpha](auto x, auto y) { return x + static_cast<decltype(x)>(alpha) * y; });
}
void sub_(const Tensor& self, const Tensor& other, double alpha) {
  inplace_binary("sub_", self, other,
                 [alpha](auto x, auto y) { return x - static_cast<decltype(x)>(alpha) * y; });
}
void mul_(const Tensor& self, const Tensor& other) {
  inplace_binary("mul_", self, other, [](auto x, auto y) { return x * y; });
}
void div_(const Tensor& self, const Tensor& other) {
  inplace_binary("div_", self, other, [](auto x, auto y) { return x / y; });
}
void mul_scalar_(const Tensor& self, double value) {
  self.bump_version();
  dispatch_numeric(self.dtype(), "mul_", [&]<typename T>() {
    const T v = static_cast<T>(value);
    cpu::map<T, T>(
        self, [v](T x) { return static_cast<T>(x * v); }, self);
  });
}
void add_scalar_(const Tensor& self, double value) {
  self.bump_version();
  dispatch_numeric(self.dtype(), "add_", [&]<typename T>() {
    const T v = static_cast<T>(value);
    cpu::map<T, T>(
        self, [v](T x) { return static_cast<T>(x + v); }, self);
  });
}

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  const Tensor ac = to_dtype(a, self.dtype()), bc = to_dtype(b, self.dtype());
  self.bump_version();
  dispatch_floating(self.dtype(), "addcmul_", [&]<typename T>() {
    const T s = static_cast<T>(alpha);
    cpu::map<T, T>(
        self, [s](T x, T p, T q) { return x + s * p * q; }, self, ac, bc);
  });
}
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  const Tensor ac = to_dtype(a, self.dtype()), bc = to_dtype(b, self.dtype());
  self.bump_version();
  dispatch_floating(self.dtype(), "addcdiv_", [&]<typename T>() {
    const T s = static_cast<T>(alpha);
    cpu::map<T, T>(
        self, [s](T x, T p, T q) { return x + s * p / q; }, self, ac, bc);
  });
}

}  // namespace loom::cpu
