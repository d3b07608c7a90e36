// tests/cuda/conv_cuda_test.cpp — conv2d and its backward through cuDNN (tensor/cuda/conv.h)
// against the CPU kernels (tensor/conv.h): strides, padding, dilation, groups, the ResNet-18
// CIFAR layers at a small batch, channels-last and strided inputs, the gradients asked for,
// float16/bfloat16 against float32, TF32, determinism, degenerate shapes and errors. Every test
// skips without a GPU.

#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/conv.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

namespace k = kernels;
using k::Conv2dOptions;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

// A CUDA result on the CPU: contiguous tensors directly, channels-last ones (NHWC strides)
// through their contiguous [N, H, W, C] permutation.
Tensor host(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t.defined() ? t.to(kCPU) : t;
  return k::permute(k::permute(t, {0, 2, 3, 1}).to(kCPU), {0, 3, 1, 2});
}

// A CUDA copy of x [N, C, H, W] stored channels-last.
Tensor gpu_channels_last(const Tensor& x) {
  return k::permute(gpu(k::contiguous(k::permute(x, {0, 2, 3, 1}))), {0, 3, 1, 2});
}

bool is_channels_last(const Tensor& t) { return t.stride(1) == 1 && t.size(1) > 1; }

// Sets cuDNN's TF32 switch for a scope (the tests that compare float32 tightly turn it off).
struct CudnnTf32Guard {
  explicit CudnnTf32Guard(bool allow) : previous(cuda::cudnn_allow_tf32()) {
    cuda::set_cudnn_allow_tf32(allow);
  }
  ~CudnnTf32Guard() { cuda::set_cudnn_allow_tf32(previous); }
  bool previous;
};

struct ConvCase {
  Shape x, w;
  Conv2dOptions options;
  bool bias = true;
};

Conv2dOptions opts(k::Pair stride, k::Pair padding, k::Pair dilation = {1, 1}, int64_t groups = 1) {
  return {stride, padding, dilation, groups};
}

// Forward and every gradient on cuda:0 against the CPU. `channels_last` runs the CUDA side on
// an NHWC copy of x; `expect_nhwc` also asks that out and dx come back channels-last (cuDNN may
// lack NHWC algorithms for unusual shapes, where loom falls back to NCHW).
void expect_conv_matches(const ConvCase& c, DType dtype, double tol, bool channels_last = false,
                         bool expect_nhwc = false) {
  const Tensor x = randn(c.x, dtype), w = randn(c.w, dtype);
  const Tensor b = c.bias ? randn({c.w[0]}, dtype) : Tensor();
  const Tensor gx = channels_last ? gpu_channels_last(x) : gpu(x);
  const Tensor out = cuda::conv2d(gx, gpu(w), c.bias ? gpu(b) : Tensor(), c.options);
  const Tensor expected = k::conv2d(x, w, b, c.options);
  EXPECT_TRUE(tensors_close(host(out), expected, tol, tol))
      << "forward x=" << detail::str(c.x) << " w=" << detail::str(c.w) << " " << dtype;
  if (expect_nhwc) {
    EXPECT_TRUE(is_channels_last(out));
  }

  const Tensor dout = randn(expected.sizes(), dtype);
  const k::Conv2dGrads want = k::conv2d_backward(dout, x, w, c.options, {true, true, true});
  const k::Conv2dGrads got =
      cuda::conv2d_backward(gpu(dout), gx, gpu(w), c.options, {true, true, true});
  EXPECT_TRUE(tensors_close(host(got.dx), want.dx, tol, tol))
      << "dx x=" << detail::str(c.x) << " w=" << detail::str(c.w) << " " << dtype;
  EXPECT_TRUE(got.dweight.is_contiguous());
  EXPECT_TRUE(tensors_close(host(got.dweight), want.dweight, tol, tol))
      << "dweight x=" << detail::str(c.x) << " w=" << detail::str(c.w) << " " << dtype;
  EXPECT_TRUE(tensors_close(host(got.dbias), want.dbias, tol, tol))
      << "dbias x=" << detail::str(c.x) << " w=" << detail::str(c.w) << " " << dtype;
  if (expect_nhwc) {
    EXPECT_TRUE(is_channels_last(got.dx));
  }
}

const std::vector<ConvCase>& geometry_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, opts({1, 1}, {1, 1})},
      {{2, 4, 9, 7}, {5, 4, 3, 3}, opts({2, 2}, {1, 1})},             // odd sizes, stride 2
      {{1, 2, 11, 10}, {3, 2, 3, 3}, opts({1, 1}, {2, 1}, {2, 2})},   // dilation
      {{2, 4, 6, 6}, {6, 2, 3, 3}, opts({1, 1}, {1, 1}, {1, 1}, 2)},  // groups
      {{2, 4, 7, 7}, {4, 1, 3, 3}, opts({1, 1}, {1, 1}, {1, 1}, 4)},  // depthwise
      {{2, 8, 8, 8}, {16, 8, 1, 1}, opts({2, 2}, {0, 0}), false},     // 1x1 downsample
      {{3, 5, 6, 9}, {7, 5, 1, 3}, opts({2, 1}, {0, 1})},             // asymmetric
      {{1, 1, 5, 5}, {1, 1, 5, 5}, opts({1, 1}, {0, 0})},             // one output pixel
  };
  return cases;
}

TEST(CudaConv, MatchesCpuFloat64) {
  LOOM_SKIP_WITHOUT_GPU();
  for (const ConvCase& c : geometry_cases()) expect_conv_matches(c, kFloat64, 1e-9);
}

TEST(CudaConv, MatchesCpuFloat32WithoutTf32) {
  LOOM_SKIP_WITHOUT_GPU();
  CudnnTf32Guard guard(false);
  for (const ConvCase& c : geometry_cases()) expect_conv_matches(c, kFloat32, 1e-3);
}

// The ResNet-18 CIFAR layers (3x3 convs, stride-2 stages, 1x1 downsamples) at batch 2.
TEST(CudaConv, ResNet18CifarLayers) {
  LOOM_SKIP_WITHOUT_GPU();
  CudnnTf32Guard guard(false);
  const std::vector<ConvCase> layers = {
      {{2, 3, 32, 32}, {64, 3, 3, 3}, opts({1, 1}, {1, 1}), false},
      {{2, 64, 32, 32}, {64, 64, 3, 3}, opts({1, 1}, {1, 1}), false},
      {{2, 64, 32, 32}, {128, 64, 3, 3}, opts({2, 2}, {1, 1}), false},
      {{2, 64, 32, 32}, {128, 64, 1, 1}, opts({2, 2}, {0, 0}), false},
      {{2, 128, 16, 16}, {256, 128, 3, 3}, opts({2, 2}, {1, 1}), false},
      {{2, 256, 8, 8}, {512, 256, 3, 3}, opts({2, 2}, {1, 1}), false},
      {{2, 512, 4, 4}, {512, 512, 3, 3}, opts({1, 1}, {1, 1}), false},
  };
  for (const ConvCase& c : layers) expect_conv_matches(c, kFloat32, 2e-3);
}

TEST(CudaConv, ChannelsLastInput) {
  LOOM_SKIP_WITHOUT_GPU();
  CudnnTf32Guard guard(false);
  for (const ConvCase& c : geometry_cases())
    if (c.x[1] > 1) expect_conv_matches(c, kFloat32, 1e-3, /*channels_last=*/true);
  expect_conv_matches({{2, 64, 16, 16}, {32, 64, 3, 3}, opts({1, 1}, {1, 1})}, kFloat32, 2e-3,
                      /*channels_last=*/true, /*expect_nhwc=*/true);
  // float64 runs a channels-last input as NCHW, and converts the output back to x's format.
  const Tensor x = randn({2, 4, 6, 6}, kFloat64), w = randn({3, 4, 3, 3}, kFloat64);
  const Tensor out = cuda::conv2d(gpu_channels_last(x), gpu(w), Tensor(), opts({1, 1}, {1, 1}));
  EXPECT_TRUE(out.is_contiguous(MemoryFormat::kChannelsLast));
  EXPECT_TRUE(cuda_matches_cpu(out, k::conv2d(x, w, Tensor(), opts({1, 1}, {1, 1})), 1e-9, 1e-9));
}

// A channels-last weight (what autocast casts a weight to for a channels-last x) gets its
// gradient channels-last, as cuDNN's NHWC call writes it; float64 runs NCHW and still answers in
// the weight's format. A 1x1 weight's two orders are the same bytes.
TEST(CudaConv, ChannelsLastWeightGetsAChannelsLastGradient) {
  LOOM_SKIP_WITHOUT_GPU();
  CudnnTf32Guard guard(false);
  for (const DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& ws : {Shape{32, 16, 3, 3}, Shape{32, 16, 1, 1}}) {
      SCOPED_TRACE(detail::str(dtype, " w=", ws));
      const Tensor x = randn({2, 16, 8, 8}, dtype), w = randn(ws, dtype);
      const auto o = ws[2] == 3 ? opts({1, 1}, {1, 1}) : opts({1, 1}, {0, 0});
      const Tensor dout = randn(k::conv2d(x, w, Tensor(), o).sizes(), dtype);
      const k::Conv2dGrads want = k::conv2d_backward(dout, x, w, o, {true, true, false});
      const k::Conv2dGrads got =
          cuda::conv2d_backward(gpu_channels_last(dout), gpu_channels_last(x), gpu_channels_last(w),
                                o, {true, true, false});
      EXPECT_TRUE(got.dweight.is_contiguous(MemoryFormat::kChannelsLast));
      const double tol = dtype == kFloat32 ? 1e-3 : 1e-9;
      EXPECT_TRUE(tensors_close(host(got.dweight), want.dweight, tol, tol));
      EXPECT_TRUE(tensors_close(host(got.dx), want.dx, tol, tol));
    }
  }
}

TEST(CudaConv, StridedViewsAreCopied) {
  LOOM_SKIP_WITHOUT_GPU();
  const Conv2dOptions o = opts({1, 1}, {1, 1});
  const Tensor big = randn({2, 6, 10, 12}, kFloat64), w = randn({4, 3, 3, 3}, kFloat64);
  // Every other channel and a column window: neither NCHW- nor NHWC-dense.
  const Tensor x = k::narrow(k::slice(big, 1, 0, 6, 2), 3, 1, 8);
  const Tensor gx = k::narrow(k::slice(gpu(big), 1, 0, 6, 2), 3, 1, 8);
  // A strided bias; below, a dout stored transposed in its last two dims.
  const Tensor bias2 = randn({8}, kFloat64);
  const Tensor gbias = k::slice(gpu(bias2), 0, 0, 8, 2);
  EXPECT_TRUE(cuda_matches_cpu(cuda::conv2d(gx, gpu(w), gbias, o),
                               k::conv2d(x, w, k::slice(bias2, 0, 0, 8, 2), o), 1e-9, 1e-9));
  const Tensor dout = randn({2, 4, 10, 8}, kFloat64);
  const Tensor gdout = k::transpose(gpu(k::contiguous(k::transpose(dout, 2, 3))), 2, 3);
  const k::Conv2dGrads want = k::conv2d_backward(dout, x, w, o, {true, true, true});
  const k::Conv2dGrads got = cuda::conv2d_backward(gdout, gx, gpu(w), o, {true, true, true});
  EXPECT_TRUE(cuda_matches_cpu(got.dx, want.dx, 1e-9, 1e-9));
  EXPECT_TRUE(cuda_matches_cpu(got.dweight, want.dweight, 1e-9, 1e-9));
  EXPECT_TRUE(cuda_matches_cpu(got.dbias, want.dbias, 1e-9, 1e-9));
}

TEST(CudaConv, OnlyTheGradientsAskedFor) {
  LOOM_SKIP_WITHOUT_GPU();
  const Conv2dOptions o = opts({2, 2}, {1, 1});
  const Tensor x = randn({2, 3, 7, 7}, kFloat64), w = randn({4, 3, 3, 3}, kFloat64);
  const Tensor dout = randn(k::conv2d_output_shape(x, w, Tensor(), o), kFloat64);
  const k::Conv2dGrads all = k::conv2d_backward(dout, x, w, o, {true, true, true});
  for (int mask = 0; mask < 8; ++mask) {
    const std::array<bool, 3> needs = {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0};
    const k::Conv2dGrads got = cuda::conv2d_backward(gpu(dout), gpu(x), gpu(w), o, needs);
    EXPECT_EQ(got.dx.defined(), needs[0]);
    EXPECT_EQ(got.dweight.defined(), needs[1]);
    EXPECT_EQ(got.dbias.defined(), needs[2]);
    if (needs[0]) {
      EXPECT_TRUE(cuda_matches_cpu(got.dx, all.dx, 1e-9, 1e-9));
    }
    if (needs[1]) {
      EXPECT_TRUE(cuda_matches_cpu(got.dweight, all.dweight, 1e-9, 1e-9));
    }
    if (needs[2]) {
      EXPECT_TRUE(cuda_matches_cpu(got.dbias, all.dbias, 1e-9, 1e-9));
    }
  }
}

// float16 and bfloat16 (tensor cores, float32 accumulation) against float32 on the same
// rounded inputs.
TEST(CudaConv, HalfTypesAgainstFloat32) {
  LOOM_SKIP_WITHOUT_GPU();
  CudnnTf32Guard guard(false);
  const Conv2dOptions o = opts({1, 1}, {1, 1});
  for (DType dtype : {kFloat16, kBFloat16}) {
    const double rtol = dtype == kFloat16 ? 5e-3 : 2e-2, atol = dtype == kFloat16 ? 5e-2 : 3e-1;
    const Tensor x = randn({2, 16, 8, 8}).to(dtype), w = randn({8, 16, 3, 3}).to(dtype);
    const Tensor b = randn({8}).to(dtype);
    const Tensor xf = x.to(kFloat32), wf = w.to(kFloat32), bf = b.to(kFloat32);
    for (bool channels_last : {false, true}) {
      const Tensor gx = channels_last ? gpu_channels_last(x) : gpu(x);
      const Tensor out = cuda::conv2d(gx, gpu(w), gpu(b), o);
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_TRUE(tensors_close(host(out).to(kFloat32), k::conv2d(xf, wf, bf, o), rtol, atol))
          << dtype << " channels_last=" << channels_last;
      const Tensor dout = randn(out.sizes()).to(dtype);
      const k::Conv2dGrads want =
          k::conv2d_backward(dout.to(kFloat32), xf, wf, o, {true, true, true});
      const k::Conv2dGrads got =
          cuda::conv2d_backward(gpu(dout), gx, gpu(w), o, {true, true, true});
      EXPECT_TRUE(tensors_close(host(got.dx).to(kFloat32), want.dx, rtol, atol)) << dtype;
      EXPECT_TRUE(tensors_close(host(got.dweight).to(kFloat32), want.dweight, rtol, atol * 4))
          << dtype;
      EXPECT_TRUE(tensors_close(host(got.dbias).to(kFloat32), want.dbias, rtol, atol * 4)) << dtype;
    }
  }
}

TEST(CudaConv, Tf32OnByDefault) {
  LOOM_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::cudnn_allow_tf32());
  const ConvCase c{{2, 32, 8, 8}, {16, 32, 3, 3}, opts({1, 1}, {1, 1})};
  expect_conv_matches(c, kFloat32, 5e-2);
}

TEST(CudaConv, BackwardIsDeterministic) {
  LOOM_SKIP_WITHOUT_GPU();
  const Conv2dOptions o = opts({1, 1}, {1, 1});
  const Tensor x = gpu(randn({4, 64, 16, 16})), w = gpu(randn({64, 64, 3, 3}));
  const Tensor dout = gpu(randn({4, 64, 16, 16}));
  const k::Conv2dGrads first = cuda::conv2d_backward(dout, x, w, o, {true, true, true});
  const k::Conv2dGrads second = cuda::conv2d_backward(dout, x, w, o, {true, true, true});
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.to(kCPU).to_vector<double>() == b.to(kCPU).to_vector<double>();
  };
  EXPECT_TRUE(same(first.dx, second.dx));
  EXPECT_TRUE(same(first.dweight, second.dweight));
  EXPECT_TRUE(same(first.dbias, second.dbias));
}

// With set_cudnn_deterministic(false) cuDNN's own ranking picks the algorithms (PyTorch's
// default); they may add in another order, so the results only match the CPU's within
// tolerance: a ResNet-18 stage's first conv, in both layouts. The default is deterministic.
TEST(CudaConv, NonDeterministicAlgorithmsMatchTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::cudnn_deterministic());
  CudnnTf32Guard tf32(false);
  struct Restore {
    ~Restore() { cuda::set_cudnn_deterministic(true); }
  } restore;
  cuda::set_cudnn_deterministic(false);
  const ConvCase c{{4, 64, 16, 16}, {128, 64, 3, 3}, opts({2, 2}, {1, 1}), false};
  expect_conv_matches(c, kFloat32, 2e-3);
  expect_conv_matches(c, kFloat32, 2e-3, /*channels_last=*/true, /*expect_nhwc=*/true);
}

TEST(CudaConv, DegenerateShapes) {
  LOOM_SKIP_WITHOUT_GPU();
  const Conv2dOptions o = opts({1, 1}, {1, 1});
  // An empty batch: an empty output, zero weight and bias gradients.
  const Tensor x0 = randn({0, 3, 8, 8}), w = randn({4, 3, 3, 3}), b = randn({4});
  const Tensor out0 = cuda::conv2d(gpu(x0), gpu(w), gpu(b), o);
  EXPECT_EQ(out0.sizes(), (Shape{0, 4, 8, 8}));
  const k::Conv2dGrads g0 =
      cuda::conv2d_backward(gpu(empty({0, 4, 8, 8})), gpu(x0), gpu(w), o, {true, true, true});
  EXPECT_EQ(g0.dx.sizes(), (Shape{0, 3, 8, 8}));
  EXPECT_TRUE(cuda_matches_cpu(g0.dweight, zeros({4, 3, 3, 3})));
  EXPECT_TRUE(cuda_matches_cpu(g0.dbias, zeros({4})));
  // No input channels: out = bias everywhere, dbias still flows.
  const Tensor xc = randn({2, 0, 5, 5}), wc = randn({3, 0, 3, 3}), bc = randn({3});
  const Tensor outc = cuda::conv2d(gpu(xc), gpu(wc), gpu(bc), o);
  EXPECT_TRUE(
      cuda_matches_cpu(outc, k::contiguous(k::expand(k::view(bc, {1, 3, 1, 1}), {2, 3, 5, 5}))));
  const Tensor doutc = randn({2, 3, 5, 5});
  const k::Conv2dGrads gc =
      cuda::conv2d_backward(gpu(doutc), gpu(xc), gpu(wc), o, {true, true, true});
  EXPECT_EQ(gc.dx.sizes(), (Shape{2, 0, 5, 5}));
  EXPECT_TRUE(cuda_matches_cpu(gc.dbias, k::sum(doutc, {0, 2, 3}), 1e-5, 1e-5));
}

TEST(CudaConv, Errors) {
  LOOM_SKIP_WITHOUT_GPU();
  // Through the kernels:: entry points, which check before they switch to CUDA.
  const Conv2dOptions o = opts({1, 1}, {0, 0});
  EXPECT_LOOM_ERROR(k::conv2d(gpu(randn({2, 3})), gpu(randn({4, 3, 3, 3})), Tensor(), o),
                    ShapeError, {"conv2d", "[2, 3]"});
  EXPECT_LOOM_ERROR(k::conv2d(gpu(randn({1, 3, 5, 5})), gpu(randn({4, 2, 3, 3})), Tensor(), o),
                    ShapeError, {"conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]"});
  const Tensor xi = gpu(randint(0, 3, {1, 1, 4, 4})), wi = gpu(randint(0, 3, {1, 1, 3, 3}));
  EXPECT_LOOM_ERROR(k::conv2d(xi, wi, Tensor(), o), DTypeError, {"conv2d", "int64"});
  const Tensor x = gpu(randn({1, 3, 5, 5})), w = gpu(randn({4, 3, 3, 3}));
  EXPECT_LOOM_ERROR(k::conv2d_backward(gpu(randn({1, 4, 2, 2})), x, w, o, {true, true, true}),
                    ShapeError, {"conv2d_backward", "[1, 4, 2, 2]"});
  EXPECT_LOOM_ERROR(k::conv2d_backward(randn({1, 4, 3, 3}), x, w, o, {true, true, true}),
                    DeviceError, {"conv2d_backward"});
  EXPECT_LOOM_ERROR(
      k::conv2d_backward(gpu(randn({1, 4, 3, 3}, kFloat64)), x, w, o, {true, true, true}),
      DTypeError, {"conv2d_backward", "float64"});
}

}  // namespace
}  // namespace loom::test
