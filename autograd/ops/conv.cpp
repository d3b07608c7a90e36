// autograd/ops/conv.cpp — differentiable conv2d and 2-D pooling. The kernels (tensor/conv.h)
// do the work in both directions; each backward below names its derivative.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/conv.h"

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "tensor/conv.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

// out = W * x + b (cross-correlation): dx = col2im(W^T dout) ; dweight = dout im2col(x)^T ;
// dbias = sum over n, h, w of dout
Tensor ops_impl::conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride,
                        Pair padding, Pair dilation, int64_t groups) {
  const k::Conv2dOptions options{stride, padding, dilation, groups};
  return record("conv2d", k::conv2d(x, weight, bias, options), {x, weight, bias}, {x, weight},
                [options](const Grads& dout, Saved& s, Grads& g) {
                  k::Conv2dGrads grads =
                      k::conv2d_backward(dout[0], s[0], s[1], options,
                                         {s.needs_grad(0), s.needs_grad(1), s.needs_grad(2)});
                  g[0] = std::move(grads.dx);
                  g[1] = std::move(grads.dweight);
                  g[2] = std::move(grads.dbias);
                });
}

// d max: dout routed to the position of each window's maximum (the saved indices)
Tensor ops_impl::max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                            bool ceil_mode) {
  const k::Pool2dOptions options{kernel, stride, padding, dilation, ceil_mode, true};
  auto [out, indices] = k::max_pool2d(x, options);
  const Shape x_shape = x.sizes();
  const MemoryFormat x_format = suggest_memory_format(x);  // dx takes x's format
  return record("max_pool2d", out, {x}, {indices},
                [x_shape, x_format](const Grads& dout, Saved& s, Grads& g) {
                  g[0] = k::max_pool2d_backward(dout[0], s[0], x_shape, x_format);
                });
}

// d mean over a window: dout / divisor spread over the window's input elements
Tensor ops_impl::avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool ceil_mode,
                            bool count_include_pad) {
  const k::Pool2dOptions options{kernel, stride, padding, {1, 1}, ceil_mode, count_include_pad};
  const Shape x_shape = x.sizes();
  const MemoryFormat x_format = suggest_memory_format(x);
  return record("avg_pool2d", k::avg_pool2d(x, options), {x}, {},
                [x_shape, x_format, options](const Grads& dout, Saved&, Grads& g) {
                  g[0] = k::avg_pool2d_backward(dout[0], x_shape, options, x_format);
                });
}

// d mean over an adaptive window: dout / |window| spread over the window's input elements
Tensor ops_impl::adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  const Shape x_shape = x.sizes();
  const MemoryFormat x_format = suggest_memory_format(x);
  return record("adaptive_avg_pool2d", k::adaptive_avg_pool2d(x, output_size), {x}, {},
                [x_shape, x_format](const Grads& dout, Saved&, Grads& g) {
                  g[0] = k::adaptive_avg_pool2d_backward(dout[0], x_shape, x_format);
                });
}

}  // namespace loom
