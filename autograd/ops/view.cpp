// autograd/ops/view.cpp — differentiable views and conversions. Each backward returns the
// gradient in the input's shape: views that drop or reorder elements put them back (zeros
// elsewhere); expand sums over the repeated dims.

#include "autograd/ops/view.h"

#include "autograd/function.h"
#include "tensor/copy.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::record_view;
using autograd::Saved;

// A view whose backward is "reshape the gradient back to the input's shape".
static Tensor reshaping_view(const char* name, Tensor out, const Tensor& x) {
  const Shape in_shape = x.sizes();
  return record_view(name, std::move(out), x, [in_shape](const Grads& dout, Saved&, Grads& g) {
    g[0] = k::reshape(dout[0], in_shape);
  });
}

Tensor view(const Tensor& x, const Shape& shape) {
  return reshaping_view("view", k::view(x, shape), x);
}
Tensor reshape(const Tensor& x, const Shape& shape) {
  return reshaping_view("reshape", k::reshape(x, shape), x);
}
Tensor squeeze(const Tensor& x) { return reshaping_view("squeeze", k::squeeze(x), x); }
Tensor squeeze(const Tensor& x, int64_t dim) {
  return reshaping_view("squeeze", k::squeeze(x, dim), x);
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return reshaping_view("unsqueeze", k::unsqueeze(x, dim), x);
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return reshaping_view("flatten", k::flatten(x, start_dim, end_dim), x);
}

// d permute(x, p): permute dout by the inverse of p
Tensor permute(const Tensor& x, const Shape& dims) {
  Tensor out = k::permute(x, dims);
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], x.dim(), "permute")] = i;
  return record_view("permute", out, x, [inverse](const Grads& dout, Saved&, Grads& g) {
    g[0] = k::permute(dout[0], inverse);
  });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  return record_view(
      "transpose", k::transpose(x, d0, d1), x,
      [d0, d1](const Grads& dout, Saved&, Grads& g) { g[0] = k::transpose(dout[0], d0, d1); });
}

// d slice: dout placed into zeros of the input's shape at the sliced positions
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor out = k::slice(x, dim, start, end, step);
  const Shape in_shape = x.sizes();
  return record_view("slice", out, x,
                     [in_shape, dim, start, end, step](const Grads& dout, Saved&, Grads& g) {
                       Tensor dx = zeros(in_shape, dout[0].dtype(), dout[0].device());
                       k::copy_(k::slice(dx, dim, start, end, step), dout[0]);
                       g[0] = dx;
                     });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor out = k::narrow(x, dim, start, length);  // checks the arguments
  const int64_t d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t s = start < 0 ? start + x.sizes()[d] : start;
  return slice(x, d, s, s + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  Tensor out = k::select(x, dim, index);
  const Shape in_shape = x.sizes();
  const int64_t d = wrap_dim(dim, x.dim(), "select");
  const int64_t i = index < 0 ? index + x.sizes()[d] : index;
  return record_view("select", out, x, [in_shape, d, i](const Grads& dout, Saved&, Grads& g) {
    Tensor dx = zeros(in_shape, dout[0].dtype(), dout[0].device());
    k::copy_(k::select(dx, d, i), dout[0]);
    g[0] = dx;
  });
}

// d expand: the engine sums the expanded dims back (the gradient keeps the expanded shape)
Tensor expand(const Tensor& x, const Shape& shape) {
  return record_view("expand", k::expand(x, shape), x,
                     [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return record("contiguous", k::clone(x), {x}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  Tensor y = k::contiguous(x, format);
  if (y.is_same(x)) return x;
  return record("contiguous", std::move(y), {x}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}

Tensor clone(const Tensor& x) {
  return record("clone", k::clone(x), {x}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}

// d to(dtype): the engine converts the gradient back to the input's dtype
Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return record("to", k::to_dtype(x, dtype), {x}, {},
                [](const Grads& dout, Saved&, Grads& g) { g[0] = dout[0]; });
}

// The gradient goes back in x's dtype and memory format in one conversion: autocast casts a
// weight into the layout of a channels-last input (Note [Autocast policy]), and the
// convolution's gradient of that cast comes back in the same layout. Converted here into the
// weight's own format, it reaches AccumulateGrad as .grad needs it, with no second copy.
Tensor to(const Tensor& x, DType dtype, MemoryFormat format) {
  if (x.dtype() == dtype && x.is_contiguous(format)) return x;
  const DType x_dtype = x.dtype();
  const MemoryFormat x_format = suggest_memory_format(x);
  return record("to", k::to_dtype(x, dtype, format), {x}, {},
                [x_dtype, x_format](const Grads& dout, Saved&, Grads& g) {
                  g[0] = k::to_dtype(dout[0], x_dtype, x_format);
                });
}

Tensor to(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  const Device from = x.device();
  return record(
      "to", k::to_device(x, device), {x}, {},
      [from](const Grads& dout, Saved&, Grads& g) { g[0] = k::to_device(dout[0], from); });
}

}  // namespace loom
