// autograd/tensor_methods.cpp — the Tensor methods that involve autograd: requires_grad, .grad,
// backward, hooks, and the differentiable methods, which forward to the free functions of
// autograd/ops.h so that `x.view(...)` and `loom::view(x, ...)` are one code path.

#include "autograd/function.h"
#include "autograd/graph.h"
#include "autograd/ops.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/view.h"

namespace loom {

using autograd::meta;
using autograd::meta_or_null;

bool Tensor::requires_grad() const {
  const autograd::AutogradMeta* m = meta_or_null(*this);
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  autograd::AutogradMeta& m = meta(*this);
  LOOM_CHECK(!on || is_floating(dtype()), DTypeError,
             "requires_grad_: only floating-point tensors can require gradients; got ", dtype());
  LOOM_CHECK(!m.grad_fn || on, AutogradError,
             "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (shape=", sizes(),
             "); use detach()");
  m.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const autograd::AutogradMeta* m = meta_or_null(*this);
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const autograd::AutogradMeta* m = meta_or_null(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    LOOM_CHECK(grad.sizes() == sizes(), ShapeError, "set_grad: gradient shape=", grad.sizes(),
               " does not match tensor shape=", sizes());
    LOOM_CHECK(grad.dtype() == dtype(), DTypeError, "set_grad: gradient is ", grad.dtype(),
               " but the tensor is ", dtype());
  }
  meta(*this).grad = grad;
}

std::string Tensor::grad_fn_name() const {
  const autograd::AutogradMeta* m = meta_or_null(*this);
  return m && m->grad_fn ? m->grad_fn->name() + "Backward" : std::string();
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

std::string Tensor::str() const {
  std::string note;
  if (defined() && requires_grad()) {
    const std::string fn = grad_fn_name();
    note = fn.empty() ? ", requires_grad=True" : ", grad_fn=<" + fn + ">";
  }
  return detail::tensor_repr(*this, note);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

Tensor Tensor::detach() const { return kernels::alias(*this); }

void Tensor::retain_grad() const {
  autograd::AutogradMeta* m = meta_or_null(*this);
  LOOM_CHECK(m && (m->requires_grad || m->grad_fn), AutogradError,
             "retain_grad: the tensor does not require grad (shape=", sizes(), ")");
  if (!m->grad_fn) return;  // leaves keep .grad anyway
  m->grad_fn->retained.emplace_back(m->output_nr, impl_ptr());
}

int Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  autograd::AutogradMeta& m = meta(*this);
  LOOM_CHECK(!m.grad_fn, AutogradError,
             "register_post_accumulate_grad_hook: only leaf tensors accumulate .grad; this one "
             "(shape=",
             sizes(), ") comes from ", grad_fn_name());
  const int id = m.next_hook_id++;
  m.post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_post_accumulate_grad_hook(int handle) const {
  autograd::AutogradMeta& m = meta(*this);
  std::erase_if(m.post_accumulate_hooks, [handle](const auto& h) { return h.first == handle; });
}

// ---------------------------------------------------------------- views and conversions

Tensor Tensor::view(const Shape& shape) const { return loom::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return loom::reshape(*this, shape); }
Tensor Tensor::permute(const Shape& dims) const { return loom::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return loom::transpose(*this, d0, d1); }
Tensor Tensor::t() const {
  LOOM_CHECK(dim() <= 2, ShapeError, "t: expected a tensor of at most 2 dims; got shape=", sizes());
  return dim() < 2 ? *this : loom::transpose(*this, 0, 1);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return loom::narrow(*this, d, start, length);
}
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return loom::slice(*this, d, start, end, step);
}
Tensor Tensor::select(int64_t d, int64_t index) const { return loom::select(*this, d, index); }
Tensor Tensor::expand(const Shape& shape) const { return loom::expand(*this, shape); }
Tensor Tensor::squeeze() const { return loom::squeeze(*this); }
Tensor Tensor::squeeze(int64_t d) const { return loom::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return loom::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return loom::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::contiguous() const { return loom::contiguous(*this); }
Tensor Tensor::contiguous(MemoryFormat format) const { return loom::contiguous(*this, format); }
Tensor Tensor::to(DType dtype) const { return loom::to(*this, dtype); }
Tensor Tensor::to(Device device) const { return loom::to(*this, device); }
Tensor Tensor::clone() const { return loom::clone(*this); }

// ---------------------------------------------------------------- arithmetic

Tensor Tensor::add(const Tensor& other, double alpha) const {
  return loom::add(*this, other, alpha);
}
Tensor Tensor::sub(const Tensor& other, double alpha) const {
  return loom::sub(*this, other, alpha);
}
Tensor Tensor::mul(const Tensor& other) const { return loom::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return loom::div(*this, other); }
Tensor Tensor::pow(double exponent) const { return loom::pow(*this, exponent); }
Tensor Tensor::neg() const { return loom::neg(*this); }
Tensor Tensor::exp() const { return loom::exp(*this); }
Tensor Tensor::log() const { return loom::log(*this); }
Tensor Tensor::sqrt() const { return loom::sqrt(*this); }
Tensor Tensor::rsqrt() const { return loom::rsqrt(*this); }
Tensor Tensor::abs() const { return loom::abs(*this); }
Tensor Tensor::tanh() const { return loom::tanh(*this); }
Tensor Tensor::sigmoid() const { return loom::sigmoid(*this); }
Tensor Tensor::relu() const { return loom::relu(*this); }
Tensor Tensor::matmul(const Tensor& other) const { return loom::matmul(*this, other); }
Tensor Tensor::sum() const { return loom::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const {
  return loom::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return loom::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const {
  return loom::mean(*this, dims, keepdim);
}

// ---------------------------------------------------------------- in place
// See Note [In-place ops and autograd] in autograd/function.cpp.

// Applies an in-place kernel, or, when the op must be recorded, computes out of place (on a
// clone, so values a backward saved stay intact) and rebases self's history onto the result.
template <typename Kernel, typename OutOfPlace>
static Tensor& inplace(Tensor& self, const char* op, std::initializer_list<Tensor> others,
                       Kernel kernel, OutOfPlace out_of_place) {
  autograd::check_inplace(self, op);
  std::vector<Tensor> inputs{self};
  inputs.insert(inputs.end(), others.begin(), others.end());
  if (autograd::any_requires_grad(inputs)) {
    autograd::rebase_history(self, out_of_place(loom::clone(self)));
  } else {
    kernel();
  }
  return self;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  return inplace(
      *this, "add_", {other}, [&] { kernels::add_(*this, other, alpha); },
      [&](const Tensor& s) { return loom::add(s, other, alpha); });
}
Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  return inplace(
      *this, "sub_", {other}, [&] { kernels::sub_(*this, other, alpha); },
      [&](const Tensor& s) { return loom::sub(s, other, alpha); });
}
Tensor& Tensor::mul_(const Tensor& other) {
  return inplace(
      *this, "mul_", {other}, [&] { kernels::mul_(*this, other); },
      [&](const Tensor& s) { return loom::mul(s, other); });
}
Tensor& Tensor::mul_(double value) {
  return inplace(
      *this, "mul_", {}, [&] { kernels::mul_scalar_(*this, value); },
      [&](const Tensor& s) { return s * value; });
}
Tensor& Tensor::div_(const Tensor& other) {
  return inplace(
      *this, "div_", {other}, [&] { kernels::div_(*this, other); },
      [&](const Tensor& s) { return loom::div(s, other); });
}
Tensor& Tensor::zero_() { return fill_(0.0); }
Tensor& Tensor::fill_(double value) {
  return inplace(
      *this, "fill_", {}, [&] { kernels::fill_(*this, value); },
      [&](const Tensor& s) { return s * 0.0 + value; });
}
Tensor& Tensor::copy_(const Tensor& src) {
  return inplace(
      *this, "copy_", {src}, [&] { kernels::copy_(*this, src); },
      [&](const Tensor& s) {
        // d copy_: the gradient flows to src (broadcast back by the engine)
        return loom::add(s * 0.0, loom::to(loom::to(src, dtype()), device()));
      });
}

}  // namespace loom
