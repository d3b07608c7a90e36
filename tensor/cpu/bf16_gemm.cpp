// tensor/cpu/bf16_gemm.cpp — GEMM of bfloat16 operands summed in float32: the vdpbf16ps
// micro-kernel, the packers that pair consecutive k (Note [bf16 dot products] in
// tensor/cpu/bf16_gemm.h), the threads around the packed driver, and the widened path for CPUs
// without AVX512_BF16.

#include "tensor/cpu/bf16_gemm.h"

#include <algorithm>
#include <cstring>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/scratch.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace loom::cpu {

bool bf16_dot_products() {
#if LOOM_PACKED_GEMM_SIMD
  return cpu_isa() >= CpuIsa::kAvx512Bf16;
#else
  return false;
#endif
}

bool amx_bf16_products() {
#if LOOM_PACKED_GEMM_SIMD && defined(__x86_64__)
  return cpu_isa() >= CpuIsa::kAmxBf16;
#else
  return false;
#endif
}

bool pair_panel_products() { return bf16_dot_products() && !amx_bf16_products(); }

namespace {

// The stored [rows, cols] bfloat16 matrix (leading dim ld) as a contiguous float32 one.
float* widen(const BFloat16* src, int64_t rows, int64_t cols, int64_t ld, ScratchFrame& frame) {
  float* dst = frame.get<float>(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * ld + j];
  return dst;
}

}  // namespace

#if LOOM_PACKED_GEMM_SIMD

using Bf16Kernel = Kernel<BFloat16, CpuIsa::kAvx512Bf16>;

// One pair of k of the first R rows of a 12-row panel (R = 12 for the full tile, 4 or 8 for
// Note [Edge tiles]): the two vectors of B loaded, each pair of A broadcast once for its two
// vdpbf16ps; the accumulators stay in zmm registers.
template <int R>
[[gnu::always_inline, gnu::target("avx512f,avx512bf16")]] inline void dot_step_rows_x32(
    __m512 (&acc)[R][2], const uint32_t* a, const uint32_t* b) {
  const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
    acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
    acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
  }
}

[[gnu::always_inline, gnu::target("avx512f,avx512bf16")]] inline void dot_step_12x32(
    __m512 (&acc)[12][2], const uint32_t* a, const uint32_t* b) {
  dot_step_rows_x32<12>(acc, a, b);
}

// The float kernel's schedule (Note [Prefetching the C tile]) over pairs of k. Paired in one
// process on an AMD EPYC, against the plain loop: 1024^3 1.05-1.10x as fast on 1 and 2
// threads, the ResNet-18 width-64 layers' forward and backward in 0.94-1.0 of the time; the
// same bits. Ending the spread kLead pairs before the stores gained another 3% on 1 thread and
// 1% on 2.
[[gnu::noinline, gnu::visibility("hidden"), gnu::target("avx512f,avx512bf16")]] void
Bf16Kernel::micro_kernel(int64_t kc, const uint32_t* a, const uint32_t* b, const CTile<float>& c) {
  constexpr int kStride = TilePrefetch::kStride;
  const int64_t pairs = (kc + 1) / 2;
  const TilePrefetch schedule(pairs);
  int line = 0;
  for (; line < schedule.early; ++line) prefetch_tile_line_12x32(c, line);
  __m512 acc[12][2];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  int64_t q = 0;
  for (; q < schedule.quiet; ++q, a += 12, b += 32) dot_step_12x32(acc, a, b);
  while (q < schedule.spread_end) {
    prefetch_tile_line_12x32(c, line++);
    for (const int64_t end = std::min(q + kStride, schedule.spread_end); q < end;
         ++q, a += 12, b += 32)
      dot_step_12x32(acc, a, b);
  }
  for (; q < pairs; ++q, a += 12, b += 32) dot_step_12x32(acc, a, b);
  store_tile_12x32(acc, c);
}

// Rows [0, R) of the tile, summed over the segments in registers: Note [Edge tiles] (one
// segment) and Note [bf16 batch lanes] (a tile's taps or runs).
template <int R>
[[gnu::noinline, gnu::target("avx512f,avx512bf16")]] void dot_segments_rows_x32(
    int64_t rows, const PairSegment* segments, int64_t count, const CTile<float>& c) {
  prefetch_rows_x32(c, rows);
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t s = 0; s < count; ++s) {
    const uint32_t* a = segments[s].a;
    const uint32_t* b = segments[s].b;
    const int64_t ldb = segments[s].ldb;
    for (int64_t q = 0; q < segments[s].pairs; ++q, a += 12, b += ldb)
      dot_step_rows_x32<R>(acc, a, b);
  }
  store_rows_x32<R>(acc, rows, c);
}

// Rows [0, R) of the 12 x 32 tile over kc k (Note [Edge tiles] in tensor/cpu/packed_gemm.h).
template <int R>
void dot_edge_tile_12x32(int64_t rows, int64_t kc, const uint32_t* a, const uint32_t* b,
                         const CTile<float>& c) {
  const PairSegment whole{a, b, (kc + 1) / 2};
  dot_segments_rows_x32<R>(rows, &whole, 1, c);
}

[[gnu::noinline, gnu::visibility("hidden")]] bool Bf16Kernel::edge_kernel(int64_t rows, int64_t kc,
                                                                          const uint32_t* a,
                                                                          const uint32_t* b,
                                                                          const CTile<float>& c) {
  return edge_rows<dot_edge_tile_12x32<4>, dot_edge_tile_12x32<8>>(rows, kc, a, b, c);
}

void dot_segments_12x32(int64_t rows, const PairSegment* segments, int64_t count,
                        const CTile<float>& c) {
  if (rows <= 4) return dot_segments_rows_x32<4>(rows, segments, count, c);
  if (rows <= 8) return dot_segments_rows_x32<8>(rows, segments, count, c);
  dot_segments_rows_x32<12>(rows, segments, count, c);
}

namespace {

// The q-th pair of a row whose k are contiguous (memcpy: the row may be 2-byte aligned only).
uint32_t pair_at(const BFloat16* row, int64_t q) {
  uint32_t bits;
  std::memcpy(&bits, row + 2 * q, sizeof bits);
  return bits;
}

// dst[t * ld_dst + r] = pair t of row r (src + r * ld_src, k contiguous) for t < 8 and r < rows
// (8, or 4 with the other four lanes of each row left alone): eight pairs of each of eight rows
// turned into rows of eight, an 8 x 8 transpose of uint32 in registers.
void transpose_pairs_8x8(const BFloat16* src, int64_t ld_src, int rows, uint32_t* dst,
                         int64_t ld_dst) {
  __m256i r[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    r[i] = i < rows ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * ld_src))
                    : _mm256_setzero_si256();
  __m256i t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);  // a0 b0 c0 d0 | a4 b4 c4 d4
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Pair p of rows 0..3 is the low half of u[p % 4] for p < 4, the high half for p >= 4; rows
  // 4..7 are the same halves of u[4 + p % 4].
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    const __m256i column = p < 4 ? _mm256_permute2x128_si256(u[p % 4], u[4 + p % 4], 0x20)
                                 : _mm256_permute2x128_si256(u[p % 4], u[4 + p % 4], 0x31);
    if (rows == 8)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * ld_dst), column);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + p * ld_dst),
                       _mm256_castsi256_si128(column));
  }
}

}  // namespace

void pack_rows_of_pairs(const BFloat16* src, int64_t ld_src, int64_t count, int64_t kc,
                        uint32_t* dst, int64_t ld) {
  const int64_t full = kc / 2;
  int64_t q = 0;
  for (; q + 8 <= full; q += 8)
    for (int64_t r = 0; r < count; r += 8)
      transpose_pairs_8x8(src + r * ld_src + 2 * q, ld_src, count - r >= 8 ? 8 : 4,
                          dst + q * ld + r, ld);
  for (; q < full; ++q)
    for (int64_t r = 0; r < count; ++r) dst[q * ld + r] = pair_at(src + r * ld_src, q);
  if (kc % 2 != 0)
    for (int64_t r = 0; r < count; ++r)
      dst[full * ld + r] = pair_of(src[r * ld_src + kc - 1], BFloat16());
}

namespace {

// Two rows of the stored matrix, k = 2q and 2q + 1 (`hi` null past an odd kc), `count`
// contiguous elements each, interleaved into `count` pairs: count a multiple of 4.
void interleave_pair_rows(const BFloat16* lo, const BFloat16* hi, int64_t count, uint32_t* dst) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + j));
    const __m128i h = hi != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + j))
                                    : _mm_setzero_si128();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), _mm_unpacklo_epi16(l, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j + 4), _mm_unpackhi_epi16(l, h));
  }
  for (; j < count; j += 4) {
    const __m128i l = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo + j));
    const __m128i h = hi != nullptr ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi + j))
                                    : _mm_setzero_si128();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), _mm_unpacklo_epi16(l, h));
  }
}

// Any layout, one element at a time: `count` (< width) rows or columns in a panel [pairs, width]
// whose element (q, r) pairs src[r step + 2q k_step] with the next k, zeros past count.
void pack_pairs_strided(const BFloat16* src, int64_t step, int64_t k_step, int64_t count,
                        int64_t kc, int64_t width, uint32_t* dst) {
  for (int64_t q = 0; q < (kc + 1) / 2; ++q) {
    uint32_t* row = dst + q * width;
    const bool has_hi = 2 * q + 1 < kc;
    for (int64_t r = 0; r < count; ++r) {
      const BFloat16* x = src + r * step + 2 * q * k_step;
      row[r] = pair_of(x[0], has_hi ? x[k_step] : BFloat16());
    }
    std::fill(row + count, row + width, 0u);
  }
}

// A [m, kc] with A(i, p) = src[i rs + p cs] as 12-row panels of k-pairs [ceil(kc / 2), 12],
// rows past m and the high half of an odd kc's last pair zero.
void pack_a_pairs(const BFloat16* src, int64_t rs, int64_t cs, int64_t m, int64_t kc,
                  uint32_t* dst) {
  constexpr int64_t mr = Bf16Kernel::mr;
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += pairs * mr) {
    const int64_t rows = std::min(mr, m - i0);
    const BFloat16* panel = src + i0 * rs;
    if (rows == mr && cs == 1) {  // rows contiguous in k: their pairs transposed
      pack_rows_of_pairs(panel, rs, mr, kc, dst, mr);
    } else if (rows == mr && rs == 1) {  // A stored transposed: each k's 12 rows contiguous
      for (int64_t q = 0; q < pairs; ++q)
        interleave_pair_rows(panel + 2 * q * cs,
                             2 * q + 1 < kc ? panel + (2 * q + 1) * cs : nullptr, mr, dst + q * mr);
    } else {
      pack_pairs_strided(panel, rs, cs, rows, kc, mr, dst);
    }
  }
}

// B [kc, nc] with B(p, j) = src[p rs + j cs] as 32-column panels of k-pairs
// [ceil(kc / 2), 32], columns past nc and the high half of an odd kc's last pair zero.
void pack_b_pairs(const BFloat16* src, int64_t rs, int64_t cs, int64_t kc, int64_t nc,
                  uint32_t* dst) {
  constexpr int64_t nr = Bf16Kernel::nr;
  const int64_t pairs = (kc + 1) / 2, full = nc / nr;
  if (cs == 1) {
    // Rows of B contiguous in j: each pair of rows, read front to back, is dealt out to the
    // panels, 32 pairs (128 bytes) to each (as pack_b_rows deals out four float rows).
    for (int64_t q = 0; q < pairs; ++q) {
      const BFloat16* lo = src + 2 * q * rs;
      const BFloat16* hi = 2 * q + 1 < kc ? lo + rs : nullptr;
      for (int64_t panel = 0; panel < full; ++panel)
        interleave_pair_rows(lo + panel * nr, hi == nullptr ? nullptr : hi + panel * nr, nr,
                             dst + panel * pairs * nr + q * nr);
    }
  } else if (rs == 1) {  // B stored transposed: each column contiguous in k
    for (int64_t panel = 0; panel < full; ++panel)
      pack_rows_of_pairs(src + panel * nr * cs, cs, nr, kc, dst + panel * pairs * nr, nr);
  } else {
    for (int64_t panel = 0; panel < full; ++panel)
      pack_pairs_strided(src + panel * nr * cs, cs, rs, nr, kc, nr, dst + panel * pairs * nr);
  }
  if (nc > full * nr)  // the last, partial panel
    pack_pairs_strided(src + full * nr * cs, cs, rs, nc - full * nr, kc, nr,
                       dst + full * pairs * nr);
}

// C = scale * C over [m, n]; scale = 0 writes zeros, NaNs in C included.
void scale_rows(int64_t m, int64_t n, float scale, float* c, int64_t ldc) {
  if (scale == 1.0f) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (scale == 0.0f)
      std::fill(row, row + n, 0.0f);
    else
      for (int64_t j = 0; j < n; ++j) row[j] *= scale;
  }
}

// C += A B (or C = when !accumulate) by the packed driver with kernel K. A(i, p) = a[i a_rs + p
// a_cs], packed by pack_a(src, rs, cs, m, kc, dst); B's blocks come from b_block(pc, kc, j, nc,
// dst), which packs rows [pc, pc + kc) and columns [j, j + nc) of B. Threads split C by columns,
// whole NR-wide panels each, as cpu::gemm's float32 path does; each packs its own blocks, and
// calls enter() before its products and leave() after (the AMX kernel sets and releases its
// tiles there).
template <typename K, typename PackA, typename BBlock, typename Enter, typename Leave>
void threaded_gemm_blocks(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs,
                          int64_t a_cs, float* c, int64_t ldc, bool accumulate, PackA pack_a,
                          const BBlock& b_block, Enter enter, Leave leave) {
  using P = typename K::Packed;
  const int64_t panels = (n + K::nr - 1) / K::nr, depth = K::kc / K::k_group;
  parallel_for(0, panels, 2, [&](int64_t lo, int64_t hi) {
    const int64_t j0 = lo * K::nr, cols = std::min(n, hi * K::nr) - j0;
    ScratchFrame frame;
    P* b_scratch = frame.get<P>(depth * ((K::nc + K::nr - 1) / K::nr * K::nr));
    P* a_scratch = frame.get<P>(K::mc * depth);
    auto a_block = [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, P* scratch) -> const P* {
      pack_a(a + ic * a_rs + pc * a_cs, a_rs, a_cs, mc, kc, scratch);
      return scratch;
    };
    auto thread_b_block = [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, P* dst) {
      b_block(pc, kc, j0 + jc, nc, dst);
    };
    enter();
    packed_gemm<K>(m, cols, k, a_block, thread_b_block, c + j0, ldc, accumulate, b_scratch,
                   a_scratch);
    leave();
  });
}

// C += op(A) op(B) (or C = when !accumulate), with B packed by pack_b(src, rs, cs, kc, nc, dst).
template <typename K, typename PackA, typename PackB, typename Enter, typename Leave>
void threaded_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BFloat16* a,
                   int64_t lda, const BFloat16* b, int64_t ldb, float* c, int64_t ldc,
                   bool accumulate, PackA pack_a, PackB pack_b, Enter enter, Leave leave) {
  const int64_t b_rs = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;
  auto b_block = [&](int64_t pc, int64_t kc, int64_t j, int64_t nc, typename K::Packed* dst) {
    pack_b(b + pc * b_rs + j * b_cs, b_rs, b_cs, kc, nc, dst);
  };
  threaded_gemm_blocks<K>(m, n, k, a, trans_a ? 1 : lda, trans_a ? lda : 1, c, ldc, accumulate,
                          pack_a, b_block, enter, leave);
}

// C += op(A) op(B) (or C = when !accumulate) with the vdpbf16ps kernel.
void threaded_bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float* c,
                        int64_t ldc, bool accumulate) {
  threaded_gemm<Bf16Kernel>(
      trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate, pack_a_pairs, pack_b_pairs,
      [] {}, [] {});
}

}  // namespace

void gemm_bf16_pair_panels(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
                           const PairPanelPacker& pack_b, float* c, int64_t ldc, bool accumulate) {
  LOOM_CHECK(pair_panel_products(), ValueError,
             "gemm_bf16_pair_panels: needs the vdpbf16ps kernel (AVX512_BF16 without AMX); this "
             "CPU runs ",
             to_string(cpu_isa()), " (m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_rows(m, n, accumulate ? 1.0f : 0.0f, c, ldc);
  threaded_gemm_blocks<Bf16Kernel>(
      m, n, k, a, lda, 1, c, ldc, accumulate, pack_a_pairs, pack_b, [] {}, [] {});
}

#if defined(__x86_64__)

using AmxKernel = Kernel<BFloat16, CpuIsa::kAmxBf16>;

// Per 32 k: A's two tiles (rows 64 bytes apart), B's two (rows 128 bytes apart), four products.
[[gnu::noinline, gnu::visibility("hidden"), gnu::target("amx-tile,amx-bf16")]] void
AmxKernel::micro_kernel(int64_t kc, const AmxChunk* a, const AmxChunk* b, const CTile<float>& c) {
  const int64_t ld_in = c.ld_in * int64_t{sizeof(float)},
                ld_out = c.ld_out * int64_t{sizeof(float)};
  if (c.accumulate) {
    _tile_loadd(0, c.in, ld_in);
    _tile_loadd(1, c.in + 16, ld_in);
    _tile_loadd(2, c.in + 16 * c.ld_in, ld_in);
    _tile_loadd(3, c.in + 16 * c.ld_in + 16, ld_in);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t chunks = (kc + k_group - 1) / k_group;
  for (int64_t q = 0; q < chunks; ++q, a += mr, b += nr) {
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 16, 64);
    _tile_loadd(6, b, 128);
    _tile_loadd(7, b->pairs + 16, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c.out, ld_out);
  _tile_stored(1, c.out + 16, ld_out);
  _tile_stored(2, c.out + 16 * c.ld_out, ld_out);
  _tile_stored(3, c.out + 16 * c.ld_out + 16, ld_out);
}

namespace {

// The tile shapes of the AMX kernel: tmm0-7 all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

[[gnu::target("amx-tile")]] void configure_tiles() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

[[gnu::target("amx-tile")]] void release_tiles() { _tile_release(); }

// A [m, kc] with A(i, p) = src[i rs + p cs] as 32-row AMX panels [ceil(kc / 32)][32 rows]
// of 32 k, zeros past m and kc.
void pack_a_amx(const BFloat16* src, int64_t rs, int64_t cs, int64_t m, int64_t kc, AmxChunk* dst) {
  constexpr int64_t mr = AmxKernel::mr, group = AmxKernel::k_group;
  const int64_t chunks = (kc + group - 1) / group;
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += chunks * mr) {
    const int64_t rows = std::min(mr, m - i0);
    for (int64_t q = 0; q < chunks; ++q) {
      const int64_t k0 = q * group, width = std::min(group, kc - k0);
      for (int64_t r = 0; r < mr; ++r) {
        auto* row = reinterpret_cast<BFloat16*>(dst[q * mr + r].pairs);
        const BFloat16* from = src + (i0 + r) * rs + k0 * cs;
        if (r >= rows) {
          std::fill(row, row + group, BFloat16());
          continue;
        }
        if (cs == 1) {
          std::memcpy(row, from, static_cast<size_t>(width) * sizeof(BFloat16));
          std::fill(row + width, row + group, BFloat16());
        } else if (rs != 1) {
          for (int64_t p = 0; p < width; ++p) row[p] = from[p * cs];
          std::fill(row + width, row + group, BFloat16());
        }
      }
      if (cs != 1 && rs == 1) {
        // A stored transposed: each k's rows are contiguous, so read them k by k and deal them
        // out to the rows (the rows past m were zeroed above).
        auto* rows_of = reinterpret_cast<BFloat16*>(dst[q * mr].pairs);  // [32 rows][32 k]
        for (int64_t p = 0; p < width; ++p) {
          const BFloat16* column = src + i0 + (k0 + p) * cs;
          for (int64_t r = 0; r < rows; ++r) rows_of[r * group + p] = column[r];
        }
        for (int64_t r = 0; r < rows; ++r)
          std::fill(rows_of + r * group + width, rows_of + (r + 1) * group, BFloat16());
      }
    }
  }
}

// B [kc, nc] with B(p, j) = src[p rs + j cs] as 32-column AMX panels [ceil(kc / 32)][16
// pairs][32 columns], zeros past nc and kc.
void pack_b_amx(const BFloat16* src, int64_t rs, int64_t cs, int64_t kc, int64_t nc,
                AmxChunk* dst) {
  constexpr int64_t nr = AmxKernel::nr, group = AmxKernel::k_group;
  const int64_t chunks = (kc + group - 1) / group;
  for (int64_t j0 = 0; j0 < nc; j0 += nr, dst += chunks * nr) {
    const int64_t cols = std::min(nr, nc - j0);
    for (int64_t q = 0; q < chunks; ++q) {
      uint32_t* chunk = dst[q * nr].pairs;  // [16 pairs][32 columns]
      for (int64_t t = 0; t < group / 2; ++t) {
        const int64_t k = q * group + 2 * t;
        uint32_t* pair_row = chunk + t * nr;
        if (k >= kc) {
          std::fill(pair_row, pair_row + nr, 0u);
          continue;
        }
        const BFloat16* lo = src + k * rs + j0 * cs;
        const BFloat16* hi = k + 1 < kc ? lo + rs : nullptr;
        if (cs == 1 && cols == nr) {
          interleave_pair_rows(lo, hi, nr, pair_row);
          continue;
        }
        if (rs == 1 && cs != 1 && hi != nullptr) continue;  // a transposed B's pairs: below
        for (int64_t j = 0; j < cols; ++j)
          pair_row[j] = pair_of(lo[j * cs], hi != nullptr ? hi[j * cs] : BFloat16());
        std::fill(pair_row + cols, pair_row + nr, 0u);
      }
      if (rs == 1 && cs != 1) {
        // B stored transposed: each column's k are contiguous, so its whole pairs are read as
        // uint32 and dealt out to the pair rows.
        const int64_t whole = std::min(group, kc - q * group) / 2;
        for (int64_t j = 0; j < cols; ++j) {
          const BFloat16* column = src + (j0 + j) * cs + q * group;
          for (int64_t t = 0; t < whole; ++t) chunk[t * nr + j] = pair_at(column, t);
        }
        for (int64_t t = 0; t < whole; ++t)
          std::fill(chunk + t * nr + cols, chunk + (t + 1) * nr, 0u);
      }
    }
  }
}

// C += op(A) op(B) (or C = when !accumulate) on AMX tiles.
void threaded_amx_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float* c,
                       int64_t ldc, bool accumulate) {
  threaded_gemm<AmxKernel>(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate,
                           pack_a_amx, pack_b_amx, configure_tiles, release_tiles);
}

}  // namespace

#endif  // defined(__x86_64__)

#endif  // LOOM_PACKED_GEMM_SIMD

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (!bf16_dot_products()) {
    // Widened: every bfloat16 is a float32, so this is the same product in float32's GEMM.
    ScratchFrame frame;
    const float* a32 = widen(a, trans_a ? k : m, trans_a ? m : k, lda, frame);
    const float* b32 = widen(b, trans_b ? n : k, trans_b ? k : n, ldb, frame);
    gemm<float>(trans_a, trans_b, m, n, k, alpha, a32, trans_a ? m : k, b32, trans_b ? k : n, beta,
                c, ldc);
    return;
  }
#if LOOM_PACKED_GEMM_SIMD
  if (k == 0 || alpha == 0.0f) return scale_rows(m, n, beta, c, ldc);
  // The kernel: tiles where the CPU has AMX, else vdpbf16ps.
  auto* product = &threaded_bf16_gemm;
#if defined(__x86_64__)
  if (amx_bf16_products()) product = &threaded_amx_gemm;
#endif
  if (beta == 0.0f || alpha == 1.0f) {
    // The product written into C (beta = 0: the first pass over K ignores C) or added to beta C;
    // then alpha, where it is not 1, scales the float32 result.
    if (beta != 0.0f) scale_rows(m, n, beta, c, ldc);
    product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta != 0.0f);
    scale_rows(m, n, alpha, c, ldc);
    return;
  }
  // Both apply: the product in scratch, then C = alpha product + beta C.
  ScratchFrame frame;
  float* product_c = frame.get<float>(m * n);
  product(trans_a, trans_b, m, n, k, a, lda, b, ldb, product_c, n, false);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      c[i * ldc + j] = alpha * product_c[i * n + j] + beta * c[i * ldc + j];
#endif
}

}  // namespace loom::cpu
