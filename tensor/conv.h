// tensor/conv.h — convolution and pooling kernels over NCHW tensors, forward and backward, with
// no autograd (autograd/ops/conv.cpp wraps them). The fronts tensor/conv.cpp and tensor/pool.cpp
// check the arguments and pick the device; conv2d is GEMM on the patches of the input on the CPU
// (tensor/cpu/conv.cpp, Note [conv2d on the CPU]), pooling is tensor/cpu/pool.cpp. Shapes,
// defaults and errors follow PyTorch.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::kernels {

using Pair = std::array<int64_t, 2>;  // (height, width)

struct Conv2dOptions {
  Pair stride{1, 1};
  Pair padding{0, 0};
  Pair dilation{1, 1};
  int64_t groups = 1;
};

// Checks x [N,C,H,W], weight [O,C/groups,kh,kw], bias [O] (or undefined) and the options;
// returns the output shape [N,O,Ho,Wo] with Ho = (H + 2 ph - dh (kh-1) - 1) / sh + 1.
Shape conv2d_output_shape(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Conv2dOptions& options);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options);

// How conv2d multiplies on the CPU (Note [conv2d on the CPU]). kAuto picks per call from the
// shape and the thread count, reproducibly. kBenchmark times every method on each layer's
// first call and keeps the fastest (Note [Choosing convolutions by measurement] in
// tensor/cpu/conv.cpp), as PyTorch's cudnn.benchmark does. The others force one path; tests
// compare them and benchmarks time them. The Winograd ones (Note [Winograd convolution] in
// tensor/cpu/winograd.cpp) apply to the float32 3x3 stride-1 ungrouped undilated layers with
// padding up to 2, kDirect (Note [Direct 3x3 convolution] in tensor/cpu/conv_direct.cpp) to
// those with padding 1 whose shape direct_conv3x3_fits; other layers take kAuto's path.
enum class Conv2dAlgorithm {
  kAuto,
  kIm2colGemm,
  kPacked,
  kWinogradF2x2,
  kWinogradF4x4,
  kDirect,
  kBenchmark
};
void set_conv2d_algorithm(Conv2dAlgorithm algorithm);
Conv2dAlgorithm get_conv2d_algorithm();
// "auto", "im2col", "packed", "winograd2", "winograd4", "direct", "benchmark"; parse raises
// ValueError naming them all.
std::string_view to_string(Conv2dAlgorithm algorithm);
Conv2dAlgorithm parse_conv2d_algorithm(std::string_view name);
// Every algorithm, in that order: the one list that parse_conv2d_algorithm and the apps' flags
// accept.
std::span<const Conv2dAlgorithm> conv2d_algorithms();

// What kBenchmark chose: one entry per layer shape and pass measured, in the order measured.
struct Conv2dChoice {
  Shape x, weight;  // [N, C, H, W] and [O, C/groups, kh, kw]
  Pair stride, padding;
  bool channels_last;  // x was, and "packed channels-last" a candidate
  std::string pass;    // "forward", or "backward" with the gradients asked for, e.g. "dx dw"
  int threads;         // get_num_threads() then
  std::string chosen;  // "packed", "im2col", "winograd F(4x4,3x3)", ...
  std::vector<std::pair<std::string, double>> seconds;  // each candidate's faster run
  int64_t calls;                                        // the calls that used the choice
};
std::vector<Conv2dChoice> conv2d_choices();
void clear_conv2d_choices();

// The gradients conv2d's backward asked for (needs = {dx, dweight, dbias}); others undefined.
// dx is in x's memory format and dweight in the weight's (a channels-last weight, as
// nn::Module::to(MemoryFormat::kChannelsLast) stores it, gets a channels-last gradient).
struct Conv2dGrads {
  Tensor dx, dweight, dbias;
};
Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Conv2dOptions& options, std::array<bool, 3> needs);

// Pooling windows. stride {0,0} means "the kernel size", as PyTorch's default. dilation is
// used by max pooling only, count_include_pad by average pooling only.
struct Pool2dOptions {
  Pair kernel{1, 1};
  Pair stride{0, 0};
  Pair padding{0, 0};
  Pair dilation{1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
};

// PyTorch's pooling output size: floor (or ceil) of (in + 2 pad - dilation (k-1) - 1) / stride
// + 1, and with ceil_mode the last window must start inside the input or the left padding.
int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation, bool ceil_mode);

// A pooling call's geometry, for both devices: N C planes of H x W in, Ho x Wo out, and the
// window with stride {0,0} replaced by the kernel (and dilation {1,1} where it does not apply).
struct Pool2dGeometry {
  int64_t planes, h, w, ho, wo;
  Pair kernel, stride, padding, dilation;
};

// Checks x_shape [N,C,H,W] and the options as PyTorch does (errors name `op`) and returns the
// geometry; `dilated` says whether options.dilation applies (max pooling only).
Pool2dGeometry pool2d_geometry(const char* op, const Shape& x_shape, const Pool2dOptions& options,
                               bool dilated);

// The pools keep their input's memory format (Note [Memory formats], tensor/tensor.cpp): the
// forwards allocate their results in suggest_memory_format(x); the backwards, which see only
// x's shape, allocate dx in `format` (autograd passes the forward input's).

// Returns (values, int64 indices of each maximum within its H*W input plane: h W + w).
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format = MemoryFormat::kContiguous);

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, const Pool2dOptions& options,
                           MemoryFormat format = MemoryFormat::kContiguous);

// Output cell i averages input rows [floor(i In / Out), ceil((i+1) In / Out)), likewise columns.
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);
Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape,
                                    MemoryFormat format = MemoryFormat::kContiguous);

}  // namespace loom::kernels
