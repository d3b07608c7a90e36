// tensor/cuda/elementwise_unary.cu — the unary elementwise ops on CUDA, where, and the fused
// backwards of the activations (tensor/cuda/elementwise.h; the shared helpers and the notes in
// elementwise.cu and elementwise_ops.cuh).

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/elementwise_ops.cuh"

namespace loom::cuda {

using namespace elementwise_detail;  // NOLINT: this file's ops are built from its helpers

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

}  // namespace loom::cuda
