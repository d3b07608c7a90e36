// tests/tensor/conv_test.cpp — conv2d against direct loops (forward and all three gradients) over
// strides, padding, dilation, groups and the batched / 1x1 paths of the kernel, on every
// instruction-set path this CPU runs (Note [CPU instruction sets]), gradcheck of the backward,
// and every argument error.

#include "tensor/conv.h"

#include <array>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/cpu_info.h"
#include "tensor/elementwise.h"
#include "test_util.h"

namespace loom {
namespace {

using test::dparam;
constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
using test::tensors_close;

struct Config {
  int64_t n, c, h, w, o, kh, kw;
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

struct Reference {
  Tensor out, dx, dweight, dbias;
};

// out[n,o,i,j] = b[o] + sum_{c,ki,kj} w[o,c,ki,kj] x[n, g Cg + c, i sh - ph + ki dh, j sw - pw + kj
// dw] and the three gradients of sum(out * dout), by the same loop.
Reference naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dout,
                     const Config& cf) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.to_vector<double>();
  const int64_t ho =
      (cf.h + 2 * cf.padding[0] - cf.dilation[0] * (cf.kh - 1) - 1) / cf.stride[0] + 1;
  const int64_t wo =
      (cf.w + 2 * cf.padding[1] - cf.dilation[1] * (cf.kw - 1) - 1) / cf.stride[1] + 1;
  const int64_t cg = cf.c / cf.groups, og = cf.o / cf.groups;
  std::vector<double> out(cf.n * cf.o * ho * wo), dx(xv.size()), dw(wv.size()), db(cf.o);
  const std::vector<double> dy =
      dout.defined() ? dout.to_vector<double>() : std::vector<double>(out.size(), 0.0);
  for (int64_t n = 0; n < cf.n; ++n)
    for (int64_t o = 0; o < cf.o; ++o)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          const int64_t oi = ((n * cf.o + o) * ho + i) * wo + j;
          double acc = bv[o];
          db[o] += dy[oi];
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ki = 0; ki < cf.kh; ++ki)
              for (int64_t kj = 0; kj < cf.kw; ++kj) {
                const int64_t ih = i * cf.stride[0] - cf.padding[0] + ki * cf.dilation[0];
                const int64_t iw = j * cf.stride[1] - cf.padding[1] + kj * cf.dilation[1];
                if (ih < 0 || ih >= cf.h || iw < 0 || iw >= cf.w) continue;
                const int64_t xi = ((n * cf.c + (o / og) * cg + c) * cf.h + ih) * cf.w + iw;
                const int64_t wi = ((o * cg + c) * cf.kh + ki) * cf.kw + kj;
                acc += wv[wi] * xv[xi];
                dx[xi] += wv[wi] * dy[oi];
                dw[wi] += xv[xi] * dy[oi];
              }
          out[oi] = acc;
        }
  return {tensor(out, {cf.n, cf.o, ho, wo}), tensor(dx, x.sizes()), tensor(dw, w.sizes()),
          tensor(db, {cf.o})};
}

// The kernel's paths depend on the algorithm, the instruction set, the thread count (parts of
// the batch) and the image size (chunks of samples): run each case on both algorithms, every
// instruction set this CPU has, 1 and 2 threads.
class Scope {
 public:
  Scope(kernels::Conv2dAlgorithm algorithm, CpuIsa isa, int threads)
      : threads_(get_num_threads()),
        algorithm_(kernels::get_conv2d_algorithm()),
        isa_(set_max_cpu_isa(isa)) {
    set_num_threads(threads);
    kernels::set_conv2d_algorithm(algorithm);
  }
  ~Scope() {
    set_num_threads(threads_);
    kernels::set_conv2d_algorithm(algorithm_);
    set_max_cpu_isa(isa_);
  }

 private:
  int threads_;
  kernels::Conv2dAlgorithm algorithm_;
  CpuIsa isa_;
};

// The instruction sets with kernels of their own that this CPU runs.
std::vector<CpuIsa> isas() {
  std::vector<CpuIsa> all;
  for (const CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (isa <= detected_cpu_isa()) all.push_back(isa);
  return all;
}

// The Winograd ones compute the float32 3x3 stride-1 layers below, and the direct one those with
// padding 1 whose rows are whole vectors (AVX2 or AVX-512); they leave the others to kAuto,
// which is tested too (its Winograd choices below, in TakesWinogradF4x4WhereItPays).
constexpr kernels::Conv2dAlgorithm kAlgorithms[] = {
    kernels::Conv2dAlgorithm::kAuto,         kernels::Conv2dAlgorithm::kIm2colGemm,
    kernels::Conv2dAlgorithm::kPacked,       kernels::Conv2dAlgorithm::kWinogradF2x2,
    kernels::Conv2dAlgorithm::kWinogradF4x4, kernels::Conv2dAlgorithm::kDirect};

void check_against_naive(const Config& cf, DType dtype) {
  const Tensor x = randn({cf.n, cf.c, cf.h, cf.w}, kFloat64);
  const Tensor w = randn({cf.o, cf.c / cf.groups, cf.kh, cf.kw}, kFloat64);
  const Tensor b = randn({cf.o}, kFloat64);
  const Reference probe = naive_conv(x, w, b, Tensor(), cf);  // for the output shape
  const Tensor dout = randn(probe.out.sizes(), kFloat64);
  const Reference ref = naive_conv(x, w, b, dout, cf);
  const double tol = dtype == kFloat32 ? 1e-4 : 1e-10;
  const kernels::Conv2dOptions options{cf.stride, cf.padding, cf.dilation, cf.groups};
  for (auto algorithm : kAlgorithms)
    for (const CpuIsa isa : isas())
      for (int threads : {1, 2}) {
        if (algorithm == kernels::Conv2dAlgorithm::kIm2colGemm && isa != CpuIsa::kGeneric &&
            isa != cpu_isa())
          continue;  // im2col's GEMM: one float32 path besides generic is enough
        Scope scope(algorithm, isa, threads);
        const std::string where = "algorithm " + std::to_string(static_cast<int>(algorithm)) +
                                  ", " + std::string(to_string(isa)) + ", threads " +
                                  std::to_string(threads);
        // NCHW; x and dout channels-last (Note [conv2d in channels-last]); the weight too.
        for (int formats = 0; formats < 3; ++formats) {
          const MemoryFormat x_format = formats > 0 ? kCL : MemoryFormat::kContiguous;
          const MemoryFormat w_format = formats > 1 ? kCL : MemoryFormat::kContiguous;
          const std::string in = where + ", formats " + std::to_string(formats);
          const Tensor xt = x.to(dtype).contiguous(x_format), wt = w.to(dtype).contiguous(w_format);
          const Tensor bt = b.to(dtype), dt = dout.to(dtype).contiguous(x_format);
          const Tensor out = conv2d(xt, wt, bt, cf.stride, cf.padding, cf.dilation, cf.groups);
          EXPECT_TRUE(tensors_close(out, ref.out, tol, tol)) << in;
          EXPECT_TRUE(has_memory_format(out, x_format)) << in;
          const kernels::Conv2dGrads g =
              kernels::conv2d_backward(dt, xt, wt, options, {true, true, true});
          EXPECT_TRUE(tensors_close(g.dx, ref.dx, tol, tol)) << "dx, " << in;
          EXPECT_TRUE(tensors_close(g.dweight, ref.dweight, tol, tol)) << "dweight, " << in;
          EXPECT_TRUE(tensors_close(g.dbias, ref.dbias, tol, tol)) << "dbias, " << in;
          EXPECT_TRUE(has_memory_format(g.dx, x_format)) << in;
          EXPECT_TRUE(has_memory_format(g.dweight, w_format)) << in;
          // Each gradient alone takes its own path (dx as a convolution, or by dcol).
          const kernels::Conv2dGrads dx_only =
              kernels::conv2d_backward(dt, xt, wt, options, {true, false, false});
          EXPECT_TRUE(tensors_close(dx_only.dx, ref.dx, tol, tol)) << "dx alone, " << in;
        }
      }
}

const std::vector<Config>& configs() {
  static const std::vector<Config> all = {
      {2, 3, 7, 6, 4, 3, 3},                             // plain 3x3
      {3, 3, 9, 8, 5, 3, 3, {2, 2}, {1, 1}},             // stride 2, padding
      {2, 2, 9, 10, 3, 3, 2, {1, 2}, {2, 1}, {2, 2}},    // dilation 2, asymmetric
      {2, 4, 6, 6, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2},  // groups 2
      {3, 4, 7, 7, 8, 3, 3, {2, 2}, {1, 1}, {1, 1}, 4},  // depthwise, multiplier 2
      {2, 5, 6, 5, 3, 1, 1},                             // 1x1 stride 1: no im2col
      {3, 6, 7, 7, 4, 1, 1, {2, 2}},                     // 1x1 stride 2
      {7, 3, 4, 4, 5, 3, 3, {1, 1}, {1, 1}},             // small images: chunked batch
      {9, 4, 3, 3, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2},  // chunked 1x1, groups
      {5, 2, 5, 5, 4, 5, 5, {3, 3}, {4, 4}, {1, 1}},     // padding wider than the input
      // 16+ channels per group: dx as a convolution of dout (Note [dx as a convolution])
      {3, 16, 6, 7, 8, 3, 3, {1, 1}, {1, 1}},              // 'same' padding
      {2, 32, 5, 6, 14, 3, 2, {1, 1}, {0, 1}, {1, 1}, 2},  // unpadded rows, groups
      {2, 16, 9, 8, 7, 3, 3, {1, 1}, {2, 1}, {2, 2}},      // dilated
      {2, 17, 5, 5, 3, 3, 3, {1, 1}, {3, 3}},              // padding > k-1: dcol + col2im
      {9, 20, 3, 2, 13, 2, 2, {1, 1}, {1, 1}},             // chunked, odd sizes
      {3, 24, 6, 6, 10, 1, 1},                             // 1x1
      // big enough (> 4 MFLOP) to be split over threads, with per-thread dweight sums
      {4, 16, 16, 16, 16, 3, 3, {1, 1}, {1, 1}},
      {8, 32, 8, 8, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2},  // chunked, groups
      {5, 24, 17, 17, 40, 3, 3, {2, 2}, {1, 1}},           // stride 2: dcol + col2im
      {1, 32, 20, 20, 32, 3, 3, {1, 1}, {1, 1}},           // one sample: threads in the GEMM
      // rows of whole vectors, or rows that divide one: the direct 3x3 kernels (Note [Direct 3x3
      // convolution], Note [Narrow rows])
      {3, 8, 5, 32, 16, 3, 3, {1, 1}, {1, 1}},
      {5, 24, 3, 16, 8, 3, 3, {1, 1}, {1, 1}},
      {3, 16, 8, 8, 8, 3, 3, {1, 1}, {1, 1}},  // AVX-512: vectors of two narrow rows
  };
  return all;
}

TEST(Conv2d, MatchesNaiveFloat64) {
  for (const Config& cf : configs()) check_against_naive(cf, kFloat64);
}

TEST(Conv2d, MatchesNaiveFloat32) {
  for (const Config& cf : configs()) check_against_naive(cf, kFloat32);
}

TEST(Conv2d, OutputShape) {
  const Tensor x = randn({2, 3, 32, 32});
  EXPECT_EQ(conv2d(x, randn({8, 3, 3, 3}), Tensor(), {2, 2}, {1, 1}).sizes(),
            (Shape{2, 8, 16, 16}));
  EXPECT_EQ(conv2d(x, randn({8, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {2, 2}).sizes(),
            (Shape{2, 8, 28, 28}));
  EXPECT_EQ(conv2d(x, randn({8, 3, 1, 1}), Tensor(), {2, 2}).sizes(), (Shape{2, 8, 16, 16}));
}

TEST(Conv2d, NonContiguousInput) {
  const Tensor base = randn({2, 3, 6, 5}, kFloat64);
  const Tensor x = base.transpose(2, 3);  // [2, 3, 5, 6], not contiguous
  const Tensor w = randn({4, 3, 3, 3}, kFloat64);
  EXPECT_TRUE(tensors_close(conv2d(x, w), conv2d(x.contiguous(), w), 1e-12, 1e-12));
}

TEST(Conv2d, GradcheckPlain) {
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], in[2], {2, 1}, {1, 1}, {1, 2});
      },
      {dparam({2, 2, 5, 5}), dparam({3, 2, 3, 2}), dparam({3})});
}

TEST(Conv2d, GradcheckGroups) {
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], in[2], {1, 1}, {1, 0}, {1, 1}, 2);
      },
      {dparam({2, 4, 4, 3}), dparam({4, 2, 2, 2}), dparam({4})});
}

TEST(Conv2d, GradcheckDepthwiseDilated) {
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], Tensor(), {1, 1}, {2, 2}, {2, 2}, 3);
      },
      {dparam({1, 3, 4, 4}), dparam({3, 1, 3, 3})});
}

TEST(Conv2d, GradcheckPointwiseChunked) {
  // 1x1 stride 1 on 2x2 images: the batch is chunked and there is no im2col.
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2]); },
                   {dparam({3, 3, 2, 2}), dparam({2, 3, 1, 1}), dparam({2})});
}

TEST(Conv2d, GradOnlyWhereNeeded) {
  const Tensor x = randn({2, 2, 4, 4}, kFloat64);  // does not require grad
  const Tensor w = dparam({3, 2, 3, 3});
  conv2d(x, w, Tensor(), {1, 1}, {1, 1}).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Conv2d, Errors) {
  const Tensor x = randn({2, 4, 5, 5}), w = randn({6, 4, 3, 3});
  EXPECT_LOOM_ERROR(conv2d(randn({4, 5, 5}), w), ShapeError, {"conv2d", "4-D", "[4, 5, 5]"});
  EXPECT_LOOM_ERROR(conv2d(x, randn({6, 4, 3})), ShapeError, {"conv2d", "[6, 4, 3]"});
  EXPECT_LOOM_ERROR(conv2d(x, randn({6, 3, 3, 3})), ShapeError,
                    {"conv2d", "[2, 4, 5, 5]", "[6, 3, 3, 3]"});
  EXPECT_LOOM_ERROR(conv2d(x, randn({6, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3), ValueError,
                    {"conv2d", "groups=3", "[2, 4, 5, 5]"});
  EXPECT_LOOM_ERROR(conv2d(x, randn({5, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2), ValueError,
                    {"conv2d", "groups=2", "[5, 2, 3, 3]"});
  EXPECT_LOOM_ERROR(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 1}, 0), ValueError,
                    {"conv2d", "groups"});
  EXPECT_LOOM_ERROR(conv2d(x, randn({6, 4, 7, 3})), ShapeError,
                    {"conv2d", "[2, 4, 5, 5]", "[6, 4, 7, 3]"});
  EXPECT_LOOM_ERROR(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {3, 3}), ShapeError,
                    {"conv2d", "[2, 4, 5, 5]", "[6, 4, 3, 3]"});
  EXPECT_LOOM_ERROR(conv2d(x, w, Tensor(), {0, 1}), ValueError, {"conv2d", "stride"});
  EXPECT_LOOM_ERROR(conv2d(x, w, Tensor(), {1, 1}, {-1, 0}), ValueError, {"conv2d", "padding"});
  EXPECT_LOOM_ERROR(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 0}), ValueError,
                    {"conv2d", "dilation"});
  EXPECT_LOOM_ERROR(conv2d(x, w, randn({5})), ShapeError, {"conv2d", "bias", "[5]"});
  EXPECT_LOOM_ERROR(conv2d(x, w, randn({6, 1})), ShapeError, {"conv2d", "[6, 1]"});
  EXPECT_LOOM_ERROR(conv2d(x, w.to(kFloat64)), DTypeError, {"conv2d", "float32", "float64"});
  EXPECT_LOOM_ERROR(conv2d(x, w, randn({6}, kFloat64)), DTypeError, {"conv2d", "float64"});
  EXPECT_LOOM_ERROR(conv2d(x.to(kInt64), w.to(kInt64)), DTypeError, {"conv2d"});
  EXPECT_LOOM_ERROR(kernels::conv2d_backward(randn({2, 6, 4, 4}), x, w, {}, {true, true, true}),
                    ShapeError, {"conv2d_backward", "[2, 6, 4, 4]"});
}

// kBenchmark (Note [Choosing convolutions by measurement]): each layer shape and pass is
// measured once, on every method that computes it, the fastest is kept, and its results agree
// with kAuto's.
TEST(Conv2dBenchmark, MeasuresEachLayerAndPassOnceAndKeepsTheFastest) {
  kernels::clear_conv2d_choices();
  const Tensor x = randn({4, 16, 12, 12}), w = randn({16, 16, 3, 3}), b = randn({16});
  const Tensor w2 = randn({8, 16, 3, 3});
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1}, down{{2, 2}, {1, 1}, {1, 1}, 1};
  const Tensor dout = randn({4, 16, 12, 12}), dout2 = randn({4, 8, 6, 6});
  Tensor y_auto, y2_auto;
  kernels::Conv2dGrads g_auto;
  {
    Scope scope(kernels::Conv2dAlgorithm::kAuto, cpu_isa(), 2);
    y_auto = kernels::conv2d(x, w, b, same);
    y2_auto = kernels::conv2d(x, w2, Tensor(), down);
    g_auto = kernels::conv2d_backward(dout, x, w, same, {true, true, true});
  }
  Scope scope(kernels::Conv2dAlgorithm::kBenchmark, cpu_isa(), 2);
  for (int call = 0; call < 2; ++call) {
    EXPECT_TRUE(tensors_close(kernels::conv2d(x, w, b, same), y_auto, 1e-4, 1e-4));
    EXPECT_TRUE(tensors_close(kernels::conv2d(x, w2, Tensor(), down), y2_auto, 1e-4, 1e-4));
    const kernels::Conv2dGrads g = kernels::conv2d_backward(dout, x, w, same, {true, true, true});
    EXPECT_TRUE(tensors_close(g.dx, g_auto.dx, 1e-4, 1e-4));
    EXPECT_TRUE(tensors_close(g.dweight, g_auto.dweight, 1e-4, 1e-4));
    EXPECT_TRUE(tensors_close(g.dbias, g_auto.dbias, 1e-4, 1e-4));
  }
  // Another pass of the same layer (dx only) is a layer of its own.
  kernels::conv2d_backward(dout, x, w, same, {true, false, false});

  const std::vector<kernels::Conv2dChoice> choices = kernels::conv2d_choices();
  ASSERT_EQ(choices.size(), 4u);
  const std::vector<std::string> all = {"packed", "im2col", "winograd F(2x2,3x3)",
                                        "winograd F(4x4,3x3)"};
  const std::vector<std::string> engines = {"packed", "im2col"};
  struct Expected {
    Shape weight;
    std::string pass;
    std::vector<std::string> candidates;
    int64_t calls;
  };
  const Expected expected[] = {{{16, 16, 3, 3}, "forward", all, 2},
                               {{8, 16, 3, 3}, "forward", engines, 2},
                               {{16, 16, 3, 3}, "backward dx dw db", all, 2},
                               {{16, 16, 3, 3}, "backward dx", all, 1}};
  for (size_t i = 0; i < choices.size(); ++i) {
    const kernels::Conv2dChoice& c = choices[i];
    SCOPED_TRACE("choice " + std::to_string(i));
    EXPECT_EQ(c.x, (Shape{4, 16, 12, 12}));
    EXPECT_EQ(c.weight, expected[i].weight);
    EXPECT_EQ(c.pass, expected[i].pass);
    EXPECT_EQ(c.threads, 2);
    EXPECT_FALSE(c.channels_last);
    EXPECT_EQ(c.calls, expected[i].calls);
    std::vector<std::string> names;
    double fastest = 1e30;
    std::string fastest_name;
    for (const auto& [name, seconds] : c.seconds) {
      names.push_back(name);
      EXPECT_GT(seconds, 0);
      if (seconds < fastest) fastest = seconds, fastest_name = name;
    }
    EXPECT_EQ(names, expected[i].candidates);
    EXPECT_EQ(c.chosen, fastest_name);
  }
  kernels::clear_conv2d_choices();
  EXPECT_TRUE(kernels::conv2d_choices().empty());
}

// Where the direct 3x3 kernels run a layer (AVX2 or AVX-512, rows of whole vectors), they race
// too.
TEST(Conv2dBenchmark, DirectKernelsRaceWhereTheyFit) {
  kernels::clear_conv2d_choices();
  const Tensor x = randn({4, 16, 6, 32}), w = randn({16, 16, 3, 3});
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1};
  Scope scope(kernels::Conv2dAlgorithm::kBenchmark, cpu_isa(), 2);
  kernels::conv2d(x, w, Tensor(), same);
  const std::vector<kernels::Conv2dChoice> choices = kernels::conv2d_choices();
  ASSERT_EQ(choices.size(), 1u);
  std::vector<std::string> names;
  for (const auto& [name, seconds] : choices[0].seconds) names.push_back(name);
  std::vector<std::string> expected = {"packed", "im2col", "winograd F(2x2,3x3)",
                                       "winograd F(4x4,3x3)"};
  if (cpu_isa() >= CpuIsa::kAvx2) expected.push_back("direct 3x3");
  EXPECT_EQ(names, expected);
  kernels::clear_conv2d_choices();
}

// A channels-last x races the channels-last engine against the NCHW ones through copies
// (Note [conv2d in channels-last]), and answers channels-last whichever wins.
TEST(Conv2dBenchmark, ChannelsLastRacesItsOwnEngineToo) {
  if (cpu_isa() == CpuIsa::kGeneric) GTEST_SKIP() << "no packed kernels: no channels-last engine";
  kernels::clear_conv2d_choices();
  const Tensor x = randn({4, 16, 12, 12}).contiguous(kCL), w = randn({16, 16, 3, 3});
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1};
  Tensor y_auto;
  {
    Scope scope(kernels::Conv2dAlgorithm::kAuto, cpu_isa(), 2);
    y_auto = kernels::conv2d(x, w, Tensor(), same);
  }
  Scope scope(kernels::Conv2dAlgorithm::kBenchmark, cpu_isa(), 2);
  const Tensor y = kernels::conv2d(x, w, Tensor(), same);
  EXPECT_TRUE(has_memory_format(y, kCL));
  EXPECT_TRUE(tensors_close(y, y_auto, 1e-4, 1e-4));
  const std::vector<kernels::Conv2dChoice> choices = kernels::conv2d_choices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_TRUE(choices[0].channels_last);
  std::vector<std::string> names;
  for (const auto& [name, seconds] : choices[0].seconds) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"packed", "im2col", "winograd F(2x2,3x3)",
                                             "winograd F(4x4,3x3)", "packed channels-last"}));
  kernels::clear_conv2d_choices();
}

// kAuto's Winograd F(4x4) (Note [Winograd in kAuto]): its results are Winograd's to the bit
// where both channel counts reach 128, or 64 where the direct kernels do not take the layer (on
// AVX2, or a channels-last x), and never below 64 channels or on an output smaller than one
// 4 x 4 tile. The transforms round differently from every other method, so equal bits say
// which one ran.
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

TEST(Conv2dAuto, TakesWinogradF4x4WhereItPays) {
  if (cpu_isa() == CpuIsa::kGeneric) GTEST_SKIP() << "no packed kernels";
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1};
  struct Case {
    int64_t n, c, hw, o;
    bool on_avx512, on_avx2, channels_last;  // Winograd expected
  };
  const Case cases[] = {
      {4, 128, 4, 128, true, true, true},      // one tile per image
      {2, 128, 8, 64, false, true, true},      // 64 output channels: the direct kernels' on AVX-512
      {2, 64, 8, 64, false, true, true},       //
      {2, 32, 8, 32, false, false, false},     // too few channels
      {2, 128, 3, 128, false, false, false}};  // a 3 x 3 output: less than one tile
  for (const Case& cs : cases)
    for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
      for (const bool channels_last : {false, true}) {
        if (isa > cpu_isa()) continue;
        const MemoryFormat format = channels_last ? kCL : MemoryFormat::kContiguous;
        // Weights scaled as a network's (1 / sqrt(fan-in)), so outputs are about 1.
        const Tensor x = randn({cs.n, cs.c, cs.hw, cs.hw}).contiguous(format);
        const Tensor w = kernels::mul_scalar(randn({cs.o, cs.c, 3, 3}), 1 / std::sqrt(9.0 * cs.c));
        const Tensor dy = randn({cs.n, cs.o, cs.hw, cs.hw}).contiguous(format);
        std::ostringstream where;
        where << "[" << cs.n << ", " << cs.c << ", " << cs.hw << ", " << cs.hw << "] -> " << cs.o
              << " channels, " << to_string(isa) << (channels_last ? ", channels-last" : "");
        auto run = [&](kernels::Conv2dAlgorithm algorithm) {
          Scope scope(algorithm, isa, 2);
          return std::pair{kernels::conv2d(x, w, Tensor(), same),
                           kernels::conv2d_backward(dy, x, w, same, {true, true, false})};
        };
        const auto [y, g] = run(kernels::Conv2dAlgorithm::kAuto);
        const auto [y_wino, g_wino] = run(kernels::Conv2dAlgorithm::kWinogradF4x4);
        const bool expected = channels_last            ? cs.channels_last
                              : isa == CpuIsa::kAvx512 ? cs.on_avx512
                                                       : cs.on_avx2;
        EXPECT_EQ(same_bits(y, y_wino), expected) << where.str();
        EXPECT_EQ(same_bits(g.dx, g_wino.dx), expected) << where.str();
        EXPECT_EQ(same_bits(g.dweight, g_wino.dweight), expected) << where.str();
        EXPECT_TRUE(tensors_close(y, y_wino, 1e-4, 1e-4)) << where.str();
        EXPECT_TRUE(has_memory_format(y, format)) << where.str();
      }
}

TEST(Conv2dBenchmark, AlgorithmNames) {
  const std::vector<kernels::Conv2dAlgorithm> all = {
      kernels::Conv2dAlgorithm::kAuto,         kernels::Conv2dAlgorithm::kIm2colGemm,
      kernels::Conv2dAlgorithm::kPacked,       kernels::Conv2dAlgorithm::kWinogradF2x2,
      kernels::Conv2dAlgorithm::kWinogradF4x4, kernels::Conv2dAlgorithm::kDirect,
      kernels::Conv2dAlgorithm::kBenchmark};
  const auto listed = kernels::conv2d_algorithms();
  EXPECT_EQ(std::vector<kernels::Conv2dAlgorithm>(listed.begin(), listed.end()), all);
  for (const auto algorithm : all)
    EXPECT_EQ(kernels::parse_conv2d_algorithm(kernels::to_string(algorithm)), algorithm);
  EXPECT_LOOM_ERROR(kernels::parse_conv2d_algorithm("fastest"), ValueError,
                    {"fastest", "auto, im2col, packed, winograd2, winograd4, direct, benchmark"});
}

}  // namespace
}  // namespace loom
