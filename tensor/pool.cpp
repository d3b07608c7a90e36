// tensor/pool.cpp — the front of the pools (declared in tensor/conv.h): PyTorch's output sizes
// and the window geometry that both devices use, the argument checks, and the one device switch
// to tensor/cpu/pool.cpp or the CUDA backend (tensor/cuda_backend.h).

#include "tensor/cpu/pool.h"

#include "tensor/checks.h"
#include "tensor/conv.h"
#include "tensor/cuda_backend.h"

namespace loom::kernels {

int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation, bool ceil_mode) {
  const int64_t numer =
      in + 2 * padding - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (numer >= 0 ? numer / stride : -((-numer + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + padding) --out;  // the last window starts inside
  return out;
}

// Checks x and the options as PyTorch does; stride {0,0} becomes the kernel size.
Pool2dGeometry pool2d_geometry(const char* op, const Shape& x, const Pool2dOptions& opt,
                               bool dilated) {
  LOOM_CHECK(x.size() == 4, ShapeError, op, ": expected a 4-D input x [N, C, H, W]; got x=", x);
  const Pair stride = opt.stride == Pair{0, 0} ? opt.kernel : opt.stride;
  const Pair dilation = dilated ? opt.dilation : Pair{1, 1};
  auto pair = [](Pair p) { return detail::str("(", p[0], ", ", p[1], ")"); };
  LOOM_CHECK(opt.kernel[0] >= 1 && opt.kernel[1] >= 1, ValueError, op,
             ": expected kernel >= 1; got kernel=", pair(opt.kernel), " x=", x);
  LOOM_CHECK(stride[0] >= 1 && stride[1] >= 1, ValueError, op,
             ": expected stride >= 1 (or (0, 0) for the kernel size); got stride=",
             pair(opt.stride), " x=", x);
  LOOM_CHECK(dilation[0] >= 1 && dilation[1] >= 1, ValueError, op,
             ": expected dilation >= 1; got dilation=", pair(opt.dilation), " x=", x);
  LOOM_CHECK(opt.padding[0] >= 0 && opt.padding[1] >= 0 && opt.padding[0] <= opt.kernel[0] / 2 &&
                 opt.padding[1] <= opt.kernel[1] / 2,
             ValueError, op,
             ": padding must be between 0 and half the kernel; got padding=", pair(opt.padding),
             " kernel=", pair(opt.kernel), " x=", x);
  Pool2dGeometry g;
  g.planes = x[0] * x[1], g.h = x[2], g.w = x[3];
  g.ho =
      pool_output_size(g.h, opt.kernel[0], stride[0], opt.padding[0], dilation[0], opt.ceil_mode);
  g.wo =
      pool_output_size(g.w, opt.kernel[1], stride[1], opt.padding[1], dilation[1], opt.ceil_mode);
  LOOM_CHECK(g.ho >= 1 && g.wo >= 1, ShapeError, op, ": output size is too small; x=", x,
             " gives [", x[0], ", ", x[1], ", ", g.ho, ", ", g.wo,
             "] with kernel=", pair(opt.kernel), " stride=", pair(stride),
             " padding=", pair(opt.padding), " dilation=", pair(dilation));
  g.kernel = opt.kernel, g.stride = stride, g.padding = opt.padding, g.dilation = dilation;
  return g;
}

namespace {

void check_grad(const char* op, const Tensor& dout, const Shape& x_shape, const Pool2dGeometry& g) {
  LOOM_CHECK(dout.dim() == 4 && dout.size(0) == x_shape[0] && dout.size(1) == x_shape[1] &&
                 dout.size(2) == g.ho && dout.size(3) == g.wo,
             ShapeError, op, ": dout=", dout.sizes(), " does not match the output of x=", x_shape);
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d", x.sizes(), options, /*dilated=*/true);
  if (on_cuda("max_pool2d", {x})) return cuda_backend().max_pool2d(x, options);
  return cpu::max_pool2d(x, g);
}

Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format) {
  LOOM_CHECK(x_shape.size() == 4 && dout.dim() == 4 && indices.sizes() == dout.sizes() &&
                 dout.size(0) == x_shape[0] && dout.size(1) == x_shape[1],
             ShapeError, "max_pool2d_backward: dout=", dout.sizes(), " indices=", indices.sizes(),
             " do not match x=", x_shape);
  LOOM_CHECK(indices.dtype() == kInt64, DTypeError,
             "max_pool2d_backward: expected int64 indices; got ", indices.dtype());
  if (on_cuda("max_pool2d_backward", {dout, indices}))
    return cuda_backend().max_pool2d_backward(dout, indices, x_shape, format);
  return cpu::max_pool2d_backward(dout, indices, x_shape, format);
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Pool2dGeometry g = pool2d_geometry("avg_pool2d", x.sizes(), options, /*dilated=*/false);
  if (on_cuda("avg_pool2d", {x})) return cuda_backend().avg_pool2d(x, options);
  return cpu::avg_pool2d(x, g, options.count_include_pad);
}

Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, const Pool2dOptions& options,
                           MemoryFormat format) {
  const Pool2dGeometry g = pool2d_geometry("avg_pool2d_backward", x_shape, options, false);
  check_grad("avg_pool2d_backward", dout, x_shape, g);
  if (on_cuda("avg_pool2d_backward", {dout}))
    return cuda_backend().avg_pool2d_backward(dout, x_shape, options, format);
  return cpu::avg_pool2d_backward(dout, x_shape, g, options.count_include_pad, format);
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  LOOM_CHECK(x.dim() == 4, ShapeError,
             "adaptive_avg_pool2d: expected a 4-D input x [N, C, H, W]; got x=", x.sizes());
  LOOM_CHECK(output_size[0] >= 1 && output_size[1] >= 1, ValueError,
             "adaptive_avg_pool2d: expected output_size >= 1; got output_size=(", output_size[0],
             ", ", output_size[1], ") x=", x.sizes());
  LOOM_CHECK(x.size(2) >= 1 && x.size(3) >= 1, ShapeError,
             "adaptive_avg_pool2d: expected a non-empty input plane; got x=", x.sizes());
  if (on_cuda("adaptive_avg_pool2d", {x}))
    return cuda_backend().adaptive_avg_pool2d(x, output_size);
  return cpu::adaptive_avg_pool2d(x, output_size);
}

Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, MemoryFormat format) {
  LOOM_CHECK(x_shape.size() == 4 && dout.dim() == 4 && dout.size(0) == x_shape[0] &&
                 dout.size(1) == x_shape[1],
             ShapeError, "adaptive_avg_pool2d_backward: dout=", dout.sizes(),
             " does not match x=", x_shape);
  if (on_cuda("adaptive_avg_pool2d_backward", {dout}))
    return cuda_backend().adaptive_avg_pool2d_backward(dout, x_shape, format);
  return cpu::adaptive_avg_pool2d_backward(dout, x_shape, format);
}

}  // namespace loom::kernels
