// tensor/elementwise.cpp — the front of the elementwise kernels (tensor/elementwise.h): each
// entry's one device switch, to the CUDA backend (tensor/cuda_backend.h) or to the CPU loops of
// tensor/cpu/elementwise.cpp, and on the CPU path the argument checks and the 16-bit rule. The
// CUDA kernels check their own arguments (tensor/cuda/elementwise.h), so the checks here follow
// the switch and are the CPU path's; the in-place ops' overlap checks precede it, for both.
//
// float16 and bfloat16 (Note [16-bit arithmetic] in tensor/cuda/float16.h): each operand is
// widened to float32 in one pass (F16C for float16), the float32 kernel runs, and the result is
// rounded once on the way back. The bits are those of CUDA's per-element widen-compute-round; a
// per-element software rounding inside the loop ran the fp16 training step at half the speed of
// float32. A sum of two bfloat16 tensors is the exception (cpu::add_bfloat16): bfloat16 widens
// by a shift and rounds in a few integer operations, so its loop converts in place, with the
// same bits and without the copies (it accumulates the gradients of a bf16 autocast model
// whose activations stay bfloat16, Note [Batch norm on bfloat16]). The optimizers' addcmul_
// and addcdiv_ take float32 and float64 only.

#include "tensor/elementwise.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/elementwise.h"
#include "tensor/cuda_backend.h"

namespace loom::kernels {

namespace {

// ShapeError unless the operands' shapes broadcast together, folded left to right.
void check_broadcast(const char* op, std::initializer_list<Tensor> operands) {
  Shape shape = operands.begin()->sizes();
  for (auto it = operands.begin() + 1; it != operands.end(); ++it)
    shape = broadcast_shapes(shape, it->sizes(), op);
}

// The dtype a binary op computes in (promote_types), once a and b are checked to broadcast.
DType binary_type(const char* op, const Tensor& a, const Tensor& b) {
  check_broadcast(op, {a, b});
  return promote_types(a.dtype(), b.dtype());
}

// x as an operand of a computation in the 16-bit dtype t: converted to t, then widened.
Tensor widened_as(const Tensor& x, DType t) { return widened(to_dtype(x, t)); }

// A fused backward: the gradient and the saved tensor of one dtype, shapes that broadcast.
void check_backward(const char* op, const Tensor& dout, const Tensor& saved) {
  LOOM_CHECK(dout.dtype() == saved.dtype(), DTypeError, op, ": gradient is ", dout.dtype(),
             " but the saved tensor is ", saved.dtype());
  check_broadcast(op, {dout, saved});
}

// An in-place binary op: other broadcasts to self's shape.
void check_inplace(const char* op, const Tensor& self, const Tensor& other) {
  LOOM_CHECK(broadcast_shapes(self.sizes(), other.sizes(), op) == self.sizes(), ShapeError, op,
             ": cannot broadcast other=", other.sizes(), " into self=", self.sizes());
}

// addcmul_ and addcdiv_: a and b broadcast to self's shape.
void check_inplace_ternary(const char* op, const Tensor& self, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(broadcast_shapes(broadcast_shapes(self.sizes(), a.sizes(), op), b.sizes(), op) ==
                 self.sizes(),
             ShapeError, op, ": a=", a.sizes(), " and b=", b.sizes(),
             " do not broadcast to self=", self.sizes());
}

// A 16-bit self updated in place through a float32 copy: update(wide), then one rounding back.
template <typename Update>
void in_float32(const Tensor& self, Update update) {
  const Tensor wide = widened(self);
  update(wide);
  copy_(self, wide);  // bumps self's version
}

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (on_cuda("add", {a, b})) return cuda_backend().add(a, b, alpha);
  const DType t = binary_type("add", a, b);
  if (a.dtype() == kBFloat16 && b.dtype() == kBFloat16) return cpu::add_bfloat16(a, b, alpha);
  if (is_16bit_float(t)) return to_dtype(add(widened_as(a, t), widened_as(b, t), alpha), t);
  return cpu::add(a, b, alpha);
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (on_cuda("sub", {a, b})) return cuda_backend().sub(a, b, alpha);
  const DType t = binary_type("sub", a, b);
  if (is_16bit_float(t)) return to_dtype(sub(widened_as(a, t), widened_as(b, t), alpha), t);
  return cpu::sub(a, b, alpha);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  if (on_cuda("mul", {a, b})) return cuda_backend().mul(a, b);
  const DType t = binary_type("mul", a, b);
  if (is_16bit_float(t)) return to_dtype(mul(widened_as(a, t), widened_as(b, t)), t);
  return cpu::mul(a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  if (on_cuda("div", {a, b})) return cuda_backend().div(a, b);
  const DType t = binary_type("div", a, b);
  if (is_16bit_float(t)) return to_dtype(div(widened_as(a, t), widened_as(b, t)), t);
  return cpu::div(a, b);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  if (on_cuda("pow", {a, b})) return cuda_backend().pow(a, b);
  const DType t = binary_type("pow", a, b);
  if (is_16bit_float(t)) return to_dtype(pow(widened_as(a, t), widened_as(b, t)), t);
  return cpu::pow(a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  if (on_cuda("maximum", {a, b})) return cuda_backend().maximum(a, b);
  const DType t = binary_type("maximum", a, b);
  if (is_16bit_float(t)) return to_dtype(maximum(widened_as(a, t), widened_as(b, t)), t);
  return cpu::maximum(a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  if (on_cuda("minimum", {a, b})) return cuda_backend().minimum(a, b);
  const DType t = binary_type("minimum", a, b);
  if (is_16bit_float(t)) return to_dtype(minimum(widened_as(a, t), widened_as(b, t)), t);
  return cpu::minimum(a, b);
}

Tensor add_scalar(const Tensor& a, double b) {
  if (on_cuda("add_scalar", {a})) return cuda_backend().add_scalar(a, b);
  if (is_16bit_float(a.dtype())) return to_dtype(add_scalar(widened(a), b), a.dtype());
  return cpu::add_scalar(a, b);
}
Tensor mul_scalar(const Tensor& a, double b) {
  if (on_cuda("mul_scalar", {a})) return cuda_backend().mul_scalar(a, b);
  if (is_16bit_float(a.dtype())) return to_dtype(mul_scalar(widened(a), b), a.dtype());
  return cpu::mul_scalar(a, b);
}
Tensor rsub_scalar(const Tensor& a, double b) {
  if (on_cuda("rsub_scalar", {a})) return cuda_backend().rsub_scalar(a, b);
  if (is_16bit_float(a.dtype())) return to_dtype(rsub_scalar(widened(a), b), a.dtype());
  return cpu::rsub_scalar(a, b);
}
Tensor div_scalar(const Tensor& a, double b) {
  if (on_cuda("div_scalar", {a})) return cuda_backend().div_scalar(a, b);
  if (is_16bit_float(a.dtype())) return to_dtype(div_scalar(widened(a), b), a.dtype());
  return cpu::div_scalar(a, b);
}
Tensor pow_scalar(const Tensor& a, double exponent) {
  if (on_cuda("pow_scalar", {a})) return cuda_backend().pow_scalar(a, exponent);
  if (is_16bit_float(a.dtype())) return to_dtype(pow_scalar(widened(a), exponent), a.dtype());
  return cpu::pow_scalar(a, exponent);
}

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  if (on_cuda("eq", {a, b})) return cuda_backend().eq(a, b);
  const DType t = binary_type("eq", a, b);
  if (is_16bit_float(t)) return eq(widened_as(a, t), widened_as(b, t));
  return cpu::eq(a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  if (on_cuda("ne", {a, b})) return cuda_backend().ne(a, b);
  const DType t = binary_type("ne", a, b);
  if (is_16bit_float(t)) return ne(widened_as(a, t), widened_as(b, t));
  return cpu::ne(a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  if (on_cuda("lt", {a, b})) return cuda_backend().lt(a, b);
  const DType t = binary_type("lt", a, b);
  if (is_16bit_float(t)) return lt(widened_as(a, t), widened_as(b, t));
  return cpu::lt(a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  if (on_cuda("le", {a, b})) return cuda_backend().le(a, b);
  const DType t = binary_type("le", a, b);
  if (is_16bit_float(t)) return le(widened_as(a, t), widened_as(b, t));
  return cpu::le(a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  if (on_cuda("gt", {a, b})) return cuda_backend().gt(a, b);
  const DType t = binary_type("gt", a, b);
  if (is_16bit_float(t)) return gt(widened_as(a, t), widened_as(b, t));
  return cpu::gt(a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  if (on_cuda("ge", {a, b})) return cuda_backend().ge(a, b);
  const DType t = binary_type("ge", a, b);
  if (is_16bit_float(t)) return ge(widened_as(a, t), widened_as(b, t));
  return cpu::ge(a, b);
}
Tensor eq_scalar(const Tensor& a, double b) {
  if (on_cuda("eq_scalar", {a})) return cuda_backend().eq_scalar(a, b);
  if (is_16bit_float(a.dtype())) return eq_scalar(widened(a), b);
  return cpu::eq_scalar(a, b);
}
Tensor gt_scalar(const Tensor& a, double b) {
  if (on_cuda("gt_scalar", {a})) return cuda_backend().gt_scalar(a, b);
  if (is_16bit_float(a.dtype())) return gt_scalar(widened(a), b);
  return cpu::gt_scalar(a, b);
}
Tensor lt_scalar(const Tensor& a, double b) {
  if (on_cuda("lt_scalar", {a})) return cuda_backend().lt_scalar(a, b);
  if (is_16bit_float(a.dtype())) return lt_scalar(widened(a), b);
  return cpu::lt_scalar(a, b);
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  if (on_cuda("neg", {x})) return cuda_backend().neg(x);
  if (is_16bit_float(x.dtype())) return to_dtype(neg(widened(x)), x.dtype());
  return cpu::neg(x);
}
Tensor abs(const Tensor& x) {
  if (on_cuda("abs", {x})) return cuda_backend().abs(x);
  if (is_16bit_float(x.dtype())) return to_dtype(abs(widened(x)), x.dtype());
  return cpu::abs(x);
}
Tensor sign(const Tensor& x) {
  if (on_cuda("sign", {x})) return cuda_backend().sign(x);
  if (is_16bit_float(x.dtype())) return to_dtype(sign(widened(x)), x.dtype());
  return cpu::sign(x);
}
Tensor exp(const Tensor& x) {
  if (on_cuda("exp", {x})) return cuda_backend().exp(x);
  if (is_16bit_float(x.dtype())) return to_dtype(exp(widened(x)), x.dtype());
  return cpu::exp(x);
}
Tensor log(const Tensor& x) {
  if (on_cuda("log", {x})) return cuda_backend().log(x);
  if (is_16bit_float(x.dtype())) return to_dtype(log(widened(x)), x.dtype());
  return cpu::log(x);
}
Tensor sqrt(const Tensor& x) {
  if (on_cuda("sqrt", {x})) return cuda_backend().sqrt(x);
  if (is_16bit_float(x.dtype())) return to_dtype(sqrt(widened(x)), x.dtype());
  return cpu::sqrt(x);
}
Tensor rsqrt(const Tensor& x) {
  if (on_cuda("rsqrt", {x})) return cuda_backend().rsqrt(x);
  if (is_16bit_float(x.dtype())) return to_dtype(rsqrt(widened(x)), x.dtype());
  return cpu::rsqrt(x);
}
Tensor tanh(const Tensor& x) {
  if (on_cuda("tanh", {x})) return cuda_backend().tanh(x);
  if (is_16bit_float(x.dtype())) return to_dtype(tanh(widened(x)), x.dtype());
  return cpu::tanh(x);
}
Tensor sigmoid(const Tensor& x) {
  if (on_cuda("sigmoid", {x})) return cuda_backend().sigmoid(x);
  if (is_16bit_float(x.dtype())) return to_dtype(sigmoid(widened(x)), x.dtype());
  return cpu::sigmoid(x);
}
Tensor relu(const Tensor& x) {
  if (on_cuda("relu", {x})) return cuda_backend().relu(x);
  if (is_16bit_float(x.dtype())) return to_dtype(relu(widened(x)), x.dtype());
  return cpu::relu(x);
}
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  if (on_cuda("gelu", {x})) return cuda_backend().gelu(x, tanh_approximation);
  if (is_16bit_float(x.dtype())) return to_dtype(gelu(widened(x), tanh_approximation), x.dtype());
  return cpu::gelu(x, tanh_approximation);
}
Tensor clamp(const Tensor& x, double min, double max) {
  if (on_cuda("clamp", {x})) return cuda_backend().clamp(x, min, max);
  LOOM_CHECK(!(min > max), ValueError, "clamp: min ", min, " is greater than max ", max);
  if (is_16bit_float(x.dtype())) return to_dtype(clamp(widened(x), min, max), x.dtype());
  return cpu::clamp(x, min, max);
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  if (on_cuda("where", {condition, a, b})) return cuda_backend().where(condition, a, b);
  LOOM_CHECK(condition.dtype() == kBool, DTypeError, "where: condition must be bool; got ",
             condition.dtype());
  check_broadcast("where", {condition, a, b});
  const DType t = promote_types(a.dtype(), b.dtype());
  if (is_16bit_float(t)) return to_dtype(where(condition, widened_as(a, t), widened_as(b, t)), t);
  return cpu::where(condition, a, b);
}

// ---------------------------------------------------------------- fused backwards

Tensor relu_backward(const Tensor& dout, const Tensor& out) {
  if (on_cuda("relu_backward", {dout, out})) return cuda_backend().relu_backward(dout, out);
  check_backward("relu_backward", dout, out);
  if (is_16bit_float(dout.dtype()))
    return to_dtype(relu_backward(widened(dout), widened(out)), dout.dtype());
  return cpu::relu_backward(dout, out);
}
Tensor sigmoid_backward(const Tensor& dout, const Tensor& out) {
  if (on_cuda("sigmoid_backward", {dout, out})) return cuda_backend().sigmoid_backward(dout, out);
  check_backward("sigmoid_backward", dout, out);
  if (is_16bit_float(dout.dtype()))
    return to_dtype(sigmoid_backward(widened(dout), widened(out)), dout.dtype());
  return cpu::sigmoid_backward(dout, out);
}
Tensor tanh_backward(const Tensor& dout, const Tensor& out) {
  if (on_cuda("tanh_backward", {dout, out})) return cuda_backend().tanh_backward(dout, out);
  check_backward("tanh_backward", dout, out);
  if (is_16bit_float(dout.dtype()))
    return to_dtype(tanh_backward(widened(dout), widened(out)), dout.dtype());
  return cpu::tanh_backward(dout, out);
}
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approximation) {
  if (on_cuda("gelu_backward", {dout, x}))
    return cuda_backend().gelu_backward(dout, x, tanh_approximation);
  check_backward("gelu_backward", dout, x);
  if (is_16bit_float(dout.dtype()))
    return to_dtype(gelu_backward(widened(dout), widened(x), tanh_approximation), dout.dtype());
  return cpu::gelu_backward(dout, x, tanh_approximation);
}
Tensor clamp_backward(const Tensor& dout, const Tensor& x, double min, double max) {
  if (on_cuda("clamp_backward", {dout, x})) return cuda_backend().clamp_backward(dout, x, min, max);
  check_backward("clamp_backward", dout, x);
  if (is_16bit_float(dout.dtype()))
    return to_dtype(clamp_backward(widened(dout), widened(x), min, max), dout.dtype());
  return cpu::clamp_backward(dout, x, min, max);
}

// ---------------------------------------------------------------- in place
// A 16-bit self computes through a float32 copy; other is first converted to self's dtype.

void add_(const Tensor& self, const Tensor& other, double alpha) {
  check_no_overlap("add_", self, {other});
  if (on_cuda("add_", {self, other})) return cuda_backend().add_(self, other, alpha);
  check_inplace("add_", self, other);
  if (is_16bit_float(self.dtype())) {
    const Tensor wide_other = widened_as(other, self.dtype());
    return in_float32(self, [&](const Tensor& wide) { cpu::add_(wide, wide_other, alpha); });
  }
  cpu::add_(self, other, alpha);
}
void sub_(const Tensor& self, const Tensor& other, double alpha) {
  check_no_overlap("sub_", self, {other});
  if (on_cuda("sub_", {self, other})) return cuda_backend().sub_(self, other, alpha);
  check_inplace("sub_", self, other);
  if (is_16bit_float(self.dtype())) {
    const Tensor wide_other = widened_as(other, self.dtype());
    return in_float32(self, [&](const Tensor& wide) { cpu::sub_(wide, wide_other, alpha); });
  }
  cpu::sub_(self, other, alpha);
}
void mul_(const Tensor& self, const Tensor& other) {
  check_no_overlap("mul_", self, {other});
  if (on_cuda("mul_", {self, other})) return cuda_backend().mul_(self, other);
  check_inplace("mul_", self, other);
  if (is_16bit_float(self.dtype())) {
    const Tensor wide_other = widened_as(other, self.dtype());
    return in_float32(self, [&](const Tensor& wide) { cpu::mul_(wide, wide_other); });
  }
  cpu::mul_(self, other);
}
void div_(const Tensor& self, const Tensor& other) {
  check_no_overlap("div_", self, {other});
  if (on_cuda("div_", {self, other})) return cuda_backend().div_(self, other);
  LOOM_CHECK(is_floating(self.dtype()), DTypeError, "div_: true division cannot write into a ",
             self.dtype(), " tensor");
  check_inplace("div_", self, other);
  if (is_16bit_float(self.dtype())) {
    const Tensor wide_other = widened_as(other, self.dtype());
    return in_float32(self, [&](const Tensor& wide) { cpu::div_(wide, wide_other); });
  }
  cpu::div_(self, other);
}
void mul_scalar_(const Tensor& self, double value) {
  check_no_overlap("mul_scalar_", self, {});
  if (on_cuda("mul_scalar_", {self})) return cuda_backend().mul_scalar_(self, value);
  if (is_16bit_float(self.dtype()))
    return in_float32(self, [&](const Tensor& wide) { cpu::mul_scalar_(wide, value); });
  cpu::mul_scalar_(self, value);
}
void add_scalar_(const Tensor& self, double value) {
  check_no_overlap("add_scalar_", self, {});
  if (on_cuda("add_scalar_", {self})) return cuda_backend().add_scalar_(self, value);
  if (is_16bit_float(self.dtype()))
    return in_float32(self, [&](const Tensor& wide) { cpu::add_scalar_(wide, value); });
  cpu::add_scalar_(self, value);
}

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  check_no_overlap("addcmul_", self, {a, b});
  if (on_cuda("addcmul_", {self, a, b})) return cuda_backend().addcmul_(self, a, b, alpha);
  check_inplace_ternary("addcmul_", self, a, b);
  cpu::addcmul_(self, a, b, alpha);
}
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, double alpha) {
  check_no_overlap("addcdiv_", self, {a, b});
  if (on_cuda("addcdiv_", {self, a, b})) return cuda_backend().addcdiv_(self, a, b, alpha);
  check_inplace_ternary("addcdiv_", self, a, b);
  cpu::addcdiv_(self, a, b, alpha);
}

}  // namespace loom::kernels
