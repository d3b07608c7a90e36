// tensor/conv.cpp — the front of conv2d (tensor/conv.h): the argument checks and the output
// shape that both devices use, the CPU's choice of algorithm, the CPU's 16-bit rule, and the one
// device switch to tensor/cpu/conv.cpp or the CUDA backend (tensor/cuda_backend.h).

#include "tensor/conv.h"

#include <atomic>
#include <string>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/conv.h"
#include "tensor/cpu/conv_bf16.h"
#include "tensor/cuda_backend.h"

namespace loom::kernels {

namespace {

std::atomic<Conv2dAlgorithm> g_algorithm{Conv2dAlgorithm::kAuto};

void check_pair(const char* op, const char* name, Pair value, int64_t min) {
  LOOM_CHECK(value[0] >= min && value[1] >= min, ValueError, op, ": expected ", name, " >= ", min,
             "; got ", name, "=(", value[0], ", ", value[1], ")");
}

}  // namespace

void set_conv2d_algorithm(Conv2dAlgorithm algorithm) { g_algorithm.store(algorithm); }
Conv2dAlgorithm get_conv2d_algorithm() { return g_algorithm.load(); }

namespace {
constexpr Conv2dAlgorithm kAlgorithms[] = {
    Conv2dAlgorithm::kAuto,         Conv2dAlgorithm::kIm2colGemm,   Conv2dAlgorithm::kPacked,
    Conv2dAlgorithm::kWinogradF2x2, Conv2dAlgorithm::kWinogradF4x4, Conv2dAlgorithm::kDirect,
    Conv2dAlgorithm::kBenchmark};
}  // namespace

std::string_view to_string(Conv2dAlgorithm algorithm) {
  switch (algorithm) {
    case Conv2dAlgorithm::kAuto:
      return "auto";
    case Conv2dAlgorithm::kIm2colGemm:
      return "im2col";
    case Conv2dAlgorithm::kPacked:
      return "packed";
    case Conv2dAlgorithm::kWinogradF2x2:
      return "winograd2";
    case Conv2dAlgorithm::kWinogradF4x4:
      return "winograd4";
    case Conv2dAlgorithm::kDirect:
      return "direct";
    case Conv2dAlgorithm::kBenchmark:
      return "benchmark";
  }
  return "?";
}

std::span<const Conv2dAlgorithm> conv2d_algorithms() { return kAlgorithms; }

Conv2dAlgorithm parse_conv2d_algorithm(std::string_view name) {
  std::string names;
  for (const Conv2dAlgorithm algorithm : kAlgorithms) {
    if (name == to_string(algorithm)) return algorithm;
    names += std::string(names.empty() ? "" : ", ") + std::string(to_string(algorithm));
  }
  throw ValueError(detail::str("conv2d algorithm '", name, "': expected one of ", names));
}

std::vector<Conv2dChoice> conv2d_choices() { return cpu::conv2d_choices(); }
void clear_conv2d_choices() { cpu::clear_conv2d_choices(); }

Shape conv2d_output_shape(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Conv2dOptions& opt) {
  common_device("conv2d", {x, weight, bias});
  LOOM_CHECK(x.dim() == 4, ShapeError,
             "conv2d: expected a 4-D input x [N, C, H, W]; got x=", x.sizes());
  LOOM_CHECK(weight.dim() == 4, ShapeError,
             "conv2d: expected a 4-D weight [O, C/groups, kh, kw]; got weight=", weight.sizes());
  LOOM_CHECK(x.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
             DTypeError, "conv2d: dtypes differ; got x=", x.dtype(), " weight=", weight.dtype(),
             bias.defined() ? " bias=" : "", bias.defined() ? detail::str(bias.dtype()) : "");
  check_pair("conv2d", "stride", opt.stride, 1);
  check_pair("conv2d", "padding", opt.padding, 0);
  check_pair("conv2d", "dilation", opt.dilation, 1);
  const int64_t c = x.size(1), o = weight.size(0), groups = opt.groups;
  LOOM_CHECK(groups >= 1, ValueError, "conv2d: expected groups >= 1; got groups=", groups);
  LOOM_CHECK(c % groups == 0, ValueError, "conv2d: groups=", groups,
             " does not divide the input channels; got x=", x.sizes());
  LOOM_CHECK(o % groups == 0, ValueError, "conv2d: groups=", groups,
             " does not divide the output channels; got weight=", weight.sizes());
  LOOM_CHECK(weight.size(1) * groups == c, ShapeError, "conv2d: x has ", c,
             " channels but weight expects ", weight.size(1) * groups,
             " (C/groups=", weight.size(1), ", groups=", groups, "); got x=", x.sizes(),
             " weight=", weight.sizes());
  LOOM_CHECK(weight.size(2) >= 1 && weight.size(3) >= 1, ShapeError,
             "conv2d: expected a kernel of at least 1x1; got weight=", weight.sizes());
  if (bias.defined())
    LOOM_CHECK(bias.dim() == 1 && bias.size(0) == o, ShapeError, "conv2d: expected bias [", o,
               "]; got bias=", bias.sizes(), " weight=", weight.sizes());
  Shape out{x.size(0), o, 0, 0};
  for (int d = 0; d < 2; ++d) {
    const int64_t padded = x.size(2 + d) + 2 * opt.padding[d];
    const int64_t extent = opt.dilation[d] * (weight.size(2 + d) - 1) + 1;
    LOOM_CHECK(extent <= padded, ShapeError, "conv2d: the kernel (", extent,
               " with dilation) is larger than the padded input (", padded, "); got x=", x.sizes(),
               " weight=", weight.sizes(), " padding=(", opt.padding[0], ", ", opt.padding[1], ")");
    out[2 + d] = (padded - extent) / opt.stride[d] + 1;
  }
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  const Shape out_shape = conv2d_output_shape(x, weight, bias, options);
  if (on_cuda("conv2d", {x, weight, bias})) return cuda_backend().conv2d(x, weight, bias, options);
  if (is_16bit_float(x.dtype())) {          // Note [16-bit products on the CPU] (tensor/linalg.cpp)
    if (cpu::conv2d_bf16_fits(x, options))  // Note [bf16 convolutions]
      return cpu::conv2d_bf16(x, weight, bias, options, out_shape);
    return to_dtype(conv2d(widened(x), widened(weight), widened(bias), options), x.dtype());
  }
  return cpu::conv2d(x, weight, bias, options, out_shape);
}

Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Conv2dOptions& options, std::array<bool, 3> needs) {
  const Shape out_shape = conv2d_output_shape(x, weight, Tensor(), options);
  common_device("conv2d_backward", {dout, x});
  LOOM_CHECK(dout.sizes() == out_shape, ShapeError, "conv2d_backward: expected dout ", out_shape,
             "; got dout=", dout.sizes(), " x=", x.sizes(), " weight=", weight.sizes());
  LOOM_CHECK(dout.dtype() == x.dtype(), DTypeError,
             "conv2d_backward: dtypes differ; got dout=", dout.dtype(), " x=", x.dtype());
  if (on_cuda("conv2d_backward", {dout, x, weight}))
    return cuda_backend().conv2d_backward(dout, x, weight, options, needs);
  if (is_16bit_float(x.dtype())) {          // Note [16-bit products on the CPU] (tensor/linalg.cpp)
    if (cpu::conv2d_bf16_fits(x, options))  // Note [bf16 convolutions]
      return cpu::conv2d_bf16_backward(dout, x, weight, options, needs);
    Conv2dGrads grads = conv2d_backward(widened(dout), widened(x), widened(weight), options, needs);
    for (Tensor* g : {&grads.dx, &grads.dweight, &grads.dbias})
      if (g->defined()) *g = to_dtype(*g, x.dtype());
    return grads;
  }
  return cpu::conv2d_backward(dout, x, weight, options, needs);
}

}  // namespace loom::kernels
