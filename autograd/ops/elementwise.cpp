// autograd/ops/elementwise.cpp — elementwise ops, each forward followed by its backward.
// Gradients of broadcast inputs are returned in the broadcast shape: the engine sums them back
// to each input's shape (autograd/engine.cpp, reduce_to_input).
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/elementwise.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "tensor/elementwise.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

// d(a + alpha b): da = dout ; db = alpha dout
Tensor ops_impl::add(const Tensor& a, const Tensor& b, double alpha) {
  return record("add", k::add(a, b, alpha), {a, b}, {},
                [alpha](const Grads& dout, Saved& s, Grads& g) {
                  if (s.needs_grad(0)) g[0] = dout[0];
                  if (s.needs_grad(1))
                    g[1] = alpha == 1.0 ? dout[0] : k::mul_scalar(dout[0], alpha);
                });
}

// d(a - alpha b): da = dout ; db = -alpha dout
Tensor ops_impl::sub(const Tensor& a, const Tensor& b, double alpha) {
  return record("sub", k::sub(a, b, alpha), {a, b}, {},
                [alpha](const Grads& dout, Saved& s, Grads& g) {
                  if (s.needs_grad(0)) g[0] = dout[0];
                  if (s.needs_grad(1)) g[1] = k::mul_scalar(dout[0], -alpha);
                });
}

// d(a b): da = dout b ; db = dout a
Tensor ops_impl::mul(const Tensor& a, const Tensor& b) {
  return record("mul", k::mul(a, b), {a, b}, {a, b}, [](const Grads& dout, Saved& s, Grads& g) {
    if (s.needs_grad(0)) g[0] = k::mul(dout[0], s[1]);
    if (s.needs_grad(1)) g[1] = k::mul(dout[0], s[0]);
  });
}

// d(a / b): da = dout / b ; db = -dout a / b^2
Tensor ops_impl::div(const Tensor& a, const Tensor& b) {
  return record("div", k::div(a, b), {a, b}, {a, b}, [](const Grads& dout, Saved& s, Grads& g) {
    const Tensor da = k::div(dout[0], s[1]);
    if (s.needs_grad(0)) g[0] = da;
    if (s.needs_grad(1)) g[1] = k::neg(k::div(k::mul(da, s[0]), s[1]));
  });
}

// d(a^b): da = dout b a^(b-1) ; db = dout a^b log(a)   (0 where a = 0, as PyTorch)
Tensor ops_impl::pow(const Tensor& a, const Tensor& b) {
  Tensor out = k::pow(a, b);
  return record("pow", out, {a, b}, {a, b, out}, [](const Grads& dout, Saved& s, Grads& g) {
    if (s.needs_grad(0))
      g[0] = k::mul(dout[0], k::mul(s[1], k::pow(s[0], k::add_scalar(s[1], -1.0))));
    if (s.needs_grad(1)) {
      const Tensor zero = zeros({}, s[0].dtype(), s[0].device());
      const Tensor log_a = k::where(k::eq_scalar(s[0], 0.0), zero, k::log(s[0]));
      g[1] = k::mul(dout[0], k::mul(s[2], log_a));
    }
  });
}

// d(x^p): dx = dout p x^(p-1)
Tensor ops_impl::pow(const Tensor& a, double exponent) {
  return record("pow", k::pow_scalar(a, exponent), {a}, {a},
                [exponent](const Grads& dout, Saved& s, Grads& g) {
                  if (exponent == 0.0) {
                    g[0] = k::mul_scalar(dout[0], 0.0);
                    return;
                  }
                  g[0] =
                      k::mul(dout[0], k::mul_scalar(k::pow_scalar(s[0], exponent - 1), exponent));
                });
}

// d max(a, b): the gradient goes to the larger input; ties split it evenly, as PyTorch.
static Tensor extremum(const char* name, const Tensor& a, const Tensor& b, bool is_max) {
  Tensor out = is_max ? k::maximum(a, b) : k::minimum(a, b);
  return record(name, out, {a, b}, {a, b}, [is_max](const Grads& dout, Saved& s, Grads& g) {
    const Tensor a_wins = is_max ? k::gt(s[0], s[1]) : k::lt(s[0], s[1]);
    const Tensor tie = k::eq(s[0], s[1]);
    const Tensor zero = zeros({}, dout[0].dtype(), dout[0].device());
    const Tensor half = k::mul_scalar(dout[0], 0.5);
    const Tensor to_a = k::where(a_wins, dout[0], k::where(tie, half, zero));
    if (s.needs_grad(0)) g[0] = to_a;
    if (s.needs_grad(1)) g[1] = k::where(tie, half, k::sub(dout[0], to_a));
  });
}
Tensor ops_impl::maximum(const Tensor& a, const Tensor& b) {
  return extremum("maximum", a, b, true);
}
Tensor ops_impl::minimum(const Tensor& a, const Tensor& b) {
  return extremum("minimum", a, b, false);
}

// d(-x): -dout
Tensor ops_impl::neg(const Tensor& x) {
  return record("neg", k::neg(x), {x}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = k::neg(dout[0]); });
}

// d exp(x): dout exp(x)
Tensor ops_impl::exp(const Tensor& x) {
  Tensor out = k::exp(x);
  return record("exp", out, {x}, {out},
                [](const Grads& dout, Saved& s, Grads& g) { g[0] = k::mul(dout[0], s[0]); });
}

// d log(x): dout / x
Tensor ops_impl::log(const Tensor& x) {
  return record("log", k::log(x), {x}, {x},
                [](const Grads& dout, Saved& s, Grads& g) { g[0] = k::div(dout[0], s[0]); });
}

// d sqrt(x): dout / (2 sqrt(x))
Tensor ops_impl::sqrt(const Tensor& x) {
  Tensor out = k::sqrt(x);
  return record("sqrt", out, {x}, {out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::div(dout[0], k::mul_scalar(s[0], 2.0));
  });
}

// d x^(-1/2): -dout x^(-3/2) / 2 = -dout y^3 / 2
Tensor ops_impl::rsqrt(const Tensor& x) {
  Tensor out = k::rsqrt(x);
  return record("rsqrt", out, {x}, {out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::mul(dout[0], k::mul_scalar(k::mul(s[0], k::mul(s[0], s[0])), -0.5));
  });
}

// d |x|: dout sign(x)
Tensor ops_impl::abs(const Tensor& x) {
  return record("abs", k::abs(x), {x}, {x}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::mul(dout[0], k::sign(s[0]));
  });
}

// d tanh(x): dout (1 - y^2)
Tensor ops_impl::tanh(const Tensor& x) {
  Tensor out = k::tanh(x);
  return record("tanh", out, {x}, {out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::tanh_backward(dout[0], s[0]);
  });
}

// d sigmoid(x): dout y (1 - y)
Tensor ops_impl::sigmoid(const Tensor& x) {
  Tensor out = k::sigmoid(x);
  return record("sigmoid", out, {x}, {out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::sigmoid_backward(dout[0], s[0]);
  });
}

// d relu(x): dout where y > 0
Tensor ops_impl::relu(const Tensor& x) {
  Tensor out = k::relu(x);
  return record("relu", out, {x}, {out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::relu_backward(dout[0], s[0]);
  });
}

// d gelu(x): erf form Phi(x) + x phi(x); tanh form in tensor/cpu/elementwise.cpp
Tensor ops_impl::gelu(const Tensor& x, const std::string& approximate) {
  LOOM_CHECK(approximate == "none" || approximate == "tanh", ValueError,
             "gelu: approximate must be \"none\" or \"tanh\"; got \"", approximate, "\"");
  const bool tanh_form = approximate == "tanh";
  return record("gelu", k::gelu(x, tanh_form), {x}, {x},
                [tanh_form](const Grads& dout, Saved& s, Grads& g) {
                  g[0] = k::gelu_backward(dout[0], s[0], tanh_form);
                });
}

// d clamp(x, lo, hi): dout where lo <= x <= hi
Tensor ops_impl::clamp(const Tensor& x, double min, double max) {
  return record("clamp", k::clamp(x, min, max), {x}, {x},
                [min, max](const Grads& dout, Saved& s, Grads& g) {
                  g[0] = k::clamp_backward(dout[0], s[0], min, max);
                });
}

// d where(c, a, b): da = dout where c ; db = dout where not c
Tensor ops_impl::where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return record("where", k::where(condition, a, b), {condition, a, b}, {condition},
                [](const Grads& dout, Saved& s, Grads& g) {
                  const Tensor zero = zeros({}, dout[0].dtype(), dout[0].device());
                  if (s.needs_grad(1)) g[1] = k::where(s[0], dout[0], zero);
                  if (s.needs_grad(2)) g[2] = k::where(s[0], zero, dout[0]);
                });
}

Tensor eq(const Tensor& a, const Tensor& b) { return k::eq(a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return k::ne(a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return k::lt(a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return k::le(a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return k::gt(a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return k::ge(a, b); }

// ---------------------------------------------------------------- operators

// Scalars: one node each, so `x * 2` costs no 0-d tensor and no broadcast.
Tensor ops_impl::add_scalar(const Tensor& a, double b) {
  return record("add", k::add_scalar(a, b), {a}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}
Tensor ops_impl::mul_scalar(const Tensor& a, double b) {
  return record("mul", k::mul_scalar(a, b), {a}, {},
                [b](const Grads& dout, Saved&, Grads& g) { g[0] = k::mul_scalar(dout[0], b); });
}
Tensor ops_impl::div_scalar(const Tensor& a, double b) {
  return record("div", k::div_scalar(a, b), {a}, {},
                [b](const Grads& dout, Saved&, Grads& g) { g[0] = k::div_scalar(dout[0], b); });
}
// d(b / x): -dout b / x^2
Tensor ops_impl::scalar_div(double b, const Tensor& x) {
  Tensor out = k::mul_scalar(k::pow_scalar(x, -1.0), b);
  return record("div", out, {x}, {x, out}, [](const Grads& dout, Saved& s, Grads& g) {
    g[0] = k::neg(k::div(k::mul(dout[0], s[1]), s[0]));
  });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
// a + s, a * s, a / s and s / a are entries in autograd/autocast_ops.cpp; the others use them.
Tensor operator-(const Tensor& a, double b) { return a + -b; }
Tensor operator+(double a, const Tensor& b) { return b + a; }
Tensor operator-(double a, const Tensor& b) { return -b + a; }
Tensor operator*(double a, const Tensor& b) { return b * a; }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }

}  // namespace loom
