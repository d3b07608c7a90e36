// tensor/cpu/conv_direct.cpp — direct 3x3 convolution on AVX-512 for few channels on wide
// images: register tiles over 16-pixel row segments, read from a zero-padded copy of each image.
// The plan is Note [Direct 3x3 convolution].

#include "tensor/cpu/conv_direct.h"

#include <algorithm>
#include <cstring>
#include <ostream>
#include <vector>

#include "tensor/cpu/scratch.h"
#include "tensor/cpu_info.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LOOM_DIRECT_CONV_SIMD 1
#else
#define LOOM_DIRECT_CONV_SIMD 0
#endif

namespace loom::cpu {

// Note [Direct 3x3 convolution]
//   At 16 or 32 channels a 3x3 layer is a GEMM with K = 9 C = 144 or 288, and the patch matrix
//   that conv2d's packed engine builds holds every input value nine times, each then used by only
//   O rows of the weight: packing, not multiplying, is the work (the packed engine ran the 16->16
//   layer at 32 x 32 at about 150 GFLOP/s on two AVX-512 cores, a third of their peak). The direct
//   loops below read the input where it lies instead. A vector holds 16 consecutive pixels of one
//   row (so W must be whole vectors), and a tap (r, s) of input channel c is then one unaligned
//   load at a fixed offset from the output pixels' own position in a zero-padded copy of the image
//   ([C, H+2, W+2], one per sample, made by the thread that uses it):
//       y[o, i, j..j+15] += weight[o, c, r, s] * xpad[c, i + r, j + s .. j + s + 15]
//   - Forward: a tile of 8 output channels x 3 pixel vectors keeps 24 accumulators in registers;
//     per input channel and tap it loads 3 input vectors and broadcasts 8 weights (packed as
//     [O/8, C, 9, 8] so they are consecutive) for 24 FMAs. Loads are below half the FMAs, so the
//     FMAs set the pace; the image and the weights stay in L1/L2.
//   - Backward-data is the forward of dy with the weight flipped in space and its channels
//     swapped (Note [dx as a convolution] in conv.cpp; with padding 1 the padding stays 1).
//   - Backward-weight sums over pixels, so the pixels are the sum's dimension, not the vectors':
//     a tile of 4 output x 2 input channels x the 3 column taps s of one row tap r keeps 24
//     accumulators of 16 lanes each, lane l summing the pixels j = l (mod 16). Per vector of
//     pixels it loads 4 vectors of dy and 6 shifted vectors of x for 24 FMAs. The lanes are summed
//     only at the end: between tiles the accumulators live in a [O, C, 9, 16] buffer per thread,
//     and a tile takes several samples (at least kGradPixels pixels) so that it runs long
//     between those loads and stores. The threads split the batch and add their buffers at the
//     end, as conv2d's packed engine adds its partial weight gradients.
//   The sums are float32 in a fixed order per shape and thread count, as conv2d's other paths.

namespace {

constexpr int64_t kLanes = 16;         // floats per vector: the pixels of one vector
constexpr int kOutBlock = 8;           // forward: output channels per tile
constexpr int kPixelVectors = 3;       // forward: pixel vectors per tile
constexpr int kGradOut = 4;            // backward-weight: output channels per tile
constexpr int kGradIn = 2;             // backward-weight: input channels per tile
constexpr int64_t kGradPixels = 1024;  // backward-weight: pixels a tile runs over at least

void check(const DirectShape& s, const char* op) {
  LOOM_CHECK(direct_conv3x3_fits(s), ValueError, op, ": the direct 3x3 kernels do not run ", s,
             " here (they need AVX-512, W a multiple of ", kLanes, ", C and O multiples of 8 and ",
             "at most ", kDirectMaxChannels, ")");
}

// The zero-padded images: `count` samples of [C, H+2, W+2].
struct Padded {
  int64_t c, h, w, hp, wp, plane, sample;
  Padded(int64_t c_, int64_t h_, int64_t w_)
      : c(c_), h(h_), w(w_), hp(h_ + 2), wp(w_ + 2), plane(hp * wp), sample(c_ * hp * wp) {}
  // Copies samples [C, H, W] (consecutive in x) into the interiors of dst, whose borders the
  // caller zeroed once.
  void fill(const float* x, int64_t count, float* dst) const {
    for (int64_t i = 0; i < count * c; ++i)
      for (int64_t row = 0; row < h; ++row)
        std::memcpy(dst + i * plane + (row + 1) * wp + 1, x + (i * h + row) * w,
                    static_cast<size_t>(w) * sizeof(float));
  }
};

#if LOOM_DIRECT_CONV_SIMD

// y (R vectors of output channels [ob, ob + 8)) = the taps of xp. in_at[r]: where vector r's
// pixels are in one padded plane; out_at[r]: where they are in output channel ob; wb: the
// packed weights of the block, [C, 9, 8].
template <int R>
[[gnu::target("avx512f")]] void forward_tile_512(const float* xp, const float* wb,
                                                 const Padded& pad, const int64_t* in_at,
                                                 float* const* out_at, int64_t out_plane) {
  __m512 acc[kOutBlock][R];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t c = 0; c < pad.c; ++c) {
    const float* plane = xp + c * pad.plane;
    const float* wc = wb + c * 9 * kOutBlock;
    for (int64_t r = 0; r < 3; ++r) {
#pragma GCC unroll 3
      for (int64_t s = 0; s < 3; ++s) {
        __m512 in[R];
        for (int v = 0; v < R; ++v) in[v] = _mm512_loadu_ps(plane + in_at[v] + r * pad.wp + s);
        const float* taps = wc + (r * 3 + s) * kOutBlock;
#pragma GCC unroll 8
        for (int o = 0; o < kOutBlock; ++o) {
          const __m512 weight = _mm512_set1_ps(taps[o]);
          for (int v = 0; v < R; ++v) acc[o][v] = _mm512_fmadd_ps(weight, in[v], acc[o][v]);
        }
      }
    }
  }
  for (int o = 0; o < kOutBlock; ++o)
    for (int v = 0; v < R; ++v) _mm512_storeu_ps(out_at[v] + o * out_plane, acc[o][v]);
}

// The lanes' partial sums acc_mem [O, C, 9, 16] of output channels [0, 4), input channels
// [0, 2) and row tap r, plus the products of `count` samples: dy [O, H, W] and xp [C, H+2, W+2]
// per sample, dy_sample and pad.sample floats apart.
[[gnu::target("avx512f")]] void weight_tile_512(const float* dy, int64_t dy_sample, const float* xp,
                                                const Padded& pad, int64_t count, int64_t r,
                                                float* acc_mem, int64_t c_total) {
  const int64_t out_row = c_total * 9 * kLanes;  // acc_mem's stride between output channels
  auto at = [&](int o, int c, int s) {
    return acc_mem + o * out_row + (c * 9 + r * 3 + s) * kLanes;
  };
  __m512 acc[kGradOut][kGradIn][3];
  for (int o = 0; o < kGradOut; ++o)
    for (int c = 0; c < kGradIn; ++c)
      for (int s = 0; s < 3; ++s) acc[o][c][s] = _mm512_loadu_ps(at(o, c, s));
  const int64_t p = pad.h * pad.w;
  for (int64_t n = 0; n < count; ++n) {
    const float* d = dy + n * dy_sample;
    const float* x = xp + n * pad.sample + r * pad.wp;
    for (int64_t i = 0; i < pad.h; ++i)
      for (int64_t j = 0; j < pad.w; j += kLanes) {
        __m512 grad[kGradOut];
        for (int o = 0; o < kGradOut; ++o) grad[o] = _mm512_loadu_ps(d + o * p + i * pad.w + j);
#pragma GCC unroll 2
        for (int c = 0; c < kGradIn; ++c)
#pragma GCC unroll 3
          for (int s = 0; s < 3; ++s) {
            const __m512 in = _mm512_loadu_ps(x + c * pad.plane + i * pad.wp + j + s);
            for (int o = 0; o < kGradOut; ++o)
              acc[o][c][s] = _mm512_fmadd_ps(grad[o], in, acc[o][c][s]);
          }
      }
  }
  for (int o = 0; o < kGradOut; ++o)
    for (int c = 0; c < kGradIn; ++c)
      for (int s = 0; s < 3; ++s) _mm512_storeu_ps(at(o, c, s), acc[o][c][s]);
}

#endif  // LOOM_DIRECT_CONV_SIMD

// wp [O/8, C, 9, 8] from weight [O, C, 3, 3]; flipped: from the backward-data's weight, the
// forward's [C, O, 3, 3] read with its channels swapped and its taps reversed.
void pack_weight(const float* weight, int64_t o_count, int64_t c_count, bool flipped, float* wp) {
  for (int64_t o = 0; o < o_count; ++o)
    for (int64_t c = 0; c < c_count; ++c)
      for (int64_t t = 0; t < 9; ++t) {
        const float v =
            flipped ? weight[(c * o_count + o) * 9 + 8 - t] : weight[(o * c_count + c) * 9 + t];
        wp[((o / kOutBlock * c_count + c) * 9 + t) * kOutBlock + o % kOutBlock] = v;
      }
}

// y [N, O, H, W] = the direct convolution of x [N, C, H, W] with packed weights wp; the threads
// split the batch.
void forward_packed(const DirectShape& s, const float* x, const float* wp, float* y) {
#if LOOM_DIRECT_CONV_SIMD
  const Padded pad(s.c, s.h, s.w);
  const int64_t p = s.h * s.w, vectors = p / kLanes, per_row = s.w / kLanes;
  parallel_for(0, s.n, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    float* xp = frame.get<float>(pad.sample);
    std::fill(xp, xp + pad.sample, 0.f);
    for (int64_t n = lo; n < hi; ++n) {
      pad.fill(x + n * s.c * p, 1, xp);
      float* out = y + n * s.o * p;
      for (int64_t ob = 0; ob < s.o; ob += kOutBlock) {
        const float* wb = wp + ob * s.c * 9;
        float* out_block = out + ob * p;
        int64_t v = 0;
        const auto tile = [&]<int R>() {
          int64_t in_at[R];
          float* out_at[R];
          for (int k = 0; k < R; ++k) {
            const int64_t i = (v + k) / per_row, j = (v + k) % per_row * kLanes;
            in_at[k] = i * pad.wp + j;
            out_at[k] = out_block + i * s.w + j;
          }
          forward_tile_512<R>(xp, wb, pad, in_at, out_at, p);
          v += R;
        };
        while (v + kPixelVectors <= vectors) tile.template operator()<kPixelVectors>();
        while (v < vectors) tile.template operator()<1>();
      }
    }
  });
#else
  (void)s, (void)x, (void)wp, (void)y;
#endif
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const DirectShape& s) {
  return os << "x=[" << s.n << ", " << s.c << ", " << s.h << ", " << s.w << "] weight=[" << s.o
            << ", " << s.c << ", 3, 3]";
}

bool direct_conv3x3_fits(const DirectShape& s) {
  return LOOM_DIRECT_CONV_SIMD && cpu_isa() >= CpuIsa::kAvx512 && s.n >= 1 && s.h >= 1 &&
         s.w >= kLanes && s.w % kLanes == 0 && s.c >= 8 && s.c % 8 == 0 &&
         s.c <= kDirectMaxChannels && s.o >= 8 && s.o % 8 == 0 && s.o <= kDirectMaxChannels;
}

void direct_conv3x3(const DirectShape& s, const float* x, const float* weight, float* y) {
  check(s, "direct_conv3x3");
  std::vector<float> wp(static_cast<size_t>(s.o * s.c * 9));
  pack_weight(weight, s.o, s.c, /*flipped=*/false, wp.data());
  forward_packed(s, x, wp.data(), y);
}

void direct_conv3x3_backward_data(const DirectShape& s, const float* dy, const float* weight,
                                  float* dx) {
  check(s, "direct_conv3x3_backward_data");
  std::vector<float> wp(static_cast<size_t>(s.o * s.c * 9));
  pack_weight(weight, s.c, s.o, /*flipped=*/true, wp.data());
  forward_packed({.n = s.n, .c = s.o, .h = s.h, .w = s.w, .o = s.c}, dy, wp.data(), dx);
}

void direct_conv3x3_backward_weight(const DirectShape& s, const float* x, const float* dy,
                                    float* dweight) {
  check(s, "direct_conv3x3_backward_weight");
#if LOOM_DIRECT_CONV_SIMD
  const Padded pad(s.c, s.h, s.w);
  const int64_t p = s.h * s.w, taps = s.o * s.c * 9;
  const int64_t parts = std::clamp<int64_t>(get_num_threads(), 1, s.n);
  const int64_t chunk =
      std::clamp<int64_t>((kGradPixels + p - 1) / p, 1, (s.n + parts - 1) / parts);
  // The lanes' partial sums, [O, C, 9, 16] per part.
  std::vector<float> partial(static_cast<size_t>(parts * taps * kLanes), 0.f);
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    float* xp = frame.get<float>(chunk * pad.sample);
    std::fill(xp, xp + chunk * pad.sample, 0.f);
    for (int64_t part = lo; part < hi; ++part) {
      float* acc = partial.data() + part * taps * kLanes;
      const int64_t n_end = s.n * (part + 1) / parts;
      for (int64_t n0 = s.n * part / parts; n0 < n_end; n0 += chunk) {
        const int64_t count = std::min(chunk, n_end - n0);
        pad.fill(x + n0 * s.c * p, count, xp);
        const float* d = dy + n0 * s.o * p;
        for (int64_t o = 0; o < s.o; o += kGradOut)
          for (int64_t c = 0; c < s.c; c += kGradIn)
            for (int64_t r = 0; r < 3; ++r)
              weight_tile_512(d + o * p, s.o * p, xp + c * pad.plane, pad, count, r,
                              acc + (o * s.c + c) * 9 * kLanes, s.c);
      }
    }
  });
  parallel_for(0, taps, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float sum = 0;
      for (int64_t part = 0; part < parts; ++part)
        for (int64_t l = 0; l < kLanes; ++l) sum += partial[(part * taps + t) * kLanes + l];
      dweight[t] = sum;
    }
  });
#else
  (void)x, (void)dy, (void)dweight;
#endif
}

}  // namespace loom::cpu
