// tests/tensor/winograd_test.cpp — Winograd convolution (tensor/cpu/winograd.h) against direct
// loops accumulated in double: forward, backward-data and backward-weight for both tiles, on odd
// sizes, every padding, k != c and partial blocks, in NCHW and channels-last; the errors on bad
// shapes; and the accuracy
// table on the ResNet-18 layer shapes, beside loom's GEMM conv2d in float32.

#include "tensor/cpu/winograd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tensor/conv.h"
#include "tensor/parallel.h"
#include "test_util.h"

namespace loom::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Bounds on max |result - reference| / max |reference|, per tile. The worst measured over 8
// seeds of every shape below (kCases and the accuracy table, N(0,1) data, any pass): 8.4e-7 for
// F2x2 and 3.8e-6 for F4x4 (loom's float32 conv2d: 6.2e-7 on the table's shapes). The bounds
// sit about 3.6x and 4x above. (The textbook F(4x4) matrices, points 0, ±1, ±2, measured
// 1.1e-5: Note [Winograd transforms].)
double bound(WinogradTile tile) { return tile == WinogradTile::kF2x2 ? 3e-6 : 1.5e-5; }

const char* name(WinogradTile tile) { return tile == WinogradTile::kF2x2 ? "F2x2" : "F4x4"; }

constexpr WinogradTile kTiles[] = {WinogradTile::kF2x2, WinogradTile::kF4x4};

// ------------------------------------------------------------------ references (double)

int64_t x_size(const WinogradShape& s) { return s.n * s.c * s.h * s.w; }
int64_t y_size(const WinogradShape& s) { return s.n * s.k * s.ho() * s.wo(); }
int64_t weight_size(const WinogradShape& s) { return s.k * s.c * 9; }

// Calls visit(x index, weight index, y index) for every multiply of the direct convolution:
// y[n,k,i,j] += x[n,c,i+r-pad_h,j+s-pad_w] w[k,c,r,s], skipping the padding.
template <typename Visit>
void for_each_product(const WinogradShape& s, Visit&& visit) {
  const int64_t ho = s.ho(), wo = s.wo();
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t r = 0; r < 3; ++r)
          for (int64_t q = 0; q < 3; ++q)
            for (int64_t i = 0; i < ho; ++i) {
              const int64_t ih = i + r - s.pad_h;
              if (ih < 0 || ih >= s.h) continue;
              for (int64_t j = 0; j < wo; ++j) {
                const int64_t iw = j + q - s.pad_w;
                if (iw < 0 || iw >= s.w) continue;
                visit(((n * s.c + c) * s.h + ih) * s.w + iw, (k * s.c + c) * 9 + r * 3 + q,
                      ((n * s.k + k) * ho + i) * wo + j);
              }
            }
}

std::vector<double> reference_forward(const WinogradShape& s, const std::vector<float>& x,
                                      const std::vector<float>& w) {
  std::vector<double> y(y_size(s), 0.0);
  for_each_product(s, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += double(x[xi]) * w[wi]; });
  return y;
}

std::vector<double> reference_backward_data(const WinogradShape& s, const std::vector<float>& dy,
                                            const std::vector<float>& w) {
  std::vector<double> dx(x_size(s), 0.0);
  for_each_product(s,
                   [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += double(dy[yi]) * w[wi]; });
  return dx;
}

std::vector<double> reference_backward_weight(const WinogradShape& s, const std::vector<float>& x,
                                              const std::vector<float>& dy) {
  std::vector<double> dw(weight_size(s), 0.0);
  for_each_product(s,
                   [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += double(dy[yi]) * x[xi]; });
  return dw;
}

// max |a - b| / max |b|; infinity if a holds a NaN (an element the kernel never wrote).
template <typename T>
double relative_error(const std::vector<T>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0 ? err / scale : err;
}

std::vector<float> random_vector(int64_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(size);
  for (float& e : v) e = normal(rng);
  return v;
}

// The three passes of one shape and tile, against the references; outputs start as NaN, so an
// element left unwritten fails.
struct Errors {
  double forward, backward_data, backward_weight;
};

struct Operands {
  std::vector<float> x, w, dy;
  std::vector<double> y, dx, dw;  // references
};

Operands make_operands(const WinogradShape& s, uint32_t seed) {
  Operands o;
  o.x = random_vector(x_size(s), seed);
  o.w = random_vector(weight_size(s), seed + 1);
  o.dy = random_vector(y_size(s), seed + 2);
  o.y = reference_forward(s, o.x, o.w);
  o.dx = reference_backward_data(s, o.dy, o.w);
  o.dw = reference_backward_weight(s, o.x, o.dy);
  return o;
}

Errors winograd_errors(const WinogradShape& s, WinogradTile tile, const Operands& o,
                       int64_t tiles_per_block = 0) {
  std::vector<float> y(y_size(s), kNaN), dx(x_size(s), kNaN), dw(weight_size(s), kNaN);
  winograd_conv2d(s, tile, o.x.data(), o.w.data(), y.data(), tiles_per_block);
  winograd_conv2d_backward_data(s, tile, o.dy.data(), o.w.data(), dx.data(), tiles_per_block);
  winograd_conv2d_backward_weight(s, tile, o.x.data(), o.dy.data(), dw.data(), tiles_per_block);
  return {relative_error(y, o.y), relative_error(dx, o.dx), relative_error(dw, o.dw)};
}

std::string describe(const WinogradShape& s) {
  return detail::str(s, " -> [", s.n, ", ", s.k, ", ", s.ho(), ", ", s.wo(), "]");
}

// ------------------------------------------------------------------ tests

struct Case {
  WinogradShape shape;
  int64_t tiles_per_block = 0;  // 0: the kernel's choice
};

// Odd sizes (edge tiles of every width), each padding, k != c, a single channel, outputs smaller
// than a tile, and blocks that end mid-group of the kernel's 8 lanes.
const std::vector<Case> kCases = {
    {{.n = 3, .c = 1, .h = 7, .w = 9, .k = 1, .pad_h = 1, .pad_w = 1}},
    {{.n = 3, .c = 1, .h = 5, .w = 5, .k = 2, .pad_h = 0, .pad_w = 0}},
    {{.n = 2, .c = 3, .h = 7, .w = 9, .k = 5, .pad_h = 2, .pad_w = 2}},
    {{.n = 2, .c = 5, .h = 6, .w = 11, .k = 3, .pad_h = 0, .pad_w = 2}},
    {{.n = 1, .c = 4, .h = 3, .w = 3, .k = 2, .pad_h = 0, .pad_w = 0}},  // 1x1 output
    {{.n = 2, .c = 2, .h = 1, .w = 4, .k = 3, .pad_h = 1, .pad_w = 0}},  // 1x2 output
    {{.n = 1, .c = 3, .h = 2, .w = 2, .k = 2, .pad_h = 2, .pad_w = 2}},  // 4x4 from 2x2
    {{.n = 3, .c = 7, .h = 13, .w = 10, .k = 9, .pad_h = 1, .pad_w = 1}, 7},
    {{.n = 2, .c = 4, .h = 9, .w = 7, .k = 6, .pad_h = 2, .pad_w = 0}, 1},
    {{.n = 4, .c = 12, .h = 10, .w = 10, .k = 8, .pad_h = 1, .pad_w = 1}, 20},
    {{.n = 2, .c = 16, .h = 32, .w = 32, .k = 16, .pad_h = 1, .pad_w = 1}},  // CIFAR, scaled down
    {{.n = 2, .c = 16, .h = 32, .w = 32, .k = 16, .pad_h = 1, .pad_w = 1}, 100},
    {{.n = 2, .c = 64, .h = 8, .w = 8, .k = 64, .pad_h = 1, .pad_w = 1}},
    {{.n = 2, .c = 24, .h = 12, .w = 12, .k = 40, .pad_h = 1, .pad_w = 1}},
};

// Each thread count takes another path: one thread; and with the batch cut into one part per
// thread, or (fewer images than threads) every step parallel on its own.
TEST(Winograd, AllPassesMatchDirectLoops) {
  const int default_threads = get_num_threads();
  for (int threads : {1, default_threads, 3}) {
    set_num_threads(threads);
    uint32_t seed = 1;
    for (const Case& cs : kCases) {
      const Operands operands = make_operands(cs.shape, seed += 3);
      for (WinogradTile tile : kTiles) {
        SCOPED_TRACE(describe(cs.shape) + " " + name(tile) + " tiles_per_block=" +
                     std::to_string(cs.tiles_per_block) + " threads=" + std::to_string(threads));
        const Errors e = winograd_errors(cs.shape, tile, operands, cs.tiles_per_block);
        EXPECT_LT(e.forward, bound(tile));
        EXPECT_LT(e.backward_data, bound(tile));
        EXPECT_LT(e.backward_weight, bound(tile));
      }
    }
  }
  set_num_threads(default_threads);
}

// v [n, c, h, w] from NCHW order to NHWC (to_nhwc), or back.
std::vector<float> reorder(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w,
                           bool to_nhwc) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < h * w; ++p) {
        const int64_t nchw = (i * c + ch) * h * w + p, nhwc = (i * h * w + p) * c + ch;
        out[to_nhwc ? nhwc : nchw] = v[to_nhwc ? nchw : nhwc];
      }
  return out;
}

// The channels-last passes (Note [Winograd in channels-last]) against the same references: x
// and dy given NHWC, y and dx read back from NHWC. The cases' channel counts, 1 to 64, take
// full and partial groups of lanes, and the thread counts each path, as above.
TEST(Winograd, ChannelsLastPassesMatchDirectLoops) {
  const int default_threads = get_num_threads();
  for (int threads : {1, default_threads, 3}) {
    set_num_threads(threads);
    uint32_t seed = 1;
    for (const Case& cs : kCases) {
      const WinogradShape& s = cs.shape;
      WinogradShape nhwc = s;
      nhwc.channels_last = true;
      const Operands o = make_operands(s, seed += 3);
      const std::vector<float> x = reorder(o.x, s.n, s.c, s.h, s.w, true);
      const std::vector<float> dy = reorder(o.dy, s.n, s.k, s.ho(), s.wo(), true);
      for (WinogradTile tile : kTiles) {
        SCOPED_TRACE(describe(nhwc) + " " + name(tile) + " tiles_per_block=" +
                     std::to_string(cs.tiles_per_block) + " threads=" + std::to_string(threads));
        std::vector<float> y(y_size(s), kNaN), dx(x_size(s), kNaN), dw(weight_size(s), kNaN);
        winograd_conv2d(nhwc, tile, x.data(), o.w.data(), y.data(), cs.tiles_per_block);
        winograd_conv2d_backward_data(nhwc, tile, dy.data(), o.w.data(), dx.data(),
                                      cs.tiles_per_block);
        winograd_conv2d_backward_weight(nhwc, tile, x.data(), dy.data(), dw.data(),
                                        cs.tiles_per_block);
        EXPECT_LT(relative_error(reorder(y, s.n, s.k, s.ho(), s.wo(), false), o.y), bound(tile));
        EXPECT_LT(relative_error(reorder(dx, s.n, s.c, s.h, s.w, false), o.dx), bound(tile));
        EXPECT_LT(relative_error(dw, o.dw), bound(tile));
      }
    }
  }
  set_num_threads(default_threads);
}

// A wrong transform or a misplaced edge tile is off by O(1), far above the bounds: make sure a
// small, plausible bug would fail. Shifting the weight by one tap is such a bug.
TEST(Winograd, BoundsCatchAShiftedKernel) {
  const WinogradShape s{.n = 1, .c = 3, .h = 6, .w = 6, .k = 2, .pad_h = 1, .pad_w = 1};
  Operands o = make_operands(s, 99);
  std::rotate(o.w.begin(), o.w.begin() + 1, o.w.end());
  for (WinogradTile tile : kTiles) {
    std::vector<float> y(y_size(s));
    winograd_conv2d(s, tile, o.x.data(), o.w.data(), y.data());
    EXPECT_GT(relative_error(y, o.y), 1000 * bound(tile)) << name(tile);
  }
}

TEST(Winograd, TheBlockSizeDoesNotChangeTheResultBeyondRounding) {
  const WinogradShape s{.n = 3, .c = 6, .h = 11, .w = 13, .k = 5, .pad_h = 1, .pad_w = 2};
  const Operands o = make_operands(s, 7);
  for (WinogradTile tile : kTiles)
    for (int64_t block : {1, 3, 8, 9, 16, 1000}) {
      SCOPED_TRACE(std::string(name(tile)) + " tiles_per_block=" + std::to_string(block));
      const Errors e = winograd_errors(s, tile, o, block);
      EXPECT_LT(e.forward, bound(tile));
      EXPECT_LT(e.backward_data, bound(tile));
      EXPECT_LT(e.backward_weight, bound(tile));
    }
}

TEST(Winograd, AnEmptyBatchGivesAZeroWeightGradient) {
  const WinogradShape s{.n = 0, .c = 3, .h = 5, .w = 5, .k = 2, .pad_h = 1, .pad_w = 1};
  std::vector<float> dw(weight_size(s), kNaN);
  for (WinogradTile tile : kTiles) {
    winograd_conv2d_backward_weight(s, tile, nullptr, nullptr, dw.data());
    EXPECT_TRUE(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST(Winograd, BadShapesRaiseValueError) {
  std::vector<float> buffer(4096);
  float* p = buffer.data();
  const auto tile = WinogradTile::kF4x4;
  const WinogradShape padded{.n = 2, .c = 3, .h = 8, .w = 8, .k = 4, .pad_h = 3, .pad_w = 1};
  EXPECT_LOOM_ERROR(winograd_conv2d(padded, tile, p, p, p), ValueError,
                    {"winograd_conv2d:", "padding of 0, 1 or 2",
                     "x=[2, 3, 8, 8] weight=[4, 3, 3, 3] padding=(3, 1)"});
  const WinogradShape negative{.n = 1, .c = 1, .h = 8, .w = 8, .k = 1, .pad_h = 0, .pad_w = -1};
  EXPECT_LOOM_ERROR(winograd_conv2d_backward_data(negative, tile, p, p, p), ValueError,
                    {"winograd_conv2d_backward_data:", "padding=(0, -1)"});
  const WinogradShape thin{.n = 2, .c = 3, .h = 1, .w = 5, .k = 4, .pad_h = 0, .pad_w = 0};
  EXPECT_LOOM_ERROR(winograd_conv2d_backward_weight(thin, tile, p, p, p), ValueError,
                    {"winograd_conv2d_backward_weight:", "output would be -1x3",
                     "x=[2, 3, 1, 5] weight=[4, 3, 3, 3]"});
  const WinogradShape no_channels{.n = 2, .c = 0, .h = 5, .w = 5, .k = 4, .pad_h = 1, .pad_w = 1};
  EXPECT_LOOM_ERROR(winograd_conv2d(no_channels, tile, p, p, p), ValueError,
                    {"winograd_conv2d:", "x=[2, 0, 5, 5] weight=[4, 0, 3, 3]"});
  const WinogradShape fine{.n = 1, .c = 1, .h = 5, .w = 5, .k = 1, .pad_h = 1, .pad_w = 1};
  EXPECT_LOOM_ERROR(winograd_conv2d(fine, tile, p, p, p, -1), ValueError,
                    {"winograd_conv2d:", "tiles_per_block >= 0", "got -1"});
}

// The accuracy table: relative error of each pass on the ResNet-18 3x3 layers (c = k, pad 1,
// n = 2), for both tiles and for loom's conv2d (GEMM on the patches, float32) as the baseline.
// Printed as "[ measured ]" lines; also checked against the bounds.
TEST(Winograd, AccuracyOnResNet18Layers) {
  struct Layer {
    int64_t channels, side;
  };
  const Layer layers[] = {{64, 32}, {128, 16}, {256, 8}, {512, 4}};
  std::printf("[ measured ] relative error max|a-b|/max|ref| vs float64, n=2, c=k, pad 1\n");
  std::printf("[ measured ] %-16s %-16s %10s %10s %10s\n", "layer", "pass", "F2x2", "F4x4",
              "conv2d");
  uint32_t seed = 1000;
  for (const Layer& layer : layers) {
    const WinogradShape s{.n = 2,
                          .c = layer.channels,
                          .h = layer.side,
                          .w = layer.side,
                          .k = layer.channels,
                          .pad_h = 1,
                          .pad_w = 1};
    const Operands o = make_operands(s, seed += 3);
    const Errors f2 = winograd_errors(s, WinogradTile::kF2x2, o);
    const Errors f4 = winograd_errors(s, WinogradTile::kF4x4, o);
    // The baseline: loom's float32 conv2d and its backward on the same operands.
    const Tensor x = from_data(o.x.data(), {s.n, s.c, s.h, s.w}, kFloat32);
    const Tensor w = from_data(o.w.data(), {s.k, s.c, 3, 3}, kFloat32);
    const Tensor dy = from_data(o.dy.data(), {s.n, s.k, s.ho(), s.wo()}, kFloat32);
    kernels::Conv2dOptions options;
    options.padding = {1, 1};
    const Tensor y = kernels::conv2d(x, w, Tensor(), options);
    const kernels::Conv2dGrads g = kernels::conv2d_backward(dy, x, w, options, {true, true, false});
    const Errors direct{relative_error(y.to_vector<float>(), o.y),
                        relative_error(g.dx.to_vector<float>(), o.dx),
                        relative_error(g.dweight.to_vector<float>(), o.dw)};
    const std::string label = detail::str(layer.channels, "ch ", layer.side, "x", layer.side);
    const std::pair<const char*, double Errors::*> passes[] = {
        {"forward", &Errors::forward},
        {"backward-data", &Errors::backward_data},
        {"backward-weight", &Errors::backward_weight}};
    for (const auto& [pass, field] : passes) {
      std::printf("[ measured ] %-16s %-16s %10.2e %10.2e %10.2e\n", label.c_str(), pass, f2.*field,
                  f4.*field, direct.*field);
      EXPECT_LT(f2.*field, bound(WinogradTile::kF2x2)) << label << " " << pass;
      EXPECT_LT(f4.*field, bound(WinogradTile::kF4x4)) << label << " " << pass;
    }
  }
}

}  // namespace
}  // namespace loom::cpu
