// tests/tensor/conv_bf16_test.cpp — Note [bf16 convolutions]: conv2d and its three gradients of
// bfloat16 tensors on the bfloat16 products (AMX tiles and vdpbf16ps, each where the CPU has
// it), against float64 within the bound of a float32 evaluation rounded once to bfloat16, on
// strides, paddings, dilations, 1x1 and 5x5 kernels, several chunks of images, channels-last
// operands and an empty batch; and when the path is taken. Skips where the CPU has no bfloat16
// products, saying so.

#include "tensor/cpu/conv_bf16.h"

#include <cmath>
#include <string>
#include <vector>

#include "tensor/conv.h"
#include "tensor/cpu/linalg.h"
#include "tensor/cpu_info.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr double kU32 = 0x1p-24, kU16 = 0x1p-8;

// Caps cpu_isa(), sets the bfloat16 product policy and the threads for one scope.
class Scope {
 public:
  Scope(CpuIsa isa, cpu::Bf16DotPolicy policy, int threads)
      : isa_(set_max_cpu_isa(isa)),
        policy_(cpu::set_bf16_dot_policy(policy)),
        threads_(get_num_threads()) {
    set_num_threads(threads);
  }
  ~Scope() {
    set_num_threads(threads_);
    cpu::set_bf16_dot_policy(policy_);
    set_max_cpu_isa(isa_);
  }

 private:
  CpuIsa isa_;
  cpu::Bf16DotPolicy policy_;
  int threads_;
};

std::vector<CpuIsa> kernel_isas() {
  std::vector<CpuIsa> isas;
  for (const CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAmxBf16})
    if (isa <= detected_cpu_isa()) isas.push_back(isa);
  return isas;
}

#define SKIP_WITHOUT_BF16()                                                                  \
  if (detected_cpu_isa() < CpuIsa::kAvx512Bf16)                                              \
  GTEST_SKIP() << "this CPU has " << cpu_vector_isa() << ", no bfloat16 products: bfloat16 " \
               << "convolutions take the widened path here (conv_test covers it)"

// Every element of got within the bound of a float32 sum of `terms` products, rounded once to
// bfloat16, of want (float64) whose products' magnitudes sum to magnitude.
::testing::AssertionResult within_bound(const Tensor& got, const Tensor& want,
                                        const Tensor& magnitude, double terms) {
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>(),
                            m = magnitude.to_vector<double>();
  if (g.size() != w.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < g.size(); ++i) {
    const double f = (terms + 2) * kU32 * m[i];
    const double bound = f + kU16 * (std::fabs(w[i]) + f);
    if (!(std::fabs(g[i] - w[i]) <= bound))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << g[i] << " vs " << w[i] << ", bound " << bound;
  }
  return ::testing::AssertionSuccess();
}

struct Config {
  int64_t n, c, h, w, o, kh, kw;
  kernels::Conv2dOptions options;
  std::string name;
};

const std::vector<Config> kConfigs = {
    {2, 3, 7, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "3x3 'same'"},
    {3, 5, 9, 8, 6, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, "stride 2"},
    {2, 4, 9, 10, 3, 3, 2, {{1, 2}, {2, 1}, {2, 2}, 1}, "dilation 2, asymmetric"},
    {2, 6, 5, 5, 7, 1, 1, {}, "1x1"},
    {2, 4, 8, 8, 5, 5, 5, {{1, 1}, {2, 2}, {1, 1}, 1}, "5x5"},
    {18, 3, 32, 32, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "chunks of 16 images"},
    {2, 40, 6, 6, 33, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "K and O past a tile"},
    // 16+ input channels at stride 1: dx as a convolution of dy (Note [bf16 convolutions])
    {2, 16, 7, 6, 5, 3, 2, {{1, 1}, {2, 1}, {2, 2}, 1}, "dx by convolution, dilated"},
    {2, 16, 5, 5, 7, 1, 1, {}, "dx by convolution, 1x1"},
    {2, 17, 8, 8, 6, 5, 5, {{1, 1}, {1, 2}, {1, 1}, 1}, "dx by convolution, 5x5"},
    {2, 16, 5, 5, 3, 3, 3, {{1, 1}, {3, 3}, {1, 1}, 1}, "16 channels, padding past the kernel"},
    {3, 2, 3, 3, 3, 3, 3, {{1, 1}, {0, 0}, {1, 1}, 1}, "1x1 output"},
    {2, 3, 3, 4, 2, 3, 3, {{1, 1}, {3, 3}, {1, 1}, 1}, "taps wholly in the padding"},
    // 'same' at stride 1: im2col copies shifted planes; the corner taps of a 5 x 5 kernel on a
    // 2 x 3 image read only padding
    {2, 3, 2, 3, 4, 5, 5, {{1, 1}, {2, 2}, {1, 1}, 1}, "'same', taps wholly in the padding"},
};

// Outputs of at most 256 pixels with the batch near a multiple of 32 images: the forward and the
// weight gradient take the batch into the vector lanes where the CPU has vdpbf16ps (Note [bf16
// batch lanes]), and so does dx, as a convolution or at a stride. Odd channels leave half a
// pair, O past a tile of 12 the 4- and 8-row edge kernels and a 1-row tail, 60 images a second
// group of 28, an odd batch the weight gradient's last pair of images half empty, and 8 x 9 at
// stride 2 phases of unequal width.
const std::vector<Config> kLaneConfigs = {
    {32, 6, 4, 4, 5, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: 4 x 4, O = 5"},
    {60, 7, 4, 4, 13, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: two groups, odd C, O = 13"},
    {63, 16, 4, 4, 12, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: an odd batch, O = 12"},
    {32, 17, 8, 8, 20, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: 8 x 8, dx as a convolution"},
    {32, 16, 7, 7, 24, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: 7 x 7, O = 24"},
    {32, 4, 6, 6, 5, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}, "lanes: dilation 2"},
    {32, 16, 5, 6, 9, 3, 2, {{1, 1}, {1, 0}, {1, 1}, 1}, "lanes: 3 x 2 kernel, not 'same'"},
    {32, 3, 4, 4, 4, 3, 3, {{1, 1}, {3, 3}, {1, 1}, 1}, "lanes: taps wholly in the padding"},
    {32, 6, 8, 9, 5, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, "lanes: stride 2"},
    {32, 8, 12, 12, 7, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "lanes: 144 pixels, blocks of 64"},
};

// "Same" layers at stride 1 whose rows are whole panels of 32 pixels read their B panels where
// they lie in the paired image (Note [bf16 row panels]); so does dx as a convolution where O is
// 16 or more. Several panels a row, odd C, O past a tile, kernels of other shapes.
const std::vector<Config> kRowConfigs = {
    {2, 16, 5, 32, 12, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "rows: 32 wide, O = 12"},
    {3, 17, 4, 64, 13, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "rows: two panels a row, odd C"},
    {2, 16, 6, 32, 7, 3, 5, {{1, 1}, {1, 2}, {1, 1}, 1}, "rows: 3 x 5"},
    {1, 24, 3, 32, 25, 3, 1, {{1, 1}, {1, 0}, {1, 1}, 1}, "rows: 3 x 1 kernel"},
    {2, 16, 4, 32, 20, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, "rows: dx as a convolution too"},
};

// The forward and the three gradients of one config on the path in scope, against float64.
void check(const Config& cf, MemoryFormat format) {
  manual_seed(cf.n * 131 + cf.c * 17 + cf.o);
  const Tensor x = randn({cf.n, cf.c, cf.h, cf.w}).to(kBFloat16).contiguous(format);
  const Tensor w = randn({cf.o, cf.c, cf.kh, cf.kw}).to(kBFloat16);
  const Tensor b = randn({cf.o}).to(kBFloat16);
  ASSERT_TRUE(cpu::conv2d_bf16_fits(x, cf.options));
  const Tensor y = kernels::conv2d(x, w, b, cf.options);
  EXPECT_EQ(y.dtype(), kBFloat16);
  EXPECT_TRUE(has_memory_format(y, format));
  const Tensor x64 = x.to(kFloat64), w64 = w.to(kFloat64), b64 = b.to(kFloat64);
  const double taps = static_cast<double>(cf.c * cf.kh * cf.kw);
  EXPECT_TRUE(within_bound(y, kernels::conv2d(x64, w64, b64, cf.options),
                           kernels::conv2d(x64.abs(), w64.abs(), b64.abs(), cf.options), taps + 1))
      << "forward";

  const Tensor dy = randn(y.sizes()).to(kBFloat16).contiguous(format);
  const kernels::Conv2dGrads g = kernels::conv2d_backward(dy, x, w, cf.options, {true, true, true});
  const Tensor dy64 = dy.to(kFloat64);
  const kernels::Conv2dGrads want =
      kernels::conv2d_backward(dy64, x64, w64, cf.options, {true, true, true});
  const kernels::Conv2dGrads magnitude =
      kernels::conv2d_backward(dy64.abs(), x64.abs(), w64.abs(), cf.options, {true, true, true});
  const double pixels = static_cast<double>(cf.n * y.size(2) * y.size(3));
  EXPECT_TRUE(within_bound(g.dx, want.dx, magnitude.dx, static_cast<double>(cf.o) * cf.kh * cf.kw))
      << "dx";
  EXPECT_TRUE(within_bound(g.dweight, want.dweight, magnitude.dweight, pixels)) << "dweight";
  EXPECT_TRUE(within_bound(g.dbias, want.dbias, magnitude.dbias, pixels)) << "dbias";
  EXPECT_TRUE(has_memory_format(g.dx, format));
  for (const Tensor* t : {&g.dx, &g.dweight, &g.dbias}) EXPECT_EQ(t->dtype(), kBFloat16);
  // One gradient alone.
  const kernels::Conv2dGrads dx_only =
      kernels::conv2d_backward(dy, x, w, cf.options, {true, false, false});
  EXPECT_FALSE(dx_only.dweight.defined());
  EXPECT_TRUE(
      within_bound(dx_only.dx, want.dx, magnitude.dx, static_cast<double>(cf.o) * cf.kh * cf.kw))
      << "dx alone";
}

TEST(Conv2dBf16, EachKernelIsWithinABfloat16RoundingOfFloat64) {
  SKIP_WITHOUT_BF16();
  for (const CpuIsa isa : kernel_isas())
    for (const int threads : {1, 2}) {
      Scope scope(isa, cpu::Bf16DotPolicy::kOn, threads);
      for (const Config& cf : kConfigs)
        for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
          SCOPED_TRACE(cf.name + ", " + std::string(to_string(isa)) + ", " +
                       std::to_string(threads) + " threads" +
                       (format == MemoryFormat::kChannelsLast ? ", channels-last" : ""));
          check(cf, format);
        }
    }
}

// check() on each config, on the vdpbf16ps kernel with 1 and 2 threads and in both memory
// formats, once taken(x, weight, options) has said that the config runs the path under test.
template <typename Taken>
void check_on_path(const std::vector<Config>& configs, Taken taken) {
  for (const int threads : {1, 2}) {
    Scope scope(CpuIsa::kAvx512Bf16, cpu::Bf16DotPolicy::kOn, threads);
    for (const Config& cf : configs)
      for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
        SCOPED_TRACE(cf.name + ", " + std::to_string(threads) + " threads" +
                     (format == MemoryFormat::kChannelsLast ? ", channels-last" : ""));
        const Tensor x = zeros({cf.n, cf.c, cf.h, cf.w}).to(kBFloat16);
        const Tensor w = zeros({cf.o, cf.c, cf.kh, cf.kw}).to(kBFloat16);
        ASSERT_TRUE(taken(x, w, cf.options));
        check(cf, format);
      }
  }
}

TEST(Conv2dBf16, TheBatchInTheLanesIsWithinABfloat16RoundingOfFloat64) {
  SKIP_WITHOUT_BF16();
  check_on_path(kLaneConfigs, cpu::conv2d_bf16_batch_lanes);
}

TEST(Conv2dBf16, RowPanelsAreWithinABfloat16RoundingOfFloat64) {
  SKIP_WITHOUT_BF16();
  check_on_path(kRowConfigs, cpu::conv2d_bf16_row_panels);
  // Not taken: a width that is not a multiple of 32, fewer than 16 channels, a stride, more than
  // 16 taps, and the small images the lanes take.
  const Tensor w = zeros({8, 16, 3, 3}).to(kBFloat16);
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1};
  EXPECT_FALSE(cpu::conv2d_bf16_row_panels(zeros({2, 16, 4, 48}).to(kBFloat16), w, same));
  EXPECT_FALSE(cpu::conv2d_bf16_row_panels(zeros({2, 8, 4, 32}).to(kBFloat16),
                                           zeros({8, 8, 3, 3}).to(kBFloat16), same));
  EXPECT_FALSE(cpu::conv2d_bf16_row_panels(zeros({2, 16, 4, 32}).to(kBFloat16), w,
                                           {{2, 2}, {1, 1}, {1, 1}, 1}));
  EXPECT_FALSE(cpu::conv2d_bf16_row_panels(zeros({2, 16, 4, 32}).to(kBFloat16),
                                           zeros({8, 16, 5, 5}).to(kBFloat16),
                                           {{1, 1}, {2, 2}, {1, 1}, 1}));
  EXPECT_FALSE(cpu::conv2d_bf16_row_panels(zeros({64, 16, 4, 32}).to(kBFloat16), w, same));
  EXPECT_TRUE(cpu::conv2d_bf16_row_panels(zeros({64, 16, 32, 32}).to(kBFloat16), w, same));
}

// Lanes left empty cost what the skipped taps save: a batch far from a multiple of 32, images of
// more than 256 output pixels and kernels of more than 16 taps keep the patch panels (or col);
// strided layers take the lanes too where every input pixel is read.
TEST(Conv2dBf16, TheBatchGoesInTheLanesWhereItPays) {
  SKIP_WITHOUT_BF16();
  Scope scope(CpuIsa::kAvx512Bf16, cpu::Bf16DotPolicy::kOn, 2);
  const kernels::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1}, two{{2, 2}, {1, 1}, {1, 1}, 1};
  auto lanes = [](int64_t n, int64_t hw, int64_t k, const kernels::Conv2dOptions& options) {
    return cpu::conv2d_bf16_batch_lanes(zeros({n, 8, hw, hw}).to(kBFloat16),
                                        zeros({8, 8, k, k}).to(kBFloat16), options);
  };
  EXPECT_TRUE(lanes(64, 4, 3, same));
  EXPECT_TRUE(lanes(64, 8, 3, same));
  EXPECT_TRUE(lanes(64, 16, 3, same));
  EXPECT_FALSE(lanes(64, 32, 3, same));  // 1024 pixels
  EXPECT_TRUE(lanes(30, 4, 3, same));    // 30 of 32 lanes: 0.69 of the taps over 0.94
  EXPECT_FALSE(lanes(40, 4, 3, same));   // 40 of 64 lanes
  EXPECT_TRUE(lanes(64, 8, 3, two));     // instead of im2col
  EXPECT_TRUE(lanes(64, 32, 3, two));
  EXPECT_FALSE(lanes(64, 64, 3, two));
  EXPECT_FALSE(lanes(64, 8, 1, {{2, 2}, {0, 0}, {1, 1}, 1}));  // 3 of 4 pixels read by none
  EXPECT_FALSE(lanes(64, 8, 5, {{1, 1}, {2, 2}, {1, 1}, 1}));
  EXPECT_FALSE(lanes(64, 8, 1, {}));  // a 1x1 kernel reads no padding
  Scope capped(CpuIsa::kAvx512, cpu::Bf16DotPolicy::kOn, 2);
  EXPECT_FALSE(lanes(64, 4, 3, same));
}

TEST(Conv2dBf16, AnEmptyBatchGivesZeroGradients) {
  SKIP_WITHOUT_BF16();
  Scope scope(detected_cpu_isa(), cpu::Bf16DotPolicy::kOn, 2);
  const kernels::Conv2dOptions options{{1, 1}, {1, 1}, {1, 1}, 1};
  const Tensor x = zeros({0, 3, 5, 5}).to(kBFloat16), w = randn({4, 3, 3, 3}).to(kBFloat16);
  EXPECT_EQ(kernels::conv2d(x, w, Tensor(), options).sizes(), (Shape{0, 4, 5, 5}));
  const kernels::Conv2dGrads g = kernels::conv2d_backward(zeros({0, 4, 5, 5}).to(kBFloat16), x, w,
                                                          options, {true, true, true});
  EXPECT_EQ(g.dx.sizes(), x.sizes());
  for (const double v : g.dweight.to_vector<double>()) EXPECT_EQ(v, 0.0);
  for (const double v : g.dbias.to_vector<double>()) EXPECT_EQ(v, 0.0);
}

// The path is taken for bfloat16 with one group where the products are in use; float16, groups,
// LOOM_BF16_DOT=off and a CPU path without bfloat16 products keep the widened one, bit for bit.
TEST(Conv2dBf16, ThePathIsTakenWhereItFits) {
  const kernels::Conv2dOptions one{{1, 1}, {1, 1}, {1, 1}, 1}, two{{1, 1}, {1, 1}, {1, 1}, 2};
  manual_seed(9);
  const Tensor x = randn({2, 4, 6, 6}).to(kBFloat16), w = randn({6, 4, 3, 3}).to(kBFloat16);
  EXPECT_FALSE(cpu::conv2d_bf16_fits(x.to(kFloat16), one));
  EXPECT_FALSE(cpu::conv2d_bf16_fits(x.to(kFloat32), one));
  {
    Scope capped(CpuIsa::kAvx512, cpu::Bf16DotPolicy::kOn, 2);
    EXPECT_FALSE(cpu::conv2d_bf16_fits(x, one));
  }
  if (detected_cpu_isa() < CpuIsa::kAvx512Bf16) return;
  Scope scope(detected_cpu_isa(), cpu::Bf16DotPolicy::kOn, 2);
  EXPECT_TRUE(cpu::conv2d_bf16_fits(x, one));
  EXPECT_FALSE(cpu::conv2d_bf16_fits(x, two));
  Tensor widened;
  {
    Scope off(detected_cpu_isa(), cpu::Bf16DotPolicy::kOff, 2);
    EXPECT_FALSE(cpu::conv2d_bf16_fits(x, one));
    widened = kernels::conv2d(x, w, Tensor(), one);
  }
  const Tensor want = kernels::conv2d(x.to(kFloat32), w.to(kFloat32), Tensor(), one).to(kBFloat16);
  EXPECT_EQ(widened.to_vector<double>(), want.to_vector<double>());
}

}  // namespace
}  // namespace loom
