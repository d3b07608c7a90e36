// tests/tensor/conv_direct_test.cpp — the direct 3x3 kernels (tensor/cpu/conv_direct.h) against
// loops accumulated in double: forward, backward-data and backward-weight at stride 1 and 2 on
// rows of one to three vectors, tile and chunk remainders, uneven thread parts and every channel
// count they take; the shapes they refuse, and the errors.

#include "tensor/cpu/conv_direct.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tensor/cpu_info.h"
#include "tensor/parallel.h"
#include "test_util.h"

namespace loom::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Calls visit(x index, weight index, y index) for every multiply of the convolution, padding 1.
template <typename Visit>
void for_each_product(const DirectShape& s, Visit&& visit) {
  const int64_t ho = s.h / s.stride, wo = s.w / s.stride;
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t o = 0; o < s.o; ++o)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t r = 0; r < 3; ++r)
          for (int64_t q = 0; q < 3; ++q)
            for (int64_t i = 0; i < ho; ++i) {
              const int64_t ih = s.stride * i + r - 1;
              if (ih < 0 || ih >= s.h) continue;
              for (int64_t j = 0; j < wo; ++j) {
                const int64_t iw = s.stride * j + q - 1;
                if (iw < 0 || iw >= s.w) continue;
                visit(((n * s.c + c) * s.h + ih) * s.w + iw, (o * s.c + c) * 9 + r * 3 + q,
                      ((n * s.o + o) * ho + i) * wo + j);
              }
            }
}

std::vector<float> random_floats(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = normal(rng);
  return v;
}

// max |got - want| / max |want|
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    if (std::isnan(got[i])) err = std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

// The vector width of the direct tiles here: 16 floats on AVX-512, 8 on AVX2 (LOOM_CPU_ISA=avx2
// runs these tests on the AVX2 tiles).
int64_t lanes() {
  if (cpu_isa() >= CpuIsa::kAvx512) return 16;
  return cpu_isa() >= CpuIsa::kAvx2 ? 8 : 0;
}

class Threads {
 public:
  explicit Threads(int n) : saved_(get_num_threads()) { set_num_threads(n); }
  ~Threads() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Rows of one, two and three 16-float vectors (the forward's tiles take three vectors, so planes
// of 2, 10 and 9 vectors leave remainders of 2, 1 and none; with AVX2's 8-float vectors, 4, 20
// and 18 leave 1, 2 and none, and the 8-wide row runs there only); 8 to 128 channels either side;
// batches that two and three threads split unevenly, and whose weight-gradient chunks (1024
// pixels) hold several samples or one.
const DirectShape kShapes[] = {
    {.n = 3, .c = 8, .h = 5, .w = 32, .o = 16},
    {.n = 5, .c = 24, .h = 3, .w = 16, .o = 8},
    {.n = 2, .c = 16, .h = 2, .w = 48, .o = 8},
    {.n = 4, .c = 16, .h = 32, .w = 32, .o = 16},
    {.n = 2, .c = 64, .h = 1, .w = 16, .o = 8},
    {.n = 1, .c = 8, .h = 2, .w = 16, .o = 64},
    {.n = 3, .c = 16, .h = 3, .w = 8, .o = 24},
    // Narrow rows (AVX-512: Note [Narrow rows]): a vector spans 2, 4 or 8 rows, tiles span
    // samples, and the side taps read the shifted copies.
    {.n = 3, .c = 16, .h = 8, .w = 8, .o = 8},
    {.n = 5, .c = 8, .h = 4, .w = 4, .o = 16},
    {.n = 2, .c = 8, .h = 2, .w = 8, .o = 24},
    {.n = 3, .c = 8, .h = 8, .w = 2, .o = 8},
    // Stride 2 (Note [Stride 2 in phases]): output rows of one and two vectors, odd output
    // heights, and narrow output rows of 8, 4 and 2 pixels.
    {.n = 3, .c = 16, .h = 6, .w = 32, .o = 8, .stride = 2},
    {.n = 2, .c = 8, .h = 10, .w = 64, .o = 24, .stride = 2},
    {.n = 5, .c = 32, .h = 4, .w = 16, .o = 16, .stride = 2},
    {.n = 3, .c = 16, .h = 16, .w = 16, .o = 8, .stride = 2},
    {.n = 4, .c = 8, .h = 8, .w = 8, .o = 16, .stride = 2},
    {.n = 2, .c = 8, .h = 16, .w = 4, .o = 8, .stride = 2},
};

// Whether the tiles here cover the shape: output rows of whole vectors, or with AVX-512 rows that
// divide a vector and planes of whole vectors.
bool covered(const DirectShape& s) {
  const int64_t ho = s.h / s.stride, wo = s.w / s.stride;
  if (wo % lanes() == 0) return true;
  return lanes() == 16 && 16 % wo == 0 && ho * wo % 16 == 0;
}

TEST(DirectConv3x3, AllThreePassesMatchDoubleLoops) {
  if (lanes() == 0) GTEST_SKIP() << "the direct kernels need AVX2 or AVX-512";
  std::mt19937 rng(7);
  for (const DirectShape& s : kShapes) {
    ASSERT_EQ(direct_conv3x3_fits(s), covered(s)) << s;
    if (!covered(s)) continue;
    const int64_t xs = s.n * s.c * s.h * s.w, ws = s.o * s.c * 9;
    const int64_t ys = s.n * s.o * (s.h / s.stride) * (s.w / s.stride);
    const std::vector<float> x = random_floats(xs, rng), w = random_floats(ws, rng),
                             dy = random_floats(ys, rng);
    std::vector<double> y_ref(ys), dx_ref(xs), dw_ref(ws);
    for_each_product(s, [&](int64_t xi, int64_t wi, int64_t yi) {
      y_ref[yi] += static_cast<double>(x[xi]) * w[wi];
      dx_ref[xi] += static_cast<double>(dy[yi]) * w[wi];
      dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
    });
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << s << ", threads " << threads);
      Threads scope(threads);
      std::vector<float> y(ys, kNaN), dx(xs, kNaN), dw(ws, kNaN);  // every element is written
      direct_conv3x3(s, x.data(), w.data(), y.data());
      direct_conv3x3_backward_data(s, dy.data(), w.data(), dx.data());
      direct_conv3x3_backward_weight(s, x.data(), dy.data(), dw.data());
      // float32 sums of 9 C (forward), 9 O (dx) and N H W (dweight) products.
      EXPECT_LT(relative_error(y, y_ref), 2e-6);
      EXPECT_LT(relative_error(dx, dx_ref), 2e-6);
      EXPECT_LT(relative_error(dw, dw_ref), 4e-6);
    }
  }
}

TEST(DirectConv3x3, RefusesShapesItsTilesDoNotCover) {
  const DirectShape ok{.n = 2, .c = 16, .h = 4, .w = 32, .o = 16};
  EXPECT_EQ(direct_conv3x3_fits(ok), lanes() > 0);
  if (lanes() == 0) GTEST_SKIP() << "no direct tiles on this path";
  auto with = [&](auto change) {
    DirectShape s = ok;
    change(s);
    return direct_conv3x3_fits(s);
  };
  EXPECT_FALSE(with([](DirectShape& s) { s.w = lanes() + 4; }));  // a row is not whole vectors
  EXPECT_TRUE(with([](DirectShape& s) { s.w = 2 * lanes(); }));
  // Narrow rows: on AVX-512 where they divide a vector and the plane is whole vectors.
  EXPECT_TRUE(with([](DirectShape& s) { s.w = 8; }));  // narrow on AVX-512, whole on AVX2
  EXPECT_EQ(with([](DirectShape& s) { s.w = 4; }), lanes() == 16);
  EXPECT_FALSE(with([](DirectShape& s) { s.w = 6; }));            // 16 % 6 != 0
  EXPECT_FALSE(with([](DirectShape& s) { s.w = 4, s.h = 3; }));   // 12 pixels
  EXPECT_FALSE(with([](DirectShape& s) { s.w = 1, s.h = 16; }));  // no side columns at all
  EXPECT_FALSE(with([](DirectShape& s) { s.c = 12; }));           // channels not multiples of 8
  EXPECT_FALSE(with([](DirectShape& s) { s.o = 4; }));            //
  EXPECT_FALSE(with([](DirectShape& s) { s.c = 136; }));          // above kDirectMaxChannels
  EXPECT_FALSE(with([](DirectShape& s) { s.o = 256; }));
  EXPECT_TRUE(with([](DirectShape& s) { s.c = 128, s.o = 128; }));
  EXPECT_FALSE(with([](DirectShape& s) { s.n = 0; }));
  // Stride 2: even sides, and the output's rows as above (32 / 2 = 16 pixels).
  EXPECT_TRUE(with([](DirectShape& s) { s.stride = 2; }));
  EXPECT_TRUE(with([](DirectShape& s) { s.stride = 2, s.w = 4 * lanes(); }));
  EXPECT_FALSE(with([](DirectShape& s) { s.stride = 2, s.h = 5; }));
  EXPECT_FALSE(with([](DirectShape& s) { s.stride = 2, s.w = 2 * lanes() + 2; }));
  EXPECT_FALSE(with([](DirectShape& s) { s.stride = 3; }));
  const CpuIsa saved = set_max_cpu_isa(CpuIsa::kAvx2);  // LOOM_CPU_ISA=avx2: 8-float rows
  EXPECT_TRUE(with([](DirectShape& s) { s.w = 24; }));
  EXPECT_FALSE(with([](DirectShape& s) { s.w = 4; }));  // narrow rows: AVX-512 only
  set_max_cpu_isa(CpuIsa::kGeneric);                    // no tiles at all
  EXPECT_FALSE(direct_conv3x3_fits(ok));
  set_max_cpu_isa(saved);
}

TEST(DirectConv3x3, PaysWhereItFitsOnAvx512) {
  const bool avx512 = lanes() == 16;
  EXPECT_EQ(direct_conv3x3_pays({.n = 2, .c = 64, .h = 4, .w = 32, .o = 64}), avx512);
  EXPECT_EQ(direct_conv3x3_pays({.n = 2, .c = 128, .h = 4, .w = 4, .o = 128}), avx512);
  EXPECT_FALSE(direct_conv3x3_pays({.n = 2, .c = 64, .h = 4, .w = 20, .o = 64}));  // no fit
  // Stride 2: both passes on wide output rows of few channels; on narrow rows the forward only.
  const DirectShape wide{.n = 2, .c = 16, .h = 32, .w = 32, .o = 32, .stride = 2};
  EXPECT_EQ(direct_conv3x3_pays(wide), avx512);
  EXPECT_EQ(direct_conv3x3_pays(wide, /*backward=*/true), avx512);
  const DirectShape wider{.n = 2, .c = 64, .h = 32, .w = 32, .o = 128, .stride = 2};
  EXPECT_FALSE(direct_conv3x3_pays(wider));
  const DirectShape narrow{.n = 2, .c = 32, .h = 16, .w = 16, .o = 64, .stride = 2};
  EXPECT_EQ(direct_conv3x3_pays(narrow), avx512);
  EXPECT_FALSE(direct_conv3x3_pays(narrow, /*backward=*/true));
  const CpuIsa saved = set_max_cpu_isa(CpuIsa::kAvx2);  // fits, but only ties there
  EXPECT_FALSE(direct_conv3x3_pays({.n = 2, .c = 64, .h = 4, .w = 32, .o = 64}));
  EXPECT_FALSE(direct_conv3x3_pays(wide));
  set_max_cpu_isa(saved);
}

TEST(DirectConv3x3, TheWeightGradientPaysOnWideRowsOfFewChannels) {
  if (lanes() == 0) GTEST_SKIP() << "no direct tiles on this path";
  EXPECT_TRUE(direct_weight_grad_pays({.n = 2, .c = 32, .h = 4, .w = 32, .o = 32}));
  EXPECT_FALSE(direct_weight_grad_pays({.n = 2, .c = 64, .h = 4, .w = 32, .o = 32}));
  EXPECT_EQ(direct_weight_grad_pays({.n = 2, .c = 16, .h = 8, .w = 8, .o = 16}), lanes() == 8);
  // At stride 2 the output's rows count: 16 pixels from 32.
  EXPECT_TRUE(direct_weight_grad_pays({.n = 2, .c = 16, .h = 32, .w = 32, .o = 32, .stride = 2}));
  EXPECT_EQ(direct_weight_grad_pays({.n = 2, .c = 16, .h = 16, .w = 16, .o = 32, .stride = 2}),
            lanes() == 8);
}

TEST(DirectConv3x3, ErrorsNameTheFunctionAndTheShape) {
  const DirectShape bad{.n = 2, .c = 16, .h = 4, .w = 20, .o = 16};  // 20: no vector width
  std::vector<float> buffer(2 * 16 * 4 * 20 + 16 * 16 * 9);
  float* p = buffer.data();
  EXPECT_LOOM_ERROR(direct_conv3x3(bad, p, p, p), ValueError,
                    {"direct_conv3x3:", "x=[2, 16, 4, 20] weight=[16, 16, 3, 3]", "W a multiple"});
  EXPECT_LOOM_ERROR(direct_conv3x3_backward_data(bad, p, p, p), ValueError,
                    {"direct_conv3x3_backward_data:", "x=[2, 16, 4, 20]"});
  EXPECT_LOOM_ERROR(direct_conv3x3_backward_weight(bad, p, p, p), ValueError,
                    {"direct_conv3x3_backward_weight:", "x=[2, 16, 4, 20]"});
  const DirectShape odd{.n = 2, .c = 16, .h = 5, .w = 32, .o = 16, .stride = 2};
  EXPECT_LOOM_ERROR(direct_conv3x3(odd, p, p, p), ValueError,
                    {"direct_conv3x3:", "x=[2, 16, 5, 32] weight=[16, 16, 3, 3] stride 2", "even"});
}

}  // namespace
}  // namespace loom::cpu
