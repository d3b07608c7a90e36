// tensor/cpu/conv_direct.cpp — direct 3x3 convolution for few channels on wide images: register
// tiles over row segments of 16 pixels (AVX-512) or 8 (AVX2), read from a zero-padded copy of
// each image. The plan is Note [Direct 3x3 convolution]; the tiles are conv_direct_tiles.h.

#include "tensor/cpu/conv_direct.h"

#include <algorithm>
#include <array>
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

// Note [Stride 2 in phases]
//   A stride-2 layer (ResNet-18's first 3x3 convolution of stages 2 to 4) reads every other
//   column, so the vector of an output row's 16 pixels would be a strided gather. Split the
//   input into its four phases instead, x_pq[a, b] = x[2a + p, 2b + q]: tap (r, s) of output
//   pixel (i, j) reads x[2i + r - 1, 2j + s - 1], which is phase p = (r + 1) % 2 at row
//   i + (r - 1 - p) / 2 (r = 0: phase 1, row i - 1; r = 1: phase 0, row i; r = 2: phase 1, row i),
//   and the same for columns. Within a phase the taps are again consecutive pixels: the forward
//   and the weight gradient run the stride-1 tiles over the output's grid, reading the phase
//   planes (each with a zero first row and column for the taps at i - 1 and j - 1; on narrow
//   rows, three column copies per row phase, as Note [Narrow rows]) through a table of the nine
//   taps' offsets.
//   The backward-data is the reverse: dx's phase (p, q) is a convolution of dy with the taps
//   that land on it (r = 1 on even rows; r = 0 from row a + 1 and r = 2 from row a on odd ones):
//   1, 2, 2 and 4 taps of dy's zero-padded copy, each phase a forward tile's pass with its own
//   table. The phases go to a buffer per chunk of samples, then are interleaved into dx's rows.
//   The products are the stride-1 tiles' (the same FMAs per load); the phase copies, with a
//   quarter of the products per input value, and the backward-data's interleaving are the extra
//   work. Against the packed engine, which builds a patch matrix for these layers, it gains on
//   the forward and, only where rows are wide and channels few, on the backward-data
//   (direct_conv3x3_pays; docs/cpu_speed.md).

namespace {

constexpr int kPixelVectors = 3;         // forward: pixel vectors per tile
constexpr int64_t kForwardPixels = 256;  // forward: pixels per chunk of samples at least
constexpr int64_t kGradPixels = 1024;    // backward-weight: pixels a tile runs over at least

// How the tiles find a tap's input: at offsets fixed at compile time on stride 1's wide and
// narrow layouts, or through a TapTable (stride 2's phases, and its backward-data).
enum class Taps : uint8_t { kWide, kNarrow, kTable };

// Taps a tile sums: where each one's input vector is, from the output vector's position in the
// padded planes, and which of the packed weights' nine taps it multiplies.
struct TapTable {
  int count = 0;
  std::array<int64_t, 9> offset{};
  std::array<int, 9> weight{};
};

// The zero-padded input planes of one layer. The tiles run over the output grid ho x wo; an
// output vector at pixel (i, j) sits at i * wp + j in channel 0's planes (wide rows: j a
// multiple of the lanes; narrow: a vector holds whole rows).
//   Stride 1: [C, H+2, W+2] per sample, tap (r, s) at (i + r, j + s); where rows are narrower
//   than a vector (Note [Narrow rows]), three planes [H+2, W] per channel, the rows shifted by
//   s - 1 columns, tap (r, s) at (s, i + r, j). tap: the distance from s to s + 1.
//   Stride 2 (Note [Stride 2 in phases]): four phase planes [ho+1, wo+1] per channel, (p, q) at
//   2p + q; on narrow rows six [ho+1, wo], (p, s) at 3p + s; tap: the distance between planes.
//   `taps` holds their nine taps' offsets (empty at stride 1).
struct Padded {
  int64_t c, h, w, stride;  // the input
  int64_t ho, wo;           // the output grid
  bool narrow;
  int64_t hp, wp, tap, plane, sample;  // plane: one channel's floats
  TapTable taps;
  Padded(int64_t c_, int64_t h_, int64_t w_, int64_t stride_, int64_t lanes)
      : c(c_), h(h_), w(w_), stride(stride_), ho(h_ / stride_), wo(w_ / stride_) {
    narrow = wo % lanes != 0;
    if (stride == 1) {
      hp = h + 2, wp = narrow ? w : w + 2;
      tap = narrow ? hp * wp : 1;
      plane = narrow ? 3 * hp * wp : hp * wp;
    } else {
      hp = ho + 1, wp = narrow ? wo : wo + 1;
      tap = hp * wp;
      plane = (narrow ? 6 : 4) * tap;
    }
    sample = c * plane;
    if (stride == 1) return;  // the tiles' offsets are compile-time constants (tap_offset)
    taps.count = 9;
    for (int r = 0; r < 3; ++r)
      for (int s = 0; s < 3; ++s) {
        const int t = r * 3 + s;
        const int p = (r + 1) % 2, q = (s + 1) % 2;  // the phases; the row is i - 1 at r = 0
        const int64_t row = r == 0 ? 0 : 1;
        taps.weight[t] = t;
        taps.offset[t] =
            narrow ? (3 * p + s) * tap + row * wp : (2 * p + q) * tap + row * wp + (s == 0 ? 0 : 1);
      }
  }
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
  static void deinterleave(const float* p, V& even, V& odd) {
    const V a = load(p), b = load(p + 16);
    even = _mm512_permutex2var_ps(
        a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
    odd = _mm512_permutex2var_ps(
        a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
  }
  static void interleave(V even, V odd, float* p) {
    store(p, _mm512_permutex2var_ps(
                 even, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                 odd));
    store(p + 16,
          _mm512_permutex2var_ps(
              even, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
              odd));
  }
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
  // shuffle_ps picks within 128-bit halves; permute4x64 then puts the 64-bit pairs in order.
  static void deinterleave(const float* p, V& even, V& odd) {
    const V a = load(p), b = load(p + 8);
    even = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                              _MM_SHUFFLE(3, 1, 2, 0)));
    odd = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))),
                              _MM_SHUFFLE(3, 1, 2, 0)));
  }
  static void interleave(V even, V odd, float* p) {
    const V lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    store(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    store(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
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

// How pack_weight reads the layer's weight [O, C, 3, 3]: as it is (the forward), with its
// channels swapped (the stride-2 backward-data, Note [Stride 2 in phases]), or swapped and its
// taps reversed (the stride-1 backward-data, a forward of dy: Note [dx as a convolution] in
// conv.cpp).
enum class Orientation : uint8_t { kForward, kSwapped, kFlipped };

// wp [T/B, S, 9, B] for a tile with T output and S input channels, B = Isa's out_block, from
// weight [T, S, 3, 3] (kForward) or [S, T, 3, 3].
template <typename Isa>
std::vector<float> pack_weight(const float* weight, int64_t o_count, int64_t c_count,
                               Orientation orientation) {
  constexpr int64_t b = Isa::Traits::out_block;
  std::vector<float> wp(static_cast<size_t>(o_count * c_count * 9));
  for (int64_t o = 0; o < o_count; ++o)
    for (int64_t c = 0; c < c_count; ++c)
      for (int64_t t = 0; t < 9; ++t)
        wp[((o / b * c_count + c) * 9 + t) * b + o % b] =
            orientation == Orientation::kForward   ? weight[(o * c_count + c) * 9 + t]
            : orientation == Orientation::kSwapped ? weight[(c * o_count + o) * 9 + t]
                                                   : weight[(c * o_count + o) * 9 + 8 - t];
  return wp;
}

// `size` zeros from the frame.
float* zeros(ScratchFrame& frame, int64_t size) {
  float* p = frame.get<float>(size);
  std::fill(p, p + size, 0.f);
  return p;
}

// The tiles' passes over a batch: each table's taps of the padded copies of `input` [N, C, H, W]
// (made by fill), with weights packed by pack_weight for s.o output channels. The threads split
// the batch, and take it in chunks of samples whose vectors the tiles run through as one
// sequence (several samples per chunk where images are small). out_at(buffer, n0, k, o, table)
// is where the pass of table `table` writes output channel o of sample n0 + k, out_plane floats
// from channel o + 1; buffer is the thread's own, buffer_per_sample floats per sample of a
// chunk; done(buffer, n0, count) follows each chunk.
template <typename Isa, Taps L, typename Fill, typename OutAt, typename Done>
void forward_tiles(const DirectShape& s, const Padded& pad, const TapTable* tables, int n_tables,
                   Fill fill, const float* input, const float* wp, int64_t out_plane,
                   int64_t buffer_per_sample, OutAt&& out_at, Done&& done) {
  using Vec = typename Isa::Traits;
  constexpr int64_t lanes = Vec::lanes;
  const int64_t p = pad.ho * pad.wo, per_sample = p / lanes;
  const int64_t chunk = std::max<int64_t>(1, kForwardPixels / p);
  parallel_for(0, s.n, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    const int64_t buffered = std::min(chunk, hi - lo);
    float* xp = zeros(frame, buffered * pad.sample);
    float* buffer = frame.get<float>(buffered * buffer_per_sample);
    const int64_t sample = pad.c * pad.h * pad.w;
    for (int64_t n0 = lo; n0 < hi; n0 += chunk) {
      const int64_t count = std::min(chunk, hi - n0), vectors = count * per_sample;
      fill(input + n0 * sample, count, pad, xp);
      for (int table = 0; table < n_tables; ++table)
        for (int64_t ob = 0; ob < s.o; ob += Vec::out_block) {
          const float* wb = wp + ob * pad.c * 9;
          int64_t v = 0;
          const auto tile = [&]<int R>() {
            int64_t in_at[R];
            float* at[R];
            for (int k = 0; k < R; ++k) {
              const int64_t n = (v + k) / per_sample, q = (v + k) % per_sample * lanes;
              in_at[k] = n * pad.sample + q / pad.wo * pad.wp + q % pad.wo;
              at[k] = out_at(buffer, n0, n, ob, table) + q;
            }
            Isa::template forward<R, L>(xp, wb, pad, tables[table], in_at, at, out_plane);
            v += R;
          };
          while (v + kPixelVectors <= vectors) tile.template operator()<kPixelVectors>();
          while (v < vectors) tile.template operator()<1>();
        }
      done(buffer, n0, count);
    }
  });
}

// y [N, O, ho, wo] = the direct convolution of x [N, C, H, W] with weights packed by
// pack_weight (kForward).
template <typename Isa>
void forward_packed(const DirectShape& s, const float* x, const float* wp, float* y) {
  const Padded pad(s.c, s.h, s.w, s.stride, Isa::Traits::lanes);
  const int64_t p = pad.ho * pad.wo;
  const auto out_at = [&](float*, int64_t n0, int64_t k, int64_t o, int) {
    return y + ((n0 + k) * s.o + o) * p;
  };
  const auto done = [](float*, int64_t, int64_t) {};
  if (s.stride == 2)
    forward_tiles<Isa, Taps::kTable>(s, pad, &pad.taps, 1, Isa::fill_phases, x, wp, p, 0, out_at,
                                     done);
  else if (pad.narrow)
    forward_tiles<Isa, Taps::kNarrow>(s, pad, &pad.taps, 1, Isa::fill, x, wp, p, 0, out_at, done);
  else
    forward_tiles<Isa, Taps::kWide>(s, pad, &pad.taps, 1, Isa::fill, x, wp, p, 0, out_at, done);
}

// dx [N, C, H, W] of a stride-2 layer from dy [N, O, H/2, W/2] and weights packed by pack_weight
// (kSwapped): the four phases of Note [Stride 2 in phases], each a pass of the tiles over dy's
// stride-1 padded copy into the thread's buffer [chunk, C, 4, H/2 W/2], then interleaved into
// dx's rows.
template <typename Isa>
void backward_data_in_phases(const DirectShape& s, const float* dy, const float* wq, float* dx) {
  const Padded pad(s.o, s.h / 2, s.w / 2, 1, Isa::Traits::lanes);
  // The taps (r, c) that land on phase (p, q) = ((r + 1) % 2, (c + 1) % 2), and the dy pixel
  // each reads for dx's (2a + p, 2b + q): (a + 1, b) where r = 0, (a, b) where r = 1 or 2; the
  // same for columns. In dy's padded copy, pixel (a, b) is at (a + 1, b + 1).
  TapTable tables[4];
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) {
      TapTable& table = tables[2 * ((r + 1) % 2) + (c + 1) % 2];
      const int64_t row = r == 0 ? 2 : 1, col = c == 0 ? 2 : 1;
      table.weight[table.count] = r * 3 + c;
      table.offset[table.count] = row * pad.wp + (pad.narrow ? col * pad.tap : col);
      ++table.count;
    }
  const int64_t p = pad.ho * pad.wo;
  const DirectShape tiles{.n = s.n, .c = s.o, .h = pad.ho, .w = pad.wo, .o = s.c};
  const auto out_at = [&](float* buffer, int64_t, int64_t k, int64_t c, int table) {
    return buffer + ((k * s.c + c) * 4 + table) * p;
  };
  const auto done = [&](float* buffer, int64_t n0, int64_t count) {
    Isa::interleave(buffer, count, s.c, pad.ho, pad.wo, dx + n0 * s.c * 4 * p);
  };
  forward_tiles<Isa, Taps::kTable>(tiles, pad, tables, 4, Isa::fill, dy, wq, 4 * p, s.c * 4 * p,
                                   out_at, done);
}

// dweight [O, C, 3, 3]: the threads split the batch into parts, each summing its lanes' partial
// sums; the lanes and parts are added at the end.
template <typename Isa>
void backward_weight(const DirectShape& s, const float* x, const float* dy, float* dweight) {
  constexpr int64_t lanes = Isa::Traits::lanes, grad_out = Isa::Traits::grad_out;
  const Padded pad(s.c, s.h, s.w, s.stride, lanes);
  const int64_t p = pad.ho * pad.wo, taps = s.o * s.c * 9;
  const int64_t parts = std::clamp<int64_t>(get_num_threads(), 1, s.n);
  const int64_t chunk =
      std::clamp<int64_t>((kGradPixels + p - 1) / p, 1, (s.n + parts - 1) / parts);
  std::vector<float> partial(static_cast<size_t>(parts * taps * lanes), 0.f);  // [O, C, 9, L]
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame frame;
    float* xp = zeros(frame, chunk * pad.sample);
    const auto weight_tile = s.stride == 2 ? Isa::template weight<Taps::kTable>
                             : pad.narrow  ? Isa::template weight<Taps::kNarrow>
                                           : Isa::template weight<Taps::kWide>;
    const auto fill = s.stride == 2 ? Isa::fill_phases : Isa::fill;
    for (int64_t part = lo; part < hi; ++part) {
      float* acc = partial.data() + part * taps * lanes;
      const int64_t n_end = s.n * (part + 1) / parts;
      const int64_t sample = s.c * s.h * s.w;
      for (int64_t n0 = s.n * part / parts; n0 < n_end; n0 += chunk) {
        const int64_t count = std::min(chunk, n_end - n0);
        fill(x + n0 * sample, count, pad, xp);
        const float* d = dy + n0 * s.o * p;
        for (int64_t o = 0; o < s.o; o += grad_out)
          for (int64_t c = 0; c < s.c; c += 2)
            for (int r = 0; r < 3; ++r)
              weight_tile(d + o * p, s.o * p, xp + c * pad.plane, pad, pad.taps, count, r,
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
             " here (they need AVX2 and FMA; stride 1, or 2 with H and W even; the output's W a "
             "multiple of the vector width (",
             lanes > 0 ? lanes : 8,
             " floats here), or with AVX-512 a divisor of it with its H W a multiple; C and O "
             "multiples of 8 and at most ",
             kDirectMaxChannels, ")");
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const DirectShape& s) {
  os << "x=[" << s.n << ", " << s.c << ", " << s.h << ", " << s.w << "] weight=[" << s.o << ", "
     << s.c << ", 3, 3]";
  if (s.stride != 1) os << " stride " << s.stride;
  return os;
}

bool direct_conv3x3_fits(const DirectShape& s) {
  const int64_t lanes = lanes_here();
  if (lanes == 0 || s.n < 1 || s.h < 1 || s.w < 1) return false;
  if (s.stride != 1 && (s.stride != 2 || s.h % 2 != 0 || s.w % 2 != 0)) return false;
  const int64_t ho = s.h / s.stride, wo = s.w / s.stride;
  const bool wide = wo % lanes == 0;
  const bool narrow = lanes == 16 && wo >= 2 && lanes % wo == 0 && ho * wo % lanes == 0;
  return (wide || narrow) && s.c >= 8 && s.c % 8 == 0 && s.c <= kDirectMaxChannels && s.o >= 8 &&
         s.o % 8 == 0 && s.o <= kDirectMaxChannels;
}

bool direct_conv3x3_pays(const DirectShape& s, bool backward) {
  if (!direct_conv3x3_fits(s) || lanes_here() != 16) return false;
  if (s.stride == 1) return true;
  // Stride 2, 2 threads, batch 128, against the packed engine (paired medians): 16 -> 32 at 32 x
  // 32 in 0.77 of its time forward and 0.89 backward-data; on narrow rows (32 -> 64 at 16 x 16,
  // 64 -> 128 at 8 x 8) 0.88-0.90 forward but 1.05-1.09 backward-data; 64 -> 128 at 32 x 32,
  // 1.16 and 1.21, its planes and weights past L1 and L2.
  const bool wide = s.w / 2 % 16 == 0;
  return wide ? s.c * s.o <= 32 * 32 : !backward;
}

bool direct_weight_grad_pays(const DirectShape& s) {
  const int64_t lanes = lanes_here();
  return lanes > 0 && s.w / s.stride % lanes == 0 && s.o * s.c <= 32 * 32;
}

void direct_conv3x3(const DirectShape& s, const float* x, const float* weight, float* y) {
  check(s, "direct_conv3x3");
  with_tiles([&]<typename Isa>() {
    const std::vector<float> wp = pack_weight<Isa>(weight, s.o, s.c, Orientation::kForward);
    forward_packed<Isa>(s, x, wp.data(), y);
  });
}

void direct_conv3x3_backward_data(const DirectShape& s, const float* dy, const float* weight,
                                  float* dx) {
  check(s, "direct_conv3x3_backward_data");
  with_tiles([&]<typename Isa>() {
    if (s.stride == 2) {
      const std::vector<float> wq = pack_weight<Isa>(weight, s.c, s.o, Orientation::kSwapped);
      backward_data_in_phases<Isa>(s, dy, wq.data(), dx);
      return;
    }
    const std::vector<float> wp = pack_weight<Isa>(weight, s.c, s.o, Orientation::kFlipped);
    forward_packed<Isa>({.n = s.n, .c = s.o, .h = s.h, .w = s.w, .o = s.c}, dy, wp.data(), dx);
  });
}

void direct_conv3x3_backward_weight(const DirectShape& s, const float* x, const float* dy,
                                    float* dweight) {
  check(s, "direct_conv3x3_backward_weight");
  with_tiles([&]<typename Isa>() { backward_weight<Isa>(s, x, dy, dweight); });
}

}  // namespace loom::cpu
