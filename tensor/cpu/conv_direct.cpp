// tensor/cpu/conv_direct.cpp — direct 3x3 convolution for few channels on wide images: register
// tiles over row segments of 16 pixels (AVX-512) or 8 (AVX2), read from a zero-padded copy of
// each image. The plan is Note [Direct 3x3 convolution]; the tiles are conv_direct_tiles.h.

#include "tensor/cpu/conv_direct.h"

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "tensor/cpu/scratch.h"
#include "tensor/cpu_info.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

// The AVX-512 tiles are compiled in a target region of their own on any x86-64 baseline; the
// AVX2 ones with the baseline's instructions, where it has AVX2 and FMA (as the packed GEMM's).
#if defined(__x86_64__)
#include <immintrin.h>
#define LOOM_DIRECT_CONV_AVX512 1
#else
#define LOOM_DIRECT_CONV_AVX512 0
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define LOOM_DIRECT_CONV_AVX2 1
#else
#define LOOM_DIRECT_CONV_AVX2 0
#endif

namespace loom::cpu {

// Note [Direct 3x3 convolution]
//   At 16 or 32 channels a 3x3 layer is a GEMM with K = 9 C = 144 or 288, and the patch matrix
//   that conv2d's packed engine builds holds every input value nine times, each then used by only
//   O rows of the weight: packing, not multiplying, is the work (the packed engine ran the 16->16
//   layer at 32 x 32 at about 150 GFLOP/s on two AVX-512 cores, a third of their peak). The direct
//   loops below read the input where it lies instead. A vector holds L consecutive pixels of one
//   row (L = 16 with AVX-512, 8 with AVX2; W must be whole vectors), and a tap (r, s) of input
//   channel c is then one unaligned load at a fixed offset from the output pixels' own position
//   in a zero-padded copy of the image ([C, H+2, W+2], one per sample, made by the thread that
//   uses it):
//       y[o, i, j..j+L-1] += weight[o, c, r, s] * xpad[c, i + r, j + s .. j + s + L-1]
//   Below, the figures are AVX-512's (32 registers); AVX2's tiles are half as many output
//   channels (16 registers: 12 accumulators).
//   - Forward: a tile of 8 output channels x 3 pixel vectors keeps 24 accumulators in registers;
//     per input channel and tap it loads 3 input vectors and broadcasts 8 weights (packed as
//     [O/8, C, 9, 8] so they are consecutive) for 24 FMAs. Loads are below half the FMAs, so the
//     FMAs set the pace; the image and the weights stay in L1/L2.
//   - Backward-data is the forward of dy with the weight flipped in space and its channels
//     swapped (Note [dx as a convolution] in conv.cpp; with padding 1 the padding stays 1).
//   - Backward-weight sums over pixels, so the pixels are the sum's dimension, not the vectors':
//     a tile of 4 output x 2 input channels x the 3 column taps s of one row tap r keeps 24
//     accumulators of L lanes each, lane l summing the pixels j = l (mod L). Per vector of
//     pixels it loads 4 vectors of dy and 6 shifted vectors of x for 24 FMAs. The lanes are summed
//     only at the end: between tiles the accumulators live in a [O, C, 9, L] buffer per thread,
//     and a tile takes several samples (at least kGradPixels pixels) so that it runs long
//     between those loads and stores. The threads split the batch and add their buffers at the
//     end, as conv2d's packed engine adds its partial weight gradients. The buffer is
//     O C 9 L floats: 590 KiB at 32 x 32 channels, within an L2; at 64 x 64 (2.4 MiB) every
//     chunk's loads and stores of it go to memory, and the packed GEMM was as fast or faster
//     (direct_weight_grad_pays).
//   The sums are float32 in a fixed order per shape and thread count, as conv2d's other paths.

// Note [Narrow rows]
//   Rows narrower than a vector (8 x 8 and 4 x 4 images, where ResNet-18 has 64 to 512
//   channels) would leave most lanes idle. With AVX-512, where W divides 16, a vector takes
//   16 / W whole rows instead. A tap (r, s) of such a vector is no longer one run of the padded
//   image: its lanes for each row's first or last column would read the neighbouring row. So the
//   padded copy holds each channel three times, [3, H+2, W], shifted by s - 1 columns with zeros
//   where the shift leaves the row; tap (r, s) is then 16 consecutive floats of copy s, rows
//   i + r on. The copy is three times the input, small next to the products (9 O multiplies per
//   input value). A plane (H W) must be whole vectors; a chunk of samples is one sequence of
//   vectors, so the forward's 3-vector tiles span samples where images are small. Masked loads
//   on one copy, the first way tried, ran the forward at 0.68 of the wide rows' speed on one
//   thread; the shifted copies run it at 0.84-0.93. AVX2 keeps whole-vector rows.
//   Measured (2 threads, batch 128): the forward and backward-data take 0.6-0.85 of the packed
//   engine's time at 32 to 128 channels on 8 x 8 and 4 x 4. The weight gradient on narrow rows
//   was level with the packed engine's, which conv2d keeps (direct_weight_grad_pays).

namespace {

constexpr int kPixelVectors = 3;         // forward: pixel vectors per tile
constexpr int64_t kForwardPixels = 256;  // forward: pixels per chunk of samples at least
constexpr int64_t kGradPixels = 1024;    // backward-weight: pixels a tile runs over at least

// The zero-padded images: [C, H+2, W+2] per sample, where tap (r, s) of output pixel (i, j) is
// at (i + r, j + s); where rows are narrower than a vector (Note [Narrow rows]), three planes
// [H+2, W] per channel, the rows shifted by s - 1 columns, where it is at (s, i + r, j). tap: the
// distance from s to s + 1.
struct Padded {
  int64_t c, h, w;
  bool narrow;
  int64_t hp, wp, tap, plane, sample;  // plane: one channel's floats
  Padded(int64_t c_, int64_t h_, int64_t w_, int64_t lanes)
      : c(c_),
        h(h_),
        w(w_),
        narrow(w_ % lanes != 0),
        hp(h_ + 2),
        wp(narrow ? w_ : w_ + 2),
        tap(narrow ? hp * wp : 1),
        plane(narrow ? 3 * hp * wp : hp * wp),
        sample(c_ * plane) {}
};

// ------------------------------------------------------------------ the tiles, per instruction set
//
// conv_direct_tiles.h, compiled once for each: 24 accumulators in the 32 AVX-512 registers
// (8 outputs x 3 vectors forward; 4 x 2 x 3 for the weight gradient), 12 in the 16 AVX2 ones
// (4 x 3; 2 x 2 x 3), each leaving registers for the loads and the broadcast.

#if LOOM_DIRECT_CONV_AVX512
namespace avx512 {
// GCC and clang each spell a target region their own way.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
struct Vec {
  using V = __m512;
  static constexpr int64_t lanes = 16;
  static constexpr int out_block = 8, grad_out = 4;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V broadcast(float s) { return _mm512_set1_ps(s); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V zero() { return _mm512_setzero_ps(); }
};
#include "tensor/cpu/conv_direct_tiles.h"  // NOLINT(build/include)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx512
#endif

#if LOOM_DIRECT_CONV_AVX2
namespace avx2 {  // the build's baseline has AVX2 and FMA: no target region needed
struct Vec {
  using V = __m256;
  static constexpr int64_t lanes = 8;
  static constexpr int out_block = 4, grad_out = 2;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V broadcast(float s) { return _mm256_set1_ps(s); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V zero() { return _mm256_setzero_ps(); }
};
#include "tensor/cpu/conv_direct_tiles.h"  // NOLINT(build/include)
}  // namespace avx2
#endif

#if LOOM_DIRECT_CONV_AVX512
using Avx512 = avx512::Tiles;
#endif
#if LOOM_DIRECT_CONV_AVX2
using Avx2 = avx2::Tiles;
#endif

// run.template operator()<Isa>() with the tiles of the instruction set in use; nothing where
// there are none.
template <typename F>
void with_tiles(F&& run) {
#if LOOM_DIRECT_CONV_AVX512
  if (cpu_isa() >= CpuIsa::kAvx512) return run.template operator()<Avx512>();
#endif
#if LOOM_DIRECT_CONV_AVX2
  if (cpu_isa() >= CpuIsa::kAvx2) return run.template operator()<Avx2>();
#endif
  (void)run;
}

// The vector width of those tiles (0: none): 16 floats on the AVX-512 paths, 8 on AVX2.
int64_t lanes_here() {
  int64_t lanes = 0;
  with_tiles([&]<typename Isa>() { lanes = Isa::Traits::lanes; });
  return lanes;
}

// wp [O/B, C, 9, B] from weight [O, C, 3, 3], B = Isa's out_block; flipped: from the
// backward-data's weight, the forward's [C, O, 3, 3] read with its channels swapped and its taps
// reversed.
template <typename Isa>
std::vector<float> pack_weight(const float* weight, int64_t o_count, int64_t c_count,
                               bool flipped) {
  constexpr int64_t b = Isa::Traits::out_block;
  std::vector<float> wp(static_cast<size_t>(o_count * c_count * 9));
  for (int64_t o = 0; o < o_count; ++o)
    for (int64_t c = 0; c < c_count; ++c)
      for (int64_t t = 0; t < 9; ++t)
        wp[((o / b * c_count + c) * 9 + t) * b + o % b] =
            flipped ? weight[(c * o_count + o) * 9 + 8 - t] : weight[(o * c_count + c) * 9 + t];
  return wp;
}

// `size` zeros from the frame.
float* zeros(ScratchFrame& frame, int64_t size) {
  float* p = frame.get<float>(size);
  std::fill(p, p + size, 0.f);
  return p;
}

// y [N, O, H, W] = the direct convolution of x [N, C, H, W] with weights packed by pack_weight;
// the threads split the batch, and take it in chunks of samples whose vectors the tiles run
// through as one sequence (several samples per chunk where images are small).
template <typename Isa>
void forward_packed(const DirectShape& s, const float* x, const float* wp, float* y) {
  using Vec = typename Isa::Traits;
  constexpr int64_t lanes = Vec::lanes;
  const Padded pad(s.c, s.h, s.w, lanes);
  const int64_t p = s.h * s.w, per_sample = p / lanes;
  const int64_t chunk = std::max<int64_t>(1, kForwardPixels / p);
  parallel_for(0, s.n, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    const int64_t buffered = std::min(chunk, hi - lo);
    float* xp = zeros(frame, buffered * pad.sample);
    for (int64_t n0 = lo; n0 < hi; n0 += chunk) {
      const int64_t count = std::min(chunk, hi - n0), vectors = count * per_sample;
      Isa::fill(x + n0 * s.c * p, count, pad, xp);
      for (int64_t ob = 0; ob < s.o; ob += Vec::out_block) {
        const float* wb = wp + ob * s.c * 9;
        int64_t v = 0;
        const auto tile = [&]<int R>() {
          int64_t in_at[R];
          float* out_at[R];
          for (int k = 0; k < R; ++k) {
            const int64_t n = (v + k) / per_sample, q = (v + k) % per_sample * lanes;
            in_at[k] = n * pad.sample + q / s.w * pad.wp + q % s.w;
            out_at[k] = y + ((n0 + n) * s.o + ob) * p + q;
          }
          const auto run =
              pad.narrow ? Isa::template forward<R, true> : Isa::template forward<R, false>;
          run(xp, wb, pad, in_at, out_at, p);
          v += R;
        };
        while (v + kPixelVectors <= vectors) tile.template operator()<kPixelVectors>();
        while (v < vectors) tile.template operator()<1>();
      }
    }
  });
}

// dweight [O, C, 3, 3]: the threads split the batch into parts, each summing its lanes' partial
// sums; the lanes and parts are added at the end.
template <typename Isa>
void backward_weight(const DirectShape& s, const float* x, const float* dy, float* dweight) {
  constexpr int64_t lanes = Isa::Traits::lanes, grad_out = Isa::Traits::grad_out;
  const Padded pad(s.c, s.h, s.w, lanes);
  const int64_t p = s.h * s.w, taps = s.o * s.c * 9;
  const int64_t parts = std::clamp<int64_t>(get_num_threads(), 1, s.n);
  const int64_t chunk =
      std::clamp<int64_t>((kGradPixels + p - 1) / p, 1, (s.n + parts - 1) / parts);
  std::vector<float> partial(static_cast<size_t>(parts * taps * lanes), 0.f);  // [O, C, 9, L]
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    float* xp = zeros(frame, chunk * pad.sample);
    const auto weight_tile = pad.narrow ? Isa::template weight<true> : Isa::template weight<false>;
    for (int64_t part = lo; part < hi; ++part) {
      float* acc = partial.data() + part * taps * lanes;
      const int64_t n_end = s.n * (part + 1) / parts;
      for (int64_t n0 = s.n * part / parts; n0 < n_end; n0 += chunk) {
        const int64_t count = std::min(chunk, n_end - n0);
        Isa::fill(x + n0 * s.c * p, count, pad, xp);
        const float* d = dy + n0 * s.o * p;
        for (int64_t o = 0; o < s.o; o += grad_out)
          for (int64_t c = 0; c < s.c; c += 2)
            for (int64_t r = 0; r < 3; ++r)
              weight_tile(d + o * p, s.o * p, xp + c * pad.plane, pad, count, r,
                          acc + (o * s.c + c) * 9 * lanes, s.c);
      }
    }
  });
  parallel_for(0, taps, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float sum = 0;
      for (int64_t part = 0; part < parts; ++part)
        for (int64_t l = 0; l < lanes; ++l) sum += partial[(part * taps + t) * lanes + l];
      dweight[t] = sum;
    }
  });
}

void check(const DirectShape& s, const char* op) {
  const int64_t lanes = lanes_here();
  LOOM_CHECK(direct_conv3x3_fits(s), ValueError, op, ": the direct 3x3 kernels do not run ", s,
             " here (they need AVX2 and FMA; W a multiple of the vector width (",
             lanes > 0 ? lanes : 8,
             " floats here), or with AVX-512 a divisor of it with H W a multiple; C and O "
             "multiples of 8 and at most ",
             kDirectMaxChannels, ")");
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const DirectShape& s) {
  return os << "x=[" << s.n << ", " << s.c << ", " << s.h << ", " << s.w << "] weight=[" << s.o
            << ", " << s.c << ", 3, 3]";
}

bool direct_conv3x3_fits(const DirectShape& s) {
  const int64_t lanes = lanes_here();
  if (lanes == 0 || s.n < 1 || s.h < 1 || s.w < 1) return false;
  const bool wide = s.w % lanes == 0;
  const bool narrow = lanes == 16 && s.w >= 2 && lanes % s.w == 0 && s.h * s.w % lanes == 0;
  return (wide || narrow) && s.c >= 8 && s.c % 8 == 0 && s.c <= kDirectMaxChannels && s.o >= 8 &&
         s.o % 8 == 0 && s.o <= kDirectMaxChannels;
}

bool direct_conv3x3_pays(const DirectShape& s) {
  return direct_conv3x3_fits(s) && lanes_here() == 16;
}

bool direct_weight_grad_pays(const DirectShape& s) {
  const int64_t lanes = lanes_here();
  return lanes > 0 && s.w % lanes == 0 && s.o * s.c <= 32 * 32;
}

void direct_conv3x3(const DirectShape& s, const float* x, const float* weight, float* y) {
  check(s, "direct_conv3x3");
  with_tiles([&]<typename Isa>() {
    const std::vector<float> wp = pack_weight<Isa>(weight, s.o, s.c, /*flipped=*/false);
    forward_packed<Isa>(s, x, wp.data(), y);
  });
}

void direct_conv3x3_backward_data(const DirectShape& s, const float* dy, const float* weight,
                                  float* dx) {
  check(s, "direct_conv3x3_backward_data");
  with_tiles([&]<typename Isa>() {
    const std::vector<float> wp = pack_weight<Isa>(weight, s.c, s.o, /*flipped=*/true);
    forward_packed<Isa>({.n = s.n, .c = s.o, .h = s.h, .w = s.w, .o = s.c}, dy, wp.data(), dx);
  });
}

void direct_conv3x3_backward_weight(const DirectShape& s, const float* x, const float* dy,
                                    float* dweight) {
  check(s, "direct_conv3x3_backward_weight");
  with_tiles([&]<typename Isa>() { backward_weight<Isa>(s, x, dy, dweight); });
}

}  // namespace loom::cpu
