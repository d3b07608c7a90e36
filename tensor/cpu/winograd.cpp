// tensor/cpu/winograd.cpp — Winograd convolution F(2x2,3x3) and F(4x4,3x3) on the CPU: forward,
// backward-data and backward-weight as small tile transforms around one GEMM per frequency
// (cpu::gemm), tiles taken in blocks so that the scratch memory does not grow with the batch.
// The algorithm is Note [Winograd convolution]; the matrices Note [Winograd transforms].

#include "tensor/cpu/winograd.h"

#include <algorithm>
#include <ostream>
#include <utility>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/packed_gemm.h"
#include "tensor/cpu/scratch.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace loom::cpu {

// Note [Winograd convolution]
//   Legend: N batch, C in channels, K out channels, H x W input, Ho x Wo output, m x m output
//   tile, a = m + 2 the input tile's side, T the number of tiles (N ceil(Ho/m) ceil(Wo/m)), f
//   one of the a^2 "frequencies" (positions in a transformed tile).
//
//   One dimension first. m outputs of a 3-tap correlation, y_i = sum_r d_{i+r} g_r, take 3m
//   multiplies directly; Winograd's minimal filtering F(m, 3) takes m + 2 = a:
//       y = A^T [ (G g) ⊙ (B^T d) ]        d: a inputs, g: 3 taps, y: m outputs
//   G g evaluates the filter's polynomial at a points, B^T d does the same for the data (in the
//   transposed, correlation form), ⊙ multiplies point by point (the only multiplies that involve
//   both) and A^T interpolates back. Nested in both dimensions it gives the 2-D tile
//       Y = A^T [ (G g G^T) ⊙ (B^T d B) ] A       d: a x a, g: 3 x 3, Y: m x m
//   with a^2 multiplies for m^2 outputs where the direct loop takes 9 m^2:
//       F(2x2,3x3): 16 multiplies for 4 outputs instead of 36, 2.25x fewer;
//       F(4x4,3x3): 36 multiplies for 16 outputs instead of 144, 4x fewer.
//   Input tiles overlap by 2 rows and columns (the kernel's halo); edge tiles read zeros past
//   the image and drop the outputs past Ho x Wo.
//
//   Summed over the input channels the products become GEMMs. With U = G g G^T per (k, c) and
//   V = B^T d B per (c, tile), output tile t of channel k is A^T [ sum_c U[k,c] ⊙ V[c,t] ] A,
//   and for one frequency f the sum over c is a matrix product:
//       M_f [K x T] = U_f [K x C] @ V_f [C x T]          (a^2 GEMMs, one per frequency)
//   The conv is then: transform the weights (once), transform the input tiles, a^2 GEMMs,
//   transform the outputs back. The GEMMs carry the multiplies, a^2 K C T against the direct
//   9 m^2 K C T: that ratio is the saving. The transforms are O(a^3) adds per tile and channel,
//   paid once per C or per K rather than per K C pair, so they shrink next to the GEMMs as the
//   channels grow. The saving is in arithmetic, not in memory: V and M hold a^2/m^2 times the
//   elements of x and y (4x for F2, 2.25x for F4), hence Note [Winograd blocks and threads].
//   Measured on one thread, batch 64, F4: at 64 channels and 32x32 the transforms take about
//   half the time (input 16 ms, output 13 ms, GEMMs 25 ms); at 512 channels and 4x4 it is the
//   weight transform, since U is 4x the weight (9 ms, GEMMs 20 ms, the tiles 7 ms).
//
//   The price is accuracy. The transforms add and subtract values scaled by up to 8 (A^T of
//   F4), and float32 rounds every intermediate, so errors grow with the tile. Measured in
//   max |error| / max |output| against float64 (tests/tensor/winograd_test.cpp, N(0,1) data):
//   F(2x2,3x3) at most 8.4e-7, beside 6.2e-7 for loom's float32 conv2d; F(4x4,3x3) at most
//   3.8e-6, about 6x the direct error (Note [Winograd transforms] says how the points keep it
//   that small). F(6x6,3x3) and larger are not offered: they need more points, whose powers in
//   A^T and B^T grow fast, and Barabasz et al. (cited below) show the error bound growing
//   exponentially with the tile.

// Note [Winograd transforms]
//   The matrices are Toom-Cook interpolation at a - 1 points p_j and infinity: G [a x 3]
//   evaluates the filter, G[j][r] = p_j^r / f_j; A^T [m x a] is the transposed Vandermonde of
//   the outputs, A^T[i][j] = p_j^i; B^T [a x a] is the transposed inverse of the a x a
//   Vandermonde, its rows multiplied by the f_j = prod_{l != j} (p_j - p_l) that divide G's
//   (so that B^T, applied to every tile, gets simple entries). The point at infinity takes the
//   leading coefficients (the last row of G and B^T, the last column of A^T). Every B^T and A^T
//   entry below is exact in float32; only G, applied once per weight, has inexact ones (1/3, 1/15).
//   F(2x2,3x3) uses {0, 1, -1, inf} (Lavin and Gray's matrices): entries 0, ±1 and ±1/2.
//   F(4x4,3x3) needs five finite points, and the choice matters. The textbook {0, ±1, ±2}
//   (Lavin and Gray) puts 8 and 4 in A^T and 5 in B^T; {0, ±1, ±1/2} moves the large entries
//   into G (8/3, 4) and does no better. The mixed set {0, 1, -1, 1/2, -2} balances them, as
//   Barabasz et al. found ("Error analysis and improving the accuracy of Winograd convolution
//   for deep neural networks", ACM TOMS 2020). Measured on single 6x6 tiles summed over 64
//   channels of N(0,1) data and weights, float32, the mean over 400 draws of max |error| / max
//   |output| against float64:
//       {0, ±1, ±2, inf}        2.3e-6          {0, ±1, 1/2, -2, inf}   1.3e-6  (used here)
//       {0, ±1, ±1/2, inf}      2.3e-6          direct float32 loop     5.2e-7
//   In these kernels, on the shapes of tests/tensor/winograd_test.cpp over 8 seeds, the worst
//   error of the three passes is 3.8e-6 with these points and 1.1e-5 with {0, ±1, ±2}: the
//   choice cuts F(4x4)'s error about 3x.

// Note [Winograd backward passes]
//   The forward is linear in x and in the weight, a chain of maps: gather the tiles of x (zeros
//   outside), V = B^T d B, M_f = U_f @ V_f (the GEMMs), Y = A^T M A, keep the first Ho x Wo.
//   A backward runs the adjoints of these maps in reverse, so it needs the forward's transforms
//   transposed:
//   - backward-data: dM = A dY A^T per tile of dy (zeros past Ho x Wo), then the GEMMs
//     dV_f [C x T] = U_f^T @ dM_f [K x T], then B dV B^T per tile, overlap-added into dx (the
//     tiles overlap, so neighbours' halos add; what falls in the padding is dropped). It uses U,
//     the forward's weight transform, unchanged. (The other way, a forward Winograd conv of dy
//     with the weight rotated 180° and K, C swapped at padding 2 - pad, as Note [dx as a
//     convolution] in conv.cpp does for the GEMM path, would transform the rotated weight
//     instead; the adjoint was chosen because it shares U and the forward's tile grid.)
//   - backward-weight: dU_f [K x C] = sum over tiles of dM_f [K x T] @ V_f^T [T x C], a GEMM
//     whose inner dimension is the tiles, accumulated over the blocks; then dweight = G^T dU G
//     per (k, c). V is the forward's input transform and dM the backward-data's dy transform.
//   So the six transforms are three matrices and their transposes, all one routine (sandwich):
//       forward   x: B^T . B      weight: G . G^T       y: A^T . A
//       backward dx: B . B^T     dweight: G^T . G      dy: A . A^T

// Note [Winograd blocks and threads]
//   T grows with the batch, and with it V [a^2, C, T] and M [a^2, K, T]. So tiles go in blocks
//   of Tb, each transformed, multiplied and transformed back before the next. Tb is chosen for
//   about 4 MiB of V and M, kept between 128 and 512 tiles (single-threaded sweeps of 64 to 512
//   on the ResNet-18 layers moved the time by about 10% either way, within the machine's noise).
//   The buffers are frequency-major: V_f is a row-major [C x Tb] matrix, so each GEMM reads
//   plain matrices. A group of kLanes tiles is transformed with the tiles in the innermost
//   (SIMD) dimension and leaves as kLanes contiguous floats per frequency.
//   Threads, like conv2d's (Note [conv2d on the CPU]): with at least as many images as threads,
//   the batch is cut into one part of whole images per thread, and each thread runs the blocks
//   of its part alone, on its own V and M: its transforms, and its GEMMs single-threaded
//   (cpu::gemm and parallel_for stay on one thread inside a parallel region). That is one
//   parallel region per call instead of three per block: with several per block, a machine
//   shared with another process made every barrier wait for a descheduled thread, and one call
//   took 10x its time. Parts hold whole images, so the backward-data's overlap-add never writes
//   another thread's pixels. The backward-weight's parts each sum their own dU, added at the
//   end; where those copies (a^2 K C floats per part) would pass kMaxPartialFloats, one part
//   takes all the tiles instead.
//   With fewer images than threads there is one part, and each step of a block runs parallel:
//   the transforms over (channel, group of tiles) (the overlap-add over channels only), the
//   GEMMs over the frequencies, each on one thread: 16 or 36 equal products.
//   Scratch: U (or dU) a^2 K C floats, plus a^2 (C + K) Tb per part; none of it grows with N.

// Note [Winograd in channels-last]
//   In NHWC the channels of a pixel are contiguous and a plane is strided, so the transforms
//   turn the other way: a group's kLanes lanes are kLanes consecutive channels of one tile
//   (gathered as kLanes contiguous floats per pixel), not one channel of kLanes tiles. The
//   buffers follow: V_f is [Tb x C] and M_f [Tb x K], tile-major, so a group still leaves as
//   kLanes contiguous floats per frequency, and the GEMMs are the NCHW ones transposed:
//       forward          M_f [Tb x K]  = V_f [Tb x C] @ U_f^T
//       backward-data   dV_f [Tb x C]  = dM_f [Tb x K] @ U_f
//       backward-weight dU_f [K x C]  += dM_f^T @ V_f
//   The results match NCHW's up to float32 rounding (the GEMMs block their sums differently);
//   tests/tensor/winograd_test.cpp checks both layouts against float64. The overlap-add of dx
//   takes whole channel groups per thread, as NCHW takes whole channels. Layers whose channel
//   count is not a multiple of kLanes run a last group with fewer lanes. This spares conv2d the
//   two NCHW copies per call that a channels-last Winograd layer otherwise costs.

std::ostream& operator<<(std::ostream& os, const WinogradShape& s) {
  return os << "x=[" << s.n << ", " << s.c << ", " << s.h << ", " << s.w << "] weight=[" << s.k
            << ", " << s.c << ", 3, 3] padding=(" << s.pad_h << ", " << s.pad_w << ")"
            << (s.channels_last ? " channels-last" : "");
}

namespace {

constexpr int kLanes = 8;  // tiles (or weight pairs) transformed together, one per SIMD lane
constexpr int64_t kBlockFloats = int64_t{1} << 20;  // V and M of one block: 4 MiB
constexpr int64_t kMinBlock = 128, kMaxBlock = 512;
constexpr int64_t kMaxPartialFloats = int64_t{1} << 24;  // the parts' copies of dU: 64 MiB

template <int Rows, int Cols>
struct Matrix {
  static constexpr int rows = Rows, cols = Cols;
  float v[Rows][Cols];
};

template <int Rows, int Cols>
constexpr Matrix<Cols, Rows> transpose(const Matrix<Rows, Cols>& m) {
  Matrix<Cols, Rows> t{};
  for (int i = 0; i < Rows; ++i)
    for (int j = 0; j < Cols; ++j) t.v[j][i] = m.v[i][j];
  return t;
}

// The matrices of Note [Winograd transforms], bt = B^T, g = G, at = A^T, for output tiles of
// side m and input tiles of side a.
template <int M, int A>
struct Transforms {
  static constexpr int m = M, a = A, aa = A * A;
};

struct F2x2 : Transforms<2, 4> {                    // points {0, 1, -1, inf}
  static constexpr Matrix<4, 4> bt{{{1, 0, -1, 0},  //
                                    {0, 1, 1, 0},
                                    {0, -1, 1, 0},
                                    {0, 1, 0, -1}}};
  static constexpr Matrix<4, 3> g{{{1, 0, 0},  //
                                   {0.5f, 0.5f, 0.5f},
                                   {0.5f, -0.5f, 0.5f},
                                   {0, 0, 1}}};
  static constexpr Matrix<2, 4> at{{{1, 1, 1, 0},  //
                                    {0, 1, -1, -1}}};
};

struct F4x4 : Transforms<4, 6> {  // points {0, 1, -1, 1/2, -2, inf}
  static constexpr Matrix<6, 6> bt{{{1, -1.5f, -2, 1.5f, 1, 0},
                                    {0, -1, 0.5f, 2.5f, 1, 0},
                                    {0, 1, -2.5f, 0.5f, 1, 0},
                                    {0, -2, -1, 2, 1, 0},
                                    {0, 0.5f, -1, -0.5f, 1, 0},
                                    {0, 1, -1.5f, -2, 1.5f, 1}}};
  static constexpr Matrix<6, 3> g{{{1, 0, 0},
                                   {1.f / 3, 1.f / 3, 1.f / 3},
                                   {-1.f / 3, 1.f / 3, -1.f / 3},
                                   {-16.f / 15, -8.f / 15, -4.f / 15},
                                   {1.f / 15, -2.f / 15, 4.f / 15},
                                   {0, 0, 1}}};
  static constexpr Matrix<4, 6> at{{{1, 1, 1, 1, 1, 0},
                                    {0, 1, -1, 0.5f, -2, 0},
                                    {0, 1, 1, 0.25f, 4, 0},
                                    {0, 1, -1, 0.125f, -8, 1}}};
};

// Their transposes, for the backward passes (Note [Winograd backward passes]).
template <class F>
struct Adjoints {
  static constexpr auto b = transpose(F::bt);  // [a x a]
  static constexpr auto gt = transpose(F::g);  // [3 x a]
  static constexpr auto a = transpose(F::at);  // [a x m]
};

// Calls fn.template operator()<i>() for i = 0 .. n-1, i a compile-time constant.
template <int N, typename Fn>
[[gnu::always_inline]] inline void unroll(Fn&& fn) {
  [&]<int... i>(std::integer_sequence<int, i...>) { (fn.template operator()<i>(), ...); }
  (std::make_integer_sequence<int, N>{});
}

// dst[l] = sum_q mat[i][q] src[q stride + l] over the kLanes lanes. The matrix is a template
// argument, so its entries are constants: zero ones are dropped here, and the compiler turns
// multiplies by ±1 into copies and negations.
template <auto mat, int i>
[[gnu::always_inline]] inline void combine(const float* src, int64_t stride, float* dst) {
  constexpr int Q = decltype(mat)::cols;
  constexpr int first = [] {
    int q = 0;
    while (q < Q && mat.v[i][q] == 0.0f) ++q;
    return q;
  }();
  if constexpr (first == Q) {
    for (int l = 0; l < kLanes; ++l) dst[l] = 0.0f;
  } else {
    for (int l = 0; l < kLanes; ++l) dst[l] = mat.v[i][first] * src[first * stride + l];
    unroll<Q>([&]<int q>() {
      if constexpr (q > first && mat.v[i][q] != 0.0f)
        for (int l = 0; l < kLanes; ++l) dst[l] += mat.v[i][q] * src[q * stride + l];
    });
  }
}

// out [P][P][kLanes] = mat in mat^T for kLanes matrices in [Q][Q][kLanes] at once, mat [P x Q]:
// the one routine behind all six transforms (Note [Winograd backward passes]).
template <auto mat>
[[gnu::always_inline]] inline void sandwich(const float* in, float* out) {
  constexpr int P = decltype(mat)::rows, Q = decltype(mat)::cols;
  float rows[P][Q][kLanes];  // mat in
  unroll<P>([&]<int i>() {
    for (int j = 0; j < Q; ++j) combine<mat, i>(in + j * kLanes, Q * kLanes, rows[i][j]);
  });
  unroll<P>([&]<int j>() {
    for (int i = 0; i < P; ++i) combine<mat, j>(rows[i][0], kLanes, out + (i * P + j) * kLanes);
  });
}

// The tile grid and the block size of one call (Note [Winograd blocks and threads]).
struct Plan {
  int64_t m;       // output tile side
  int64_t ho, wo;  // output
  int64_t tiles_w, tiles_per_image, tiles;
  int64_t block;  // tiles per block
};

Plan make_plan(const WinogradShape& s, int64_t m, int64_t aa, int64_t requested_block) {
  Plan p;
  p.m = m, p.ho = s.ho(), p.wo = s.wo();
  p.tiles_w = (p.wo + m - 1) / m;
  p.tiles_per_image = (p.ho + m - 1) / m * p.tiles_w;
  p.tiles = s.n * p.tiles_per_image;
  int64_t block = requested_block;
  if (block == 0)
    block = std::clamp(kBlockFloats / (aa * (s.c + s.k)) / 16 * 16, kMinBlock, kMaxBlock);
  p.block = std::max<int64_t>(1, std::min(block, p.tiles));
  return p;
}

// The image of a tile and its top-left output pixel.
struct TilePosition {
  int64_t image, row, col;
};

// at[0, count) = the positions of tiles [first, first + count), row-major within each image;
// once per block, rather than two divisions per tile in every channel's gather.
void locate_tiles(const Plan& p, int64_t first, int64_t count, TilePosition* at) {
  const int64_t in_image = first % p.tiles_per_image;
  TilePosition next{first / p.tiles_per_image, in_image / p.tiles_w * p.m,
                    in_image % p.tiles_w * p.m};
  for (int64_t t = 0; t < count; ++t) {
    at[t] = next;
    next.col += p.m;
    if (next.col >= p.wo) next.col = 0, next.row += p.m;
    if (next.row >= p.ho) next.row = 0, ++next.image;
  }
}

// A stack of [channels, height, width] planes, one stack per image (x, y, dx or dy).
template <typename T>
struct Planes {
  T* data;
  int64_t channels, height, width;
  T* plane(int64_t image, int64_t channel) const {
    return data + (image * channels + channel) * height * width;
  }
};

// Note [Moving tiles with transposes]
//   The transforms take kLanes = 8 tiles at once, one per lane: a tile's Side x Side window is
//   [Side][Side][kLanes], so the values of one tile are kLanes floats apart, while in the image
//   a window row is Side consecutive floats. Moved one float at a time (and, for a window that
//   crosses the image's edge, zeroed first and copied within computed bounds), the gathers and
//   scatters took as long as the transforms' arithmetic: at 4 x 4 images, where every window
//   crosses the edge, more. With AVX2 (where the baseline has it, as the packed GEMM's kernels
//   need), gather_tiles loads each lane's window row as one masked vector (the columns outside
//   the image, and past Side, masked off and read as zeros) and transposes the 8 lanes' rows in
//   registers (transpose_8x8 in packed_gemm.h), so that column j of the result is the window's
//   element j of all 8 tiles; scatter_tiles does the reverse with masked stores. Where it adds
//   into the planes (the backward-data's overlapping windows) it stays scalar: a masked load that
//   overlaps a recent masked store (the next row of a narrow image, the next tile's window) waits
//   for the store to leave the core, and that ran slower than the scalar adds. They move the
//   same values, so the results are the scalar loops' to the bit.
#if LOOM_PACKED_GEMM_SIMD  // AVX2 and FMA in the baseline: transpose_8x8 (packed_gemm.h)
// The columns j of a window starting at column c0 that a masked load or store may touch: j <
// Side and c0 + j inside [0, width).
template <int Side>
__m256i window_columns(int64_t c0, int64_t width) {
  const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i c = _mm256_add_epi32(j, _mm256_set1_epi32(static_cast<int>(c0)));
  const __m256i inside =
      _mm256_and_si256(_mm256_cmpgt_epi32(c, _mm256_set1_epi32(-1)),
                       _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width)), c));
  return _mm256_and_si256(inside, _mm256_cmpgt_epi32(_mm256_set1_epi32(Side), j));
}
#endif

// tiles [Side][Side][kLanes]: lane l holds the Side x Side window of channel `channel` of tile
// at[l]'s image, its top-left at the tile's pixel + offset; zeros outside the plane and in the
// lanes from `lanes` on (Note [Moving tiles with transposes]).
template <int Side>
void gather_tiles(const TilePosition* at, const Planes<const float>& src, int64_t channel,
                  int64_t offset_h, int64_t offset_w, int lanes, float* tiles) {
#if LOOM_PACKED_GEMM_SIMD
  static_assert(kLanes == 8 && Side <= 8);
  const float* origin[kLanes];  // where the lane's window row 0 would start
  int64_t r0[kLanes];
  __m256i columns[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    if (l >= lanes) {
      origin[l] = nullptr, r0[l] = 0, columns[l] = _mm256_setzero_si256();
      continue;
    }
    const int64_t c0 = at[l].col + offset_w;
    r0[l] = at[l].row + offset_h;
    origin[l] = src.plane(at[l].image, channel) + c0;  // only columns inside are read
    columns[l] = window_columns<Side>(c0, src.width);
  }
  for (int i = 0; i < Side; ++i) {
    __m256 rows[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const int64_t r = r0[l] + i;
      rows[l] = origin[l] != nullptr && r >= 0 && r < src.height
                    ? _mm256_maskload_ps(origin[l] + r * src.width, columns[l])
                    : _mm256_setzero_ps();
    }
    transpose_8x8(rows);
    for (int j = 0; j < Side; ++j) _mm256_storeu_ps(tiles + (i * Side + j) * kLanes, rows[j]);
  }
#else
  for (int l = 0; l < kLanes; ++l) {
    if (l >= lanes) {
      for (int e = 0; e < Side * Side; ++e) tiles[e * kLanes + l] = 0.0f;
      continue;
    }
    const float* plane = src.plane(at[l].image, channel);
    const int64_t r0 = at[l].row + offset_h, c0 = at[l].col + offset_w;
    for (int i = 0; i < Side; ++i)
      for (int j = 0; j < Side; ++j) {
        const int64_t r = r0 + i, c = c0 + j;
        const bool inside = r >= 0 && r < src.height && c >= 0 && c < src.width;
        tiles[(i * Side + j) * kLanes + l] = inside ? plane[r * src.width + c] : 0.0f;
      }
  }
#endif
}

// The reverse of gather_tiles for the first `lanes` lanes: written (or, with kAdd, added) into
// the planes, what falls outside them dropped.
template <int Side, bool kAdd>
void scatter_tiles(const TilePosition* at, const Planes<float>& dst, int64_t channel,
                   int64_t offset_h, int64_t offset_w, int lanes, const float* tiles) {
#if LOOM_PACKED_GEMM_SIMD
  if constexpr (!kAdd) {
    static_assert(kLanes == 8 && Side <= 8);
    __m256 rows[Side][kLanes];  // [i][l]: lane l's window row i
    for (int i = 0; i < Side; ++i) {
      for (int j = 0; j < kLanes; ++j)
        rows[i][j] =
            j < Side ? _mm256_loadu_ps(tiles + (i * Side + j) * kLanes) : _mm256_setzero_ps();
      transpose_8x8(rows[i]);
    }
    for (int l = 0; l < lanes; ++l) {
      const int64_t r0 = at[l].row + offset_h, c0 = at[l].col + offset_w;
      float* origin = dst.plane(at[l].image, channel) + c0;  // only columns inside are written
      const __m256i columns = window_columns<Side>(c0, dst.width);
      for (int i = 0; i < Side; ++i) {
        const int64_t r = r0 + i;
        if (r >= 0 && r < dst.height)
          _mm256_maskstore_ps(origin + r * dst.width, columns, rows[i][l]);
      }
    }
    return;
  }
#endif
  for (int l = 0; l < lanes; ++l) {
    float* plane = dst.plane(at[l].image, channel);
    const int64_t r0 = at[l].row + offset_h, c0 = at[l].col + offset_w;
    const int64_t i_lo = std::max<int64_t>(0, -r0), i_hi = std::min<int64_t>(Side, dst.height - r0);
    const int64_t j_lo = std::max<int64_t>(0, -c0), j_hi = std::min<int64_t>(Side, dst.width - c0);
    for (int64_t i = i_lo; i < i_hi; ++i) {
      float* row = plane + (r0 + i) * dst.width + c0;
      for (int64_t j = j_lo; j < j_hi; ++j) {
        const float value = tiles[(i * Side + j) * kLanes + l];
        if constexpr (kAdd)
          row[j] += value;
        else
          row[j] = value;
      }
    }
  }
}

// A dense NHWC batch of images (x, y, dx or dy): pixel (image, row, col) holds `channels`
// contiguous floats.
template <typename T>
struct Pixels {
  T* data;
  int64_t channels, height, width;
  T* pixel(int64_t image, int64_t row, int64_t col) const {
    return data + ((image * height + row) * width + col) * channels;
  }
};

// tiles [Side][Side][kLanes]: lane l holds channel first + l of the Side x Side window of the
// tile at `at`, its top-left at the tile's pixel + offset; zeros outside the image and in the
// lanes from `lanes` on (Note [Winograd in channels-last]).
template <int Side>
void gather_channels(const TilePosition& at, const Pixels<const float>& src, int64_t first,
                     int64_t offset_h, int64_t offset_w, int lanes, float* tiles) {
  const int64_t r0 = at.row + offset_h, c0 = at.col + offset_w;
  for (int i = 0; i < Side; ++i) {
    for (int j = 0; j < Side; ++j) {
      float* lane = tiles + (i * Side + j) * kLanes;
      const int64_t r = r0 + i, c = c0 + j;
      if (r < 0 || r >= src.height || c < 0 || c >= src.width) {
        for (int l = 0; l < kLanes; ++l) lane[l] = 0.0f;
        continue;
      }
      const float* p = src.pixel(at.image, r, c) + first;
      if (lanes == kLanes) {
        for (int l = 0; l < kLanes; ++l) lane[l] = p[l];
      } else {
        for (int l = 0; l < kLanes; ++l) lane[l] = l < lanes ? p[l] : 0.0f;
      }
    }
  }
}

// The reverse of gather_channels for the first `lanes` lanes: written (or, with kAdd, added)
// into the pixels, what falls outside the image dropped.
template <int Side, bool kAdd>
void scatter_channels(const TilePosition& at, const Pixels<float>& dst, int64_t first,
                      int64_t offset_h, int64_t offset_w, int lanes, const float* tiles) {
  const int64_t r0 = at.row + offset_h, c0 = at.col + offset_w;
  for (int i = 0; i < Side; ++i) {
    const int64_t r = r0 + i;
    if (r < 0 || r >= dst.height) continue;
    for (int j = 0; j < Side; ++j) {
      const int64_t c = c0 + j;
      if (c < 0 || c >= dst.width) continue;
      const float* lane = tiles + (i * Side + j) * kLanes;
      float* p = dst.pixel(at.image, r, c) + first;
      for (int l = 0; l < lanes; ++l) {
        if constexpr (kAdd)
          p[l] += lane[l];
        else
          p[l] = lane[l];
      }
    }
  }
}

// Frequency-major buffers [a^2][rows][ld]: lanes [first, first + lanes) of row `row`, to and
// from a [a^2][kLanes] group (unused lanes of a loaded group are zero). A full group moves as
// one fixed-size copy per frequency: a variable-length std::copy is a memmove call, which cost
// as much as the GEMMs.
void store_group(const float* group, int64_t aa, int lanes, float* buffer, int64_t rows, int64_t ld,
                 int64_t row, int64_t first) {
  for (int64_t f = 0; f < aa; ++f) {
    const float* src = group + f * kLanes;
    float* dst = buffer + (f * rows + row) * ld + first;
    if (lanes == kLanes) {
      for (int l = 0; l < kLanes; ++l) dst[l] = src[l];
    } else {
      for (int l = 0; l < lanes; ++l) dst[l] = src[l];
    }
  }
}

void load_group(const float* buffer, int64_t rows, int64_t ld, int64_t row, int64_t first,
                int64_t aa, int lanes, float* group) {
  for (int64_t f = 0; f < aa; ++f) {
    const float* src = buffer + (f * rows + row) * ld + first;
    float* dst = group + f * kLanes;
    if (lanes == kLanes) {
      for (int l = 0; l < kLanes; ++l) dst[l] = src[l];
    } else {
      for (int l = 0; l < kLanes; ++l) dst[l] = l < lanes ? src[l] : 0.0f;
    }
  }
}

int lanes_from(int64_t first, int64_t count) {
  return static_cast<int>(std::min<int64_t>(kLanes, count - first));
}

int64_t groups_of(int64_t count) { return (count + kLanes - 1) / kLanes; }

// ------------------------------------------------------------------ the transforms

// u [a^2][K][C] = G w G^T for every (k, c) pair of weight [K, C, 3, 3].
template <class F>
void transform_weight(const WinogradShape& s, const float* weight, float* u) {
  const int64_t pairs = s.k * s.c;
  parallel_for(0, groups_of(pairs), grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float taps[9 * kLanes], out[F::aa * kLanes];
    for (int64_t group = lo; group < hi; ++group) {
      const int64_t first = group * kLanes;
      const int lanes = lanes_from(first, pairs);
      for (int l = 0; l < kLanes; ++l)
        for (int e = 0; e < 9; ++e)
          taps[e * kLanes + l] = l < lanes ? weight[(first + l) * 9 + e] : 0;
      sandwich<F::g>(taps, out);
      store_group(out, F::aa, lanes, u, 1, pairs, 0, first);
    }
  });
}

// dweight [K, C, 3, 3] = G^T dU G for every (k, c) pair of du [a^2][K][C].
template <class F>
void inverse_transform_weight(const WinogradShape& s, const float* du, float* dweight) {
  const int64_t pairs = s.k * s.c;
  parallel_for(0, groups_of(pairs), grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float group_in[F::aa * kLanes], taps[9 * kLanes];
    for (int64_t group = lo; group < hi; ++group) {
      const int64_t first = group * kLanes;
      const int lanes = lanes_from(first, pairs);
      load_group(du, 1, pairs, 0, first, F::aa, lanes, group_in);
      sandwich<Adjoints<F>::gt>(group_in, taps);
      for (int l = 0; l < lanes; ++l)
        for (int e = 0; e < 9; ++e) dweight[(first + l) * 9 + e] = taps[e * kLanes + l];
    }
  });
}

// v [a^2][C][block] (channels-last: [a^2][block][C]) = B^T d B for the count input tiles of x
// at at[0, count).
template <class F>
void transform_input(const WinogradShape& s, const Plan& p, const float* x, const TilePosition* at,
                     int64_t count, float* v) {
  if (s.channels_last) {
    const Pixels<const float> pixels{x, s.c, s.h, s.w};
    const int64_t groups = groups_of(s.c);
    parallel_for(0, count * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
      float tiles[F::aa * kLanes], out[F::aa * kLanes];
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t t = unit / groups, first = unit % groups * kLanes;
        const int lanes = lanes_from(first, s.c);
        gather_channels<F::a>(at[t], pixels, first, -s.pad_h, -s.pad_w, lanes, tiles);
        sandwich<F::bt>(tiles, out);
        store_group(out, F::aa, lanes, v, p.block, s.c, t, first);
      }
    });
    return;
  }
  const Planes<const float> planes{x, s.c, s.h, s.w};
  const int64_t groups = groups_of(count);
  parallel_for(0, s.c * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float tiles[F::aa * kLanes], out[F::aa * kLanes];
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t c = unit / groups, start = unit % groups * kLanes;
      const int lanes = lanes_from(start, count);
      gather_tiles<F::a>(at + start, planes, c, -s.pad_h, -s.pad_w, lanes, tiles);
      sandwich<F::bt>(tiles, out);
      store_group(out, F::aa, lanes, v, s.c, p.block, c, start);
    }
  });
}

// dm [a^2][K][block] (channels-last: [a^2][block][K]) = A dY A^T for the count tiles of dy at
// at[0, count).
template <class F>
void transform_dy(const WinogradShape& s, const Plan& p, const float* dy, const TilePosition* at,
                  int64_t count, float* dm) {
  if (s.channels_last) {
    const Pixels<const float> pixels{dy, s.k, p.ho, p.wo};
    const int64_t groups = groups_of(s.k);
    parallel_for(0, count * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
      float tiles[F::m * F::m * kLanes], out[F::aa * kLanes];
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t t = unit / groups, first = unit % groups * kLanes;
        const int lanes = lanes_from(first, s.k);
        gather_channels<F::m>(at[t], pixels, first, 0, 0, lanes, tiles);
        sandwich<Adjoints<F>::a>(tiles, out);
        store_group(out, F::aa, lanes, dm, p.block, s.k, t, first);
      }
    });
    return;
  }
  const Planes<const float> planes{dy, s.k, p.ho, p.wo};
  const int64_t groups = groups_of(count);
  parallel_for(0, s.k * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float tiles[F::m * F::m * kLanes], out[F::aa * kLanes];
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t k = unit / groups, start = unit % groups * kLanes;
      const int lanes = lanes_from(start, count);
      gather_tiles<F::m>(at + start, planes, k, 0, 0, lanes, tiles);
      sandwich<Adjoints<F>::a>(tiles, out);
      store_group(out, F::aa, lanes, dm, s.k, p.block, k, start);
    }
  });
}

// The count tiles of y at at[0, count) = A^T M A, from m [a^2][K][block] (channels-last:
// [a^2][block][K]).
template <class F>
void transform_output(const WinogradShape& s, const Plan& p, const float* m, const TilePosition* at,
                      int64_t count, float* y) {
  if (s.channels_last) {
    const Pixels<float> pixels{y, s.k, p.ho, p.wo};
    const int64_t groups = groups_of(s.k);
    parallel_for(0, count * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
      float group_in[F::aa * kLanes], tiles[F::m * F::m * kLanes];
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t t = unit / groups, first = unit % groups * kLanes;
        const int lanes = lanes_from(first, s.k);
        load_group(m, p.block, s.k, t, first, F::aa, lanes, group_in);
        sandwich<F::at>(group_in, tiles);
        scatter_channels<F::m, false>(at[t], pixels, first, 0, 0, lanes, tiles);
      }
    });
    return;
  }
  const Planes<float> planes{y, s.k, p.ho, p.wo};
  const int64_t groups = groups_of(count);
  parallel_for(0, s.k * groups, grain_for(F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float group_in[F::aa * kLanes], tiles[F::m * F::m * kLanes];
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t k = unit / groups, start = unit % groups * kLanes;
      const int lanes = lanes_from(start, count);
      load_group(m, s.k, p.block, k, start, F::aa, lanes, group_in);
      sandwich<F::at>(group_in, tiles);
      scatter_tiles<F::m, false>(at + start, planes, k, 0, 0, lanes, tiles);
    }
  });
}

// dx += B dV B^T for the count tiles at at[0, count), from dv [a^2][C][block] (channels-last:
// [a^2][block][C]). Neighbouring tiles overlap, so each thread takes whole channels (whole
// groups of channels in channels-last).
template <class F>
void transform_dx(const WinogradShape& s, const Plan& p, const float* dv, const TilePosition* at,
                  int64_t count, float* dx) {
  if (s.channels_last) {
    const Pixels<float> pixels{dx, s.c, s.h, s.w};
    parallel_for(0, groups_of(s.c), grain_for(count * F::aa * kLanes), [&](int64_t lo, int64_t hi) {
      float group_in[F::aa * kLanes], tiles[F::aa * kLanes];
      for (int64_t group = lo; group < hi; ++group) {
        const int64_t first = group * kLanes;
        const int lanes = lanes_from(first, s.c);
        for (int64_t t = 0; t < count; ++t) {
          load_group(dv, p.block, s.c, t, first, F::aa, lanes, group_in);
          sandwich<Adjoints<F>::b>(group_in, tiles);
          scatter_channels<F::a, true>(at[t], pixels, first, -s.pad_h, -s.pad_w, lanes, tiles);
        }
      }
    });
    return;
  }
  const Planes<float> planes{dx, s.c, s.h, s.w};
  const int64_t groups = groups_of(count);
  parallel_for(0, s.c, grain_for(groups * F::aa * kLanes), [&](int64_t lo, int64_t hi) {
    float group_in[F::aa * kLanes], tiles[F::aa * kLanes];
    for (int64_t c = lo; c < hi; ++c) {
      for (int64_t start = 0; start < count; start += kLanes) {
        const int lanes = lanes_from(start, count);
        load_group(dv, s.c, p.block, c, start, F::aa, lanes, group_in);
        sandwich<Adjoints<F>::b>(group_in, tiles);
        scatter_tiles<F::a, true>(at + start, planes, c, -s.pad_h, -s.pad_w, lanes, tiles);
      }
    }
  });
}

// fn(f) for each frequency, the frequencies spread over the threads (each GEMM on one thread;
// inside a part, all on the part's thread).
template <typename Fn>
void for_each_frequency(int64_t aa, Fn&& fn) {
  parallel_for(0, aa, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t f = lo; f < hi; ++f) fn(f);
  });
}

// The number of parts the batch is cut into, whole images each (Note [Winograd blocks and
// threads]): one per thread when there are at least as many images, else one for all.
int64_t parts_for(const WinogradShape& s) {
  const int64_t threads = get_num_threads();
  return threads > 1 && s.n >= threads ? threads : 1;
}

// body(part, begin, end) for each part, on the tiles [begin, end) of its images, one part per
// thread.
template <typename Body>
void for_each_part(const WinogradShape& s, const Plan& p, int64_t parts, Body&& body) {
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t part = lo; part < hi; ++part)
      body(part, s.n * part / parts * p.tiles_per_image,
           s.n * (part + 1) / parts * p.tiles_per_image);
  });
}

// ------------------------------------------------------------------ the three passes

template <class F>
void forward(const WinogradShape& s, const float* x, const float* weight, float* y,
             int64_t tiles_per_block) {
  const Plan p = make_plan(s, F::m, F::aa, tiles_per_block);
  if (p.tiles == 0) return;
  ScratchFrame frame;
  float* u = frame.get<float>(F::aa * s.k * s.c);
  transform_weight<F>(s, weight, u);
  for_each_part(s, p, parts_for(s), [&](int64_t, int64_t begin, int64_t end) {
    ScratchFrame part_frame;  // the part's thread's own memory
    float* v = part_frame.get<float>(F::aa * s.c * p.block);
    float* m = part_frame.get<float>(F::aa * s.k * p.block);
    TilePosition* at = part_frame.get<TilePosition>(p.block);
    for (int64_t first = begin; first < end; first += p.block) {
      const int64_t count = std::min(p.block, end - first);
      locate_tiles(p, first, count, at);
      transform_input<F>(s, p, x, at, count, v);
      for_each_frequency(F::aa, [&](int64_t f) {
        const float* u_f = u + f * s.k * s.c;
        const float* v_f = v + f * s.c * p.block;
        float* m_f = m + f * s.k * p.block;
        if (s.channels_last)  // M_f [count x K] = V_f [count x C] @ U_f^T
          gemm<float>(false, true, count, s.k, s.c, 1.0f, v_f, s.c, u_f, s.c, 0.0f, m_f, s.k);
        else  // M_f [K x count] = U_f [K x C] @ V_f
          gemm<float>(false, false, s.k, count, s.c, 1.0f, u_f, s.c, v_f, p.block, 0.0f, m_f,
                      p.block);
      });
      transform_output<F>(s, p, m, at, count, y);
    }
  });
}

template <class F>
void backward_data(const WinogradShape& s, const float* dy, const float* weight, float* dx,
                   int64_t tiles_per_block) {
  const int64_t dx_size = s.n * s.c * s.h * s.w;
  parallel_for(0, dx_size, kParallelGrain,
               [&](int64_t lo, int64_t hi) { std::fill(dx + lo, dx + hi, 0.0f); });
  const Plan p = make_plan(s, F::m, F::aa, tiles_per_block);
  if (p.tiles == 0) return;
  ScratchFrame frame;
  float* u = frame.get<float>(F::aa * s.k * s.c);
  transform_weight<F>(s, weight, u);
  // Parts hold whole images, so no two threads add into the same pixels of dx.
  for_each_part(s, p, parts_for(s), [&](int64_t, int64_t begin, int64_t end) {
    ScratchFrame part_frame;
    float* dm = part_frame.get<float>(F::aa * s.k * p.block);
    float* dv = part_frame.get<float>(F::aa * s.c * p.block);
    TilePosition* at = part_frame.get<TilePosition>(p.block);
    for (int64_t first = begin; first < end; first += p.block) {
      const int64_t count = std::min(p.block, end - first);
      locate_tiles(p, first, count, at);
      transform_dy<F>(s, p, dy, at, count, dm);
      for_each_frequency(F::aa, [&](int64_t f) {
        const float* u_f = u + f * s.k * s.c;
        const float* dm_f = dm + f * s.k * p.block;
        float* dv_f = dv + f * s.c * p.block;
        if (s.channels_last)  // dV_f [count x C] = dM_f [count x K] @ U_f
          gemm<float>(false, false, count, s.c, s.k, 1.0f, dm_f, s.k, u_f, s.c, 0.0f, dv_f, s.c);
        else  // dV_f [C x count] = U_f^T @ dM_f
          gemm<float>(true, false, s.c, count, s.k, 1.0f, u_f, s.c, dm_f, p.block, 0.0f, dv_f,
                      p.block);
      });
      transform_dx<F>(s, p, dv, at, count, dx);
    }
  });
}

template <class F>
void backward_weight(const WinogradShape& s, const float* x, const float* dy, float* dweight,
                     int64_t tiles_per_block) {
  const Plan p = make_plan(s, F::m, F::aa, tiles_per_block);
  if (p.tiles == 0) {  // an empty batch: no gradient
    std::fill(dweight, dweight + s.k * s.c * 9, 0.0f);
    return;
  }
  // Each part sums dU over its own tiles; the parts' sums are added at the end. Where those
  // copies would be large (wide layers, many threads) one part takes all the tiles instead.
  const int64_t du_size = F::aa * s.k * s.c;
  int64_t parts = parts_for(s);
  if (parts * du_size > kMaxPartialFloats) parts = 1;
  ScratchFrame frame;
  float* du = frame.get<float>(parts * du_size);
  for_each_part(s, p, parts, [&](int64_t part, int64_t begin, int64_t end) {
    ScratchFrame part_frame;
    float* v = part_frame.get<float>(F::aa * s.c * p.block);
    float* dm = part_frame.get<float>(F::aa * s.k * p.block);
    TilePosition* at = part_frame.get<TilePosition>(p.block);
    float* du_part = du + part * du_size;
    for (int64_t first = begin; first < end; first += p.block) {
      const int64_t count = std::min(p.block, end - first);
      locate_tiles(p, first, count, at);
      transform_input<F>(s, p, x, at, count, v);
      transform_dy<F>(s, p, dy, at, count, dm);
      const float beta = first == begin ? 0.0f : 1.0f;
      for_each_frequency(F::aa, [&](int64_t f) {
        const float* dm_f = dm + f * s.k * p.block;
        const float* v_f = v + f * s.c * p.block;
        float* du_f = du_part + f * s.k * s.c;
        if (s.channels_last)  // dU_f [K x C] += dM_f^T @ V_f, both [count x *]
          gemm<float>(true, false, s.k, s.c, count, 1.0f, dm_f, s.k, v_f, s.c, beta, du_f, s.c);
        else  // dU_f [K x C] += dM_f [K x count] @ V_f^T
          gemm<float>(false, true, s.k, s.c, count, 1.0f, dm_f, p.block, v_f, p.block, beta, du_f,
                      s.c);
      });
    }
  });
  parallel_for(0, du_size, grain_for(parts), [&](int64_t lo, int64_t hi) {
    for (int64_t part = 1; part < parts; ++part)
      for (int64_t i = lo; i < hi; ++i) du[i] += du[part * du_size + i];
  });
  inverse_transform_weight<F>(s, du, dweight);
}

void check_arguments(const char* op, const WinogradShape& s, int64_t tiles_per_block) {
  LOOM_CHECK(s.n >= 0 && s.c >= 1 && s.k >= 1 && s.h >= 1 && s.w >= 1, ValueError, op,
             ": expected a batch of n >= 0 images of c >= 1 channels, h, w >= 1, and k >= 1 "
             "output channels; got ",
             s);
  LOOM_CHECK(s.pad_h >= 0 && s.pad_h <= 2 && s.pad_w >= 0 && s.pad_w <= 2, ValueError, op,
             ": expected a padding of 0, 1 or 2 for a 3x3 kernel; got ", s);
  LOOM_CHECK(s.ho() >= 1 && s.wo() >= 1, ValueError, op, ": the output would be ", s.ho(), "x",
             s.wo(), " (a 3x3 kernel needs h + 2 pad_h >= 3 and w + 2 pad_w >= 3); got ", s);
  LOOM_CHECK(tiles_per_block >= 0, ValueError, op,
             ": expected tiles_per_block >= 0 (0: chosen); got ", tiles_per_block, " for ", s);
}

// f.template operator()<F2x2>() or <F4x4>(), as `tile` says.
template <typename Fn>
void with_tile(WinogradTile tile, Fn&& f) {
  if (tile == WinogradTile::kF2x2)
    f.template operator()<F2x2>();
  else
    f.template operator()<F4x4>();
}

}  // namespace

void winograd_conv2d(const WinogradShape& shape, WinogradTile tile, const float* x,
                     const float* weight, float* y, int64_t tiles_per_block) {
  check_arguments("winograd_conv2d", shape, tiles_per_block);
  with_tile(tile, [&]<typename F>() { forward<F>(shape, x, weight, y, tiles_per_block); });
}

void winograd_conv2d_backward_data(const WinogradShape& shape, WinogradTile tile, const float* dy,
                                   const float* weight, float* dx, int64_t tiles_per_block) {
  check_arguments("winograd_conv2d_backward_data", shape, tiles_per_block);
  with_tile(tile, [&]<typename F>() { backward_data<F>(shape, dy, weight, dx, tiles_per_block); });
}

void winograd_conv2d_backward_weight(const WinogradShape& shape, WinogradTile tile, const float* x,
                                     const float* dy, float* dweight, int64_t tiles_per_block) {
  check_arguments("winograd_conv2d_backward_weight", shape, tiles_per_block);
  with_tile(tile,
            [&]<typename F>() { backward_weight<F>(shape, x, dy, dweight, tiles_per_block); });
}

}  // namespace loom::cpu
