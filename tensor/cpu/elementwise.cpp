// tensor/cpu/elementwise.cpp — elementwise kernels on the CPU, every one a lambda over the
// strided loop of tensor/cpu/loops.h; the device switch is the first line of each public entry.
//
// float16 and bfloat16 (Note [16-bit arithmetic] in tensor/cuda/float16.h): each operand is
// widened to float32 in one pass (F16C for float16), the float32 kernel runs, and the result is
// rounded once on the way back. The bits are those of CUDA's per-element widen-compute-round; a
// per-element software rounding inside the loop ran the fp16 training step at half the speed of
// float32. The optimizers' addcmul_ and addcdiv_ take float32 and float64 only.

#include "tensor/elementwise.h"

#include <cmath>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/loops.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"

namespace loom::kernels {

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
constexpr double kGeluCubic = 0.044715;

Device cpu_only(const char* op, std::initializer_list<Tensor> tensors) {
  Device d = common_device(op, tensors);
  LOOM_ASSERT(d.is_cpu(), op, ": a CUDA operand missed the device switch");
  return d;
}

// out = f(a, b) over the broadcast shape, computing in the promoted dtype `compute`; the output
// is bool for comparisons (kCompare), else of dtype `compute`.
template <bool kCompare, typename F>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, DType compute, F f) {
  cpu_only(op, {a, b});
  if (is_16bit_float(compute)) {
    const Tensor r = binary<kCompare>(op, widened(to_dtype(a, compute)),
                                      widened(to_dtype(b, compute)), kFloat32, f);
    return kCompare ? r : to_dtype(r, compute);
  }
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
  cpu_only(op, {x});
  if (is_16bit_float(x.dtype())) return to_dtype(unary_float(op, widened(x), f), x.dtype());
  Tensor out = empty_like_format(x);
  dispatch_floating(x.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, x); });
  return out;
}

// Unary op for any numeric dtype.
template <typename F>
Tensor unary_numeric(const char* op, const Tensor& x, F f) {
  cpu_only(op, {x});
  if (is_16bit_float(x.dtype())) return to_dtype(unary_numeric(op, widened(x), f), x.dtype());
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
  cpu_only(op, {dout, saved});
  LOOM_CHECK(dout.dtype() == saved.dtype(), DTypeError, op, ": gradient is ", dout.dtype(),
             " but the saved tensor is ", saved.dtype());
  if (is_16bit_float(dout.dtype()))
    return to_dtype(backward_binary(op, widened(dout), widened(saved), f), dout.dtype());
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
  cpu_only(op, {a});
  if (is_16bit_float(a.dtype())) return to_dtype(with_scalar(op, widened(a), s, f), a.dtype());
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
  cpu_only(op, {a});
  if (is_16bit_float(a.dtype())) return compare_scalar(op, widened(a), s, f);
  Tensor out = empty(a.sizes(), kBool, a.device(), suggest_memory_format(a));
  dispatch_numeric(a.dtype(), op, [&]<typename T>() {
    cpu::map<bool, T>(
        out, [&](T x) { return f(static_cast<double>(x), s); }, a);
  });
  return out;
}

// A 16-bit self updated in place through a float32 copy: update(wide), then one rounding back.
template <typename Update>
void in_float32(const Tensor& self, Update update) {
  const Tensor wide = widened(self);
  update(wide);
  copy_(self, wide);  // bumps self's version
}

// In place: self = f(self, other) with other broadcast to self's shape and converted to its dtype.
template <typename F>
void inplace_binary(const char* op, const Tensor& self, const Tensor& other, F f) {
  cpu_only(op, {self, other});
  LOOM_CHECK(broadcast_shapes(self.sizes(), other.sizes(), op) == self.sizes(), ShapeError, op,
             ": cannot broadcast other=", other.sizes(), " into self=", self.sizes());
  const Tensor oc = to_dtype(other, self.dtype());
  if (is_16bit_float(self.dtype()))
    return in_float32(self, [&](const Tensor& wide) { inplace_binary(op, wide, oc, f); });
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
  if (on_cuda("add", {a, b})) return cuda_backend().add(a, b, alpha);
  if (alpha == 1.0) return arithmetic("add", a, b, [](auto x, auto y) { return x + y; });
  return arithmetic("add", a, b,
                    [alpha](auto x, auto y) { return x + static_cast<decltype(y)>(alpha) * y; });
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (on_cuda("sub", {a, b})) return cuda_backend().sub(a, b, alpha);
  if (alpha == 1.0) return arithmetic("sub", a, b, [](auto x, auto y) { return x - y; });
  return arithmetic("sub", a, b,
                    [alpha](auto x, auto y) { return x - static_cast<decltype(y)>(alpha) * y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  if (on_cuda("mul", {a, b})) return cuda_backend().mul(a, b);
  return arithmetic("mul", a, b, [](auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  if (on_cuda("div", {a, b})) return cuda_backend().div(a, b);
  // True division: integers divide as float32, as in PyTorch.
  DType t = promote_types(a.dtype(), b.dtype());
  if (!is_floating(t)) t = kFloat32;
  return binary<false>("div", a, b, t, [](auto x, auto y) { return x / y; });
}
Tensor pow(const Tensor& a, const Tensor& b) {
  if (on_cuda("pow", {a, b})) return cuda_backend().pow(a, b);
  return arithmetic("pow", a, b, [](auto x, auto y) { return generic_pow(x, y); });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  if (on_cuda("maximum", {a, b})) return cuda_backend().maximum(a, b);
  return arithmetic("maximum", a, b, [](auto x, auto y) {
    return (x != x || x > y) ? x : y;  // NaN propagates
  });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  if (on_cuda("minimum", {a, b})) return cuda_backend().minimum(a, b);
  return arithmetic("minimum", a, b, [](auto x, auto y) { return (x != x || x < y) ? x : y; });
}

Tensor add_scalar(const Tensor& a, double b) {
  if (on_cuda("add_scalar", {a})) return cuda_backend().add_scalar(a, b);
  return with_scalar("add", a, b, [](auto x, auto v) { return x + v; });
}
Tensor mul_scalar(const Tensor& a, double b) {
  if (on_cuda("mul_scalar", {a})) return cuda_backend().mul_scalar(a, b);
  return with_scalar("mul", a, b, [](auto x, auto v) { return x * v; });
}
Tensor rsub_scalar(const Tensor& a, double b) {
  if (on_cuda("rsub_scalar", {a})) return cuda_backend().rsub_scalar(a, b);
  return with_scalar("rsub", a, b, [](auto x, auto v) { return v - x; });
}
Tensor div_scalar(const Tensor& a, double b) {
  if (on_cuda("div_scalar", {a})) return cuda_backend().div_scalar(a, b);
  const Tensor af = is_floating(a.dtype()) ? a : to_dtype(a, kFloat32);
  return with_scalar("div", af, b, [](auto x, auto v) { return x / v; });
}
Tensor pow_scalar(const Tensor& a, double exponent) {
  if (on_cuda("pow_scalar", {a})) return cuda_backend().pow_scalar(a, exponent);
  if (exponent == 2.0) return with_scalar("pow", a, exponent, [](auto x, auto) { return x * x; });
  if (exponent == 0.5 && is_floating(a.dtype()))
    return unary_float("pow", a, [](auto x) { return std::sqrt(x); });
  return with_scalar("pow", a, exponent, [](auto x, auto v) { return generic_pow(x, v); });
}

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  if (on_cuda("eq", {a, b})) return cuda_backend().eq(a, b);
  return compare("eq", a, b, [](auto x, auto y) { return x == y; });
}
Tensor ne(const Tensor& a, const Tensor& b) {
  if (on_cuda("ne", {a, b})) return cuda_backend().ne(a, b);
  return compare("ne", a, b, [](auto x, auto y) { return x != y; });
}
Tensor lt(const Tensor& a, const Tensor& b) {
  if (on_cuda("lt", {a, b})) return cuda_backend().lt(a, b);
  return compare("lt", a, b, [](auto x, auto y) { return x < y; });
}
Tensor le(const Tensor& a, const Tensor& b) {
  if (on_cuda("le", {a, b})) return cuda_backend().le(a, b);
  return compare("le", a, b, [](auto x, auto y) { return x <= y; });
}
Tensor gt(const Tensor& a, const Tensor& b) {
  if (on_cuda("gt", {a, b})) return cuda_backend().gt(a, b);
  return compare("gt", a, b, [](auto x, auto y) { return x > y; });
}
Tensor ge(const Tensor& a, const Tensor& b) {
  if (on_cuda("ge", {a, b})) return cuda_backend().ge(a, b);
  return compare("ge", a, b, [](auto x, auto y) { return x >= y; });
}
Tensor eq_scalar(const Tensor& a, double b) {
  if (on_cuda("eq_scalar", {a})) return cuda_backend().eq_scalar(a, b);
  return compare_scalar("eq", a, b, [](double x, double y) { return x == y; });
}
Tensor gt_scalar(const Tensor& a, double b) {
  if (on_cuda("gt_scalar", {a})) return cuda_backend().gt_scalar(a, b);
  return compare_scalar("gt", a, b, [](double x, double y) { return x > y; });
}
Tensor lt_scalar(const Tensor& a, double b) {
  if (on_cuda("lt_scalar", {a})) return cuda_backend().lt_scalar(a, b);
  return compare_scalar("lt", a, b, [](double x, double y) { return x < y; });
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  if (on_cuda("neg", {x})) return cuda_backend().neg(x);
  return unary_numeric("neg", x, [](auto v) { return -v; });
}
Tensor abs(const Tensor& x) {
  if (on_cuda("abs", {x})) return cuda_backend().abs(x);
  return unary_numeric("abs", x, [](auto v) { return v < 0 ? -v : v; });
}
Tensor sign(const Tensor& x) {
  if (on_cuda("sign", {x})) return cuda_backend().sign(x);
  return unary_numeric("sign", x, [](auto v) { return (v > 0) - (v < 0); });
}
Tensor exp(const Tensor& x) {
  if (on_cuda("exp", {x})) return cuda_backend().exp(x);
  return unary_float("exp", x, [](auto v) { return std::exp(v); });
}
Tensor log(const Tensor& x) {
  if (on_cuda("log", {x})) return cuda_backend().log(x);
  return unary_float("log", x, [](auto v) { return std::log(v); });
}
Tensor sqrt(const Tensor& x) {
  if (on_cuda("sqrt", {x})) return cuda_backend().sqrt(x);
  return unary_float("sqrt", x, [](auto v) { return std::sqrt(v); });
}
Tensor rsqrt(const Tensor& x) {
  if (on_cuda("rsqrt", {x})) return cuda_backend().rsqrt(x);
  return unary_float("rsqrt", x, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
}
Tensor tanh(const Tensor& x) {
  if (on_cuda("tanh", {x})) return cuda_backend().tanh(x);
  return unary_float("tanh", x, [](auto v) { return std::tanh(v); });
}
Tensor sigmoid(const Tensor& x) {
  if (on_cuda("sigmoid", {x})) return cuda_backend().sigmoid(x);
  return unary_float("sigmoid", x, [](auto v) {
    using T = decltype(v);
    return T(1) / (T(1) + std::exp(-v));
  });
}
Tensor relu(const Tensor& x) {
  if (on_cuda("relu", {x})) return cuda_backend().relu(x);
  return unary_numeric("relu", x, [](auto v) { return v > 0 ? v : decltype(v)(0); });
}
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  if (on_cuda("gelu", {x})) return cuda_backend().gelu(x, tanh_approximation);
  if (tanh_approximation) {
    return unary_float("gelu", x, [](auto v) {
      using T = decltype(v);
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
  if (on_cuda("clamp", {x})) return cuda_backend().clamp(x, min, max);
  LOOM_CHECK(!(min > max), ValueError, "clamp: min ", min, " is greater than max ", max);
  return unary_numeric("clamp", x, [min, max](auto v) {
    using T = decltype(v);
    if (v != v) return v;  // NaN stays NaN
    const double d = static_cast<double>(v);
    return d < min ? static_cast<T>(min) : d > max ? static_cast<T>(max) : v;
  });
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  if (on_cuda("where", {condition, a, b})) return cuda_backend().where(condition, a, b);
  cpu_only("where", {condition, a, b});
  LOOM_CHECK(condition.dtype() == kBool, DTypeError, "where: condition must be bool; got ",
             condition.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType t = promote_types(a.dtype(), b.dtype());
  if (is_16bit_float(t))
    return to_dtype(where(condition, widened(to_dtype(a, t)), widened(to_dtype(b, t))), t);
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
  if (on_cuda("relu_backward", {dout, out})) return cuda_backend().relu_backward(dout, out);
  return backward_binary("relu_backward", dout, out,
                         [](auto g, auto y) { return y > 0 ? g : decltype(g)(0); });
}
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out) {
  if (on_cuda("sigmoid_backward", {dout, out})) return cuda_backend().sigmoid_backward(dout, out);
  return backward_binary("sigmoid_backward", dout, out,
                         [](auto g, auto y) { return g * y * (decltype(g)(1) - y); });
}
Tensor tanh_backward(const Tensor& dout, const Tensor& out) {
  if (on_cuda("tanh_backward", {dout, out})) return cuda_backend().tanh_backward(dout, out);
  return backward_binary("tanh_backward", dout, out,
                         [](auto g, auto y) { return g * (decltype(g)(1) - y * y); });
}
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation) {
  if (on_cuda("gelu_backward", {dout, x}))
    return cuda_backend().gelu_backward(dout, x, tanh_approximation);
  if (tanh_approximation) {
    // d/dx 0.5x(1+tanh(u)), u = k(x + c x^3): 0.5(1+t) + 0.5x(1-t^2) k (1 + 3c x^2)
    return backward_binary("gelu_backward", dout, x, [](auto g, auto v) {
      using T = decltype(g);
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
  if (on_cuda("clamp_backward", {dout, x})) return cuda_backend().clamp_backward(dout, x, min, max);
  return backward_binary("clamp_backward", dout, x, [min, max](auto g, auto v) {
    const double d = static_cast<double>(v);
    return d >= min && d <= max ? g : decltype(g)(0);
  });
}

// ---------------------------------------------------------------- in place

void add_(const Tensor& self, const Tensor& other, double alpha) {
  check_no_overlap("add_", self, {other});
  if (on_cuda("add_", {self, other})) return cuda_backend().add_(self, other, alpha);
  if (alpha == 1.0)
    return inplace_binary("add_", self, other, [](auto x, auto y) { return x + y; });
  inplace_binary("add_", self, other,
                 [alpha](auto x, auto y) { return x + static_cast<decltype(x)>(alpha) * y; });
}
void sub_(const Tensor& self, const Tensor& other, double alpha) {
  check_no_overlap("sub_", self, {other});
  if (on_cuda("sub_", {self, other})) return cuda_backend().sub_(self, other, alpha);
  inplace_binary("sub_", self, other,
                 [alpha](auto x, auto y) { return x - static_cast<decltype(x)>(alpha) * y; });
}
void mul_(const Tensor& self, const Tensor& other) {
  check_no_overlap("mul_", self, {other});
  if (on_cuda("mul_", {self, other})) return cuda_backend().mul_(self, other);
  inplace_binary("mul_", self, other, [](auto x, auto y) { return x * y; });
}
void div_(const Tensor& self, const Tensor& other) {
  check_no_overlap("div_", self, {other});
  if (on_cuda("div_", {self, other})) return cuda_backend().div_(self, other);
  LOOM_CHECK(is_floating(self.dtype()), DTypeError, "div_: true division cannot write into a ",
             self.dtype(), " tensor");
  inplace_binary("div_", self, other, [](auto x, auto y) { return x / y; });
}
void mul_scalar_(const Tensor& self, double value) {
  check_no_overlap("mul_scalar_", self, {});
  if (on_cuda("mul_scalar_", {self})) return cuda_backend().mul_scalar_(self, value);
  cpu_only("mul_", {self});
  if (is_16bit_float(self.dtype()))
    return in_float32(self, [&](const Tensor& wide) { mul_scalar_(wide, value); });
  self.bump_version();
  dispatch_numeric(self.dtype(), "mul_", [&]<typename T>() {
    const T v = static_cast<T>(value);
    cpu::map<T, T>(
        self, [v](T x) { return static_cast<T>(x * v); }, self);
  });
}
void add_scalar_(const Tensor& self, double value) {
  check_no_overlap("add_scalar_", self, {});
  if (on_cuda("add_scalar_", {self})) return cuda_backend().add_scalar_(self, value);
  cpu_only("add_", {self});
  if (is_16bit_float(self.dtype()))
    return in_float32(self, [&](const Tensor& wide) { add_scalar_(wide, value); });
  self.bump_version();
  dispatch_numeric(self.dtype(), "add_", [&]<typename T>() {
    const T v = static_cast<T>(value);
    cpu::map<T, T>(
        self, [v](T x) { return static_cast<T>(x + v); }, self);
  });
}

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  check_no_overlap("addcmul_", self, {a, b});
  if (on_cuda("addcmul_", {self, a, b})) return cuda_backend().addcmul_(self, a, b, alpha);
  cpu_only("addcmul_", {self, a, b});
  LOOM_CHECK(broadcast_shapes(broadcast_shapes(self.sizes(), a.sizes(), "addcmul_"), b.sizes(),
                              "addcmul_") == self.sizes(),
             ShapeError, "addcmul_: a=", a.sizes(), " and b=", b.sizes(),
             " do not broadcast to self=", self.sizes());
  const Tensor ac = to_dtype(a, self.dtype()), bc = to_dtype(b, self.dtype());
  self.bump_version();
  dispatch_floating(self.dtype(), "addcmul_", [&]<typename T>() {
    const T s = static_cast<T>(alpha);
    cpu::map<T, T>(
        self, [s](T x, T p, T q) { return x + s * p * q; }, self, ac, bc);
  });
}
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  check_no_overlap("addcdiv_", self, {a, b});
  if (on_cuda("addcdiv_", {self, a, b})) return cuda_backend().addcdiv_(self, a, b, alpha);
  cpu_only("addcdiv_", {self, a, b});
  LOOM_CHECK(broadcast_shapes(broadcast_shapes(self.sizes(), a.sizes(), "addcdiv_"), b.sizes(),
                              "addcdiv_") == self.sizes(),
             ShapeError, "addcdiv_: a=", a.sizes(), " and b=", b.sizes(),
             " do not broadcast to self=", self.sizes());
  const Tensor ac = to_dtype(a, self.dtype()), bc = to_dtype(b, self.dtype());
  self.bump_version();
  dispatch_floating(self.dtype(), "addcdiv_", [&]<typename T>() {
    const T s = static_cast<T>(alpha);
    cpu::map<T, T>(
        self, [s](T x, T p, T q) { return x + s * p / q; }, self, ac, bc);
  });
}

}  // namespace loom::kernels
