// tensor/cpu/packed_gemm.h — the packed GEMM driver shared by cpu::gemm and conv2d: BLIS-style
// blocking (Note [GEMM blocking] in tensor/cpu/gemm.cpp) around a register-tile micro-kernel,
// one per instruction set (Note [CPU instruction sets] in tensor/cpu_info.h): 6 x 16 floats or
// 6 x 8 doubles in the sixteen AVX2 registers, 12 x 32 floats in 24 of the 32 AVX-512 ones.
// Callers supply the packers, so conv2d can pack patches straight from the image (implicit
// im2col) and cpu::gemm strided or transposed matrices, and pick the kernel at run time with
// with_packed_kernel. Single-threaded: callers split the work.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/cpu/scratch.h"
#include "tensor/cpu_info.h"

// The packed kernels need at least AVX2 and FMA in the build's baseline (LOOM_CPU_BASELINE);
// below it (or off x86) every GEMM and convolution takes the generic path.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_PACKED_GEMM_SIMD 1
#else
#define LOOM_PACKED_GEMM_SIMD 0
#endif

namespace loom::cpu {

// Where a micro-tile of C is read from and written to: out = (accumulate ? in : 0) + the
// product. `in` is usually `out`; the staged passes of Note [Staging C] read one buffer and
// write another.
template <typename T>
struct CTile {
  const T* in;
  int64_t ld_in;
  T* out;
  int64_t ld_out;
  bool accumulate;
};

// The micro-kernels' traits, below; declared in every build, so that callers name them in code
// that with_packed_kernel never runs where the baseline lacks AVX2 and FMA.
template <typename T, CpuIsa I>
struct Kernel;

#if LOOM_PACKED_GEMM_SIMD

// ------------------------------------------------------------------ the micro-kernels
//
// Kernel<T, I>: the register tile MR x NR of the instruction set I's micro-kernel and its cache
// blocks (KC x NR panels of B stay in L1, MC x KC blocks of A in L2, KC x NC blocks of B in
// L2/L3), and micro_kernel(kc, a, b, c): c.out [MR, NR] = (c.accumulate ? c.in : 0) + the sum
// over p < kc of a[p] (x) b[p], with a packed [kc, MR] and b packed [kc, NR]. Scalar is C's
// type; Packed, the element of the packed panels, holds k_group consecutive k of one row of A
// or one column of B: one float for the float kernels, two bfloat16 in a uint32 for bfloat16's
// (Note [bf16 dot products] in tensor/cpu/bf16_gemm.h), whose panels are then
// [ceil(kc / 2), MR] and [ceil(kc / 2), NR]. Each kernel is compiled for its own instructions
// (a target attribute where they are above the baseline), never inlined, and hidden (no PLT
// call in the library). The float kernels also have pack_rows(src, ld, kc, next, dst): MR rows
// of A that lie along k (row r at src + r ld) as one panel [kc, MR], transposed in registers,
// with the next panel's rows (`next`, or null) fetched meanwhile; pack_a uses it where A's rows
// are contiguous (Note [Packing A's rows]).

template <>
struct Kernel<float, CpuIsa::kAvx2> {
  using Scalar = float;
  using Packed = float;
  static constexpr int64_t k_group = 1;
  static constexpr int64_t mr = 6, nr = 16, kc = 256, mc = 120, nc = 1536;
  static void micro_kernel(int64_t kc, const float* a, const float* b, const CTile<float>& c);
  static void pack_rows(const float* src, int64_t ld, int64_t kc, const float* next, float* dst);
};

template <>
struct Kernel<double, CpuIsa::kAvx2> {
  using Scalar = double;
  using Packed = double;
  static constexpr int64_t k_group = 1;
  static constexpr int64_t mr = 6, nr = 8, kc = 256, mc = 60, nc = 768;
  static void micro_kernel(int64_t kc, const double* a, const double* b, const CTile<double>& c);
};

// 512-bit float tile: twelve rows of two 16-float vectors, 24 accumulators, the B row in two
// registers and A's values broadcast one at a time into another. The B panel, KC x 32 floats,
// stays in L1 with KC = 192 (24 KiB of an AVX-512 core's 48). On data in L1 it runs at 0.97-1.0
// of the 512-bit FMA peak; inside the GEMM, C's traffic is what it loses to (Note [Prefetching
// the C tile], docs/cpu_speed.md).
template <>
struct Kernel<float, CpuIsa::kAvx512> {
  using Scalar = float;
  using Packed = float;
  static constexpr int64_t k_group = 1;
  static constexpr int64_t mr = 12, nr = 32, kc = 192, mc = 144, nc = 3072;
  static void micro_kernel(int64_t kc, const float* a, const float* b, const CTile<float>& c);
  static bool edge_kernel(int64_t rows, int64_t kc, const float* a, const float* b,
                          const CTile<float>& c);
  static void pack_rows(const float* src, int64_t ld, int64_t kc, const float* next, float* dst);
};

// float64 is not a hot path: AVX-512 machines run the AVX2 kernel.
template <>
struct Kernel<double, CpuIsa::kAvx512> : Kernel<double, CpuIsa::kAvx2> {};

// Six rows of two 8-float vectors: twelve accumulators, two registers of B, two broadcasts of
// A, all sixteen ymm registers. The k loop is assembly: compiled from intrinsics, GCC ran short
// of registers inside the driver's loops and re-read B from memory for every FMA (18 loads per
// 12 FMAs instead of 8), or rotated accumulators through moves; written out, the loop is 2
// loads, 6 broadcasts and 12 FMAs per k, unrolled four times, and runs at about 0.97 of the FMA
// peak on data in L1 (0.88 for the intrinsics). The C tile is prefetched at the start so its
// rows (one cache line each, ld apart) arrive during the products; the A panel streaming from
// L2 is prefetched a few steps ahead. Never inlined, and hidden (no PLT call in the library).
[[gnu::noinline, gnu::visibility("hidden")]] inline void Kernel<float, CpuIsa::kAvx2>::micro_kernel(
    int64_t kc, const float* a, const float* b, const CTile<float>& c) {
  for (int i = 0; i < 6; ++i) {
    if (c.accumulate) _mm_prefetch(reinterpret_cast<const char*>(c.in + i * c.ld_in), _MM_HINT_T0);
    if (c.out != c.in || !c.accumulate)
      _mm_prefetch(reinterpret_cast<const char*>(c.out + i * c.ld_out), _MM_HINT_T0);
  }
  int64_t quads = kc / 4, rest = kc % 4;
  // One k: B row in ymm0/ymm1, a[i] broadcast into ymm2/ymm3 alternately, row i of the tile in
  // ymm(4 + 2i) and ymm(5 + 2i).
#define LOOM_GEMM_K(A, B)                   \
  "vmovaps " #B                             \
  "(%[b]), %%ymm0\n\t"                      \
  "vmovaps " #B                             \
  "+32(%[b]), %%ymm1\n\t"                   \
  "vbroadcastss " #A                        \
  "(%[a]), %%ymm2\n\t"                      \
  "vfmadd231ps %%ymm0, %%ymm2, %%ymm4\n\t"  \
  "vfmadd231ps %%ymm1, %%ymm2, %%ymm5\n\t"  \
  "vbroadcastss " #A                        \
  "+4(%[a]), %%ymm3\n\t"                    \
  "vfmadd231ps %%ymm0, %%ymm3, %%ymm6\n\t"  \
  "vfmadd231ps %%ymm1, %%ymm3, %%ymm7\n\t"  \
  "vbroadcastss " #A                        \
  "+8(%[a]), %%ymm2\n\t"                    \
  "vfmadd231ps %%ymm0, %%ymm2, %%ymm8\n\t"  \
  "vfmadd231ps %%ymm1, %%ymm2, %%ymm9\n\t"  \
  "vbroadcastss " #A                        \
  "+12(%[a]), %%ymm3\n\t"                   \
  "vfmadd231ps %%ymm0, %%ymm3, %%ymm10\n\t" \
  "vfmadd231ps %%ymm1, %%ymm3, %%ymm11\n\t" \
  "vbroadcastss " #A                        \
  "+16(%[a]), %%ymm2\n\t"                   \
  "vfmadd231ps %%ymm0, %%ymm2, %%ymm12\n\t" \
  "vfmadd231ps %%ymm1, %%ymm2, %%ymm13\n\t" \
  "vbroadcastss " #A                        \
  "+20(%[a]), %%ymm3\n\t"                   \
  "vfmadd231ps %%ymm0, %%ymm3, %%ymm14\n\t" \
  "vfmadd231ps %%ymm1, %%ymm3, %%ymm15\n\t"
  __asm__ volatile(
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
      "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
      "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
      "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "vxorps %%ymm12, %%ymm12, %%ymm12\n\t"
      "vxorps %%ymm13, %%ymm13, %%ymm13\n\t"
      "vxorps %%ymm14, %%ymm14, %%ymm14\n\t"
      "vxorps %%ymm15, %%ymm15, %%ymm15\n\t"
      "test %[quads], %[quads]\n\t"
      "jz 2f\n\t"
      "1:\n\t"  // four k per pass
      "prefetcht0 384(%[a])\n\t"
      LOOM_GEMM_K(0, 0) LOOM_GEMM_K(24, 64) LOOM_GEMM_K(48, 128) LOOM_GEMM_K(72, 192)
      "add $96, %[a]\n\t"
      "add $256, %[b]\n\t"
      "dec %[quads]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "test %[rest], %[rest]\n\t"
      "jz 4f\n\t"
      "3:\n\t"  // the last kc % 4
      LOOM_GEMM_K(0, 0)
      "add $24, %[a]\n\t"
      "add $64, %[b]\n\t"
      "dec %[rest]\n\t"
      "jnz 3b\n\t"
      "4:\n\t"
      // Rows 0-2 are addressed from in0/out0, rows 3-5 from in3/out3. Every load comes before
      // any store: rows are often a multiple of 4 KiB apart (ldc = 1024 floats), and a load
      // behind a store whose address has the same low 12 bits waits for that store.
      "test %[accumulate], %[accumulate]\n\t"
      "jz 5f\n\t"
      "vaddps (%[i0]), %%ymm4, %%ymm4\n\t"
      "vaddps 32(%[i0]), %%ymm5, %%ymm5\n\t"
      "vaddps (%[i0],%[ldi],1), %%ymm6, %%ymm6\n\t"
      "vaddps 32(%[i0],%[ldi],1), %%ymm7, %%ymm7\n\t"
      "vaddps (%[i0],%[ldi],2), %%ymm8, %%ymm8\n\t"
      "vaddps 32(%[i0],%[ldi],2), %%ymm9, %%ymm9\n\t"
      "vaddps (%[i3]), %%ymm10, %%ymm10\n\t"
      "vaddps 32(%[i3]), %%ymm11, %%ymm11\n\t"
      "vaddps (%[i3],%[ldi],1), %%ymm12, %%ymm12\n\t"
      "vaddps 32(%[i3],%[ldi],1), %%ymm13, %%ymm13\n\t"
      "vaddps (%[i3],%[ldi],2), %%ymm14, %%ymm14\n\t"
      "vaddps 32(%[i3],%[ldi],2), %%ymm15, %%ymm15\n\t"
      "5:\n\t"
      "vmovups %%ymm4, (%[o0])\n\t"
      "vmovups %%ymm5, 32(%[o0])\n\t"
      "vmovups %%ymm6, (%[o0],%[ldo],1)\n\t"
      "vmovups %%ymm7, 32(%[o0],%[ldo],1)\n\t"
      "vmovups %%ymm8, (%[o0],%[ldo],2)\n\t"
      "vmovups %%ymm9, 32(%[o0],%[ldo],2)\n\t"
      "vmovups %%ymm10, (%[o3])\n\t"
      "vmovups %%ymm11, 32(%[o3])\n\t"
      "vmovups %%ymm12, (%[o3],%[ldo],1)\n\t"
      "vmovups %%ymm13, 32(%[o3],%[ldo],1)\n\t"
      "vmovups %%ymm14, (%[o3],%[ldo],2)\n\t"
      "vmovups %%ymm15, 32(%[o3],%[ldo],2)\n\t"
      "vzeroupper\n\t"
      : [a] "+r"(a), [b] "+r"(b), [quads] "+r"(quads), [rest] "+r"(rest)
      : [i0] "r"(c.in), [i3] "r"(c.in + 3 * c.ld_in), [ldi] "r"(c.ld_in * int64_t{sizeof(float)}),
        [o0] "r"(c.out), [o3] "r"(c.out + 3 * c.ld_out),
        [ldo] "r"(c.ld_out * int64_t{sizeof(float)}), [accumulate] "r"(int64_t{c.accumulate})
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
#undef LOOM_GEMM_K
}

[[gnu::noinline, gnu::visibility("hidden")]] inline void
Kernel<double, CpuIsa::kAvx2>::micro_kernel(int64_t kc, const double* a, const double* b,
                                            const CTile<double>& c) {
  __m256d acc[6][2];
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_pd();
  for (int64_t p = 0; p < kc; ++p, a += 6, b += 8) {
    const __m256d b0 = _mm256_load_pd(b), b1 = _mm256_load_pd(b + 4);
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      const __m256d ai = _mm256_broadcast_sd(a + i);
      acc[i][0] = _mm256_fmadd_pd(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_pd(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) {
    if (c.accumulate) {
      acc[i][0] = _mm256_add_pd(acc[i][0], _mm256_loadu_pd(c.in + i * c.ld_in));
      acc[i][1] = _mm256_add_pd(acc[i][1], _mm256_loadu_pd(c.in + i * c.ld_in + 4));
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) {
    _mm256_storeu_pd(c.out + i * c.ld_out, acc[i][0]);
    _mm256_storeu_pd(c.out + i * c.ld_out + 4, acc[i][1]);
  }
}

// The end of a tile of 32 floats per row held in zmm registers, R rows of which the first
// `rows` are stored, shared by the AVX-512 kernels (the 12-row tile and Note [Edge tiles]):
// c.out = (c.accumulate ? c.in : 0) + acc, every load before any store (as in the AVX2 kernel).
template <int R>
[[gnu::always_inline, gnu::target("avx512f")]] inline void store_rows_x32(__m512 (&acc)[R][2],
                                                                          int64_t rows,
                                                                          const CTile<float>& c) {
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    if (i < rows && c.accumulate) {
      acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(c.in + i * c.ld_in));
      acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(c.in + i * c.ld_in + 16));
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    if (i < rows) {
      _mm512_storeu_ps(c.out + i * c.ld_out, acc[i][0]);
      _mm512_storeu_ps(c.out + i * c.ld_out + 16, acc[i][1]);
    }
  }
}

// The whole 12 x 32 tile.
[[gnu::always_inline, gnu::target("avx512f")]] inline void store_tile_12x32(__m512 (&acc)[12][2],
                                                                            const CTile<float>& c) {
  store_rows_x32<12>(acc, 12, c);
}

// Fetches line `line` (0-23; row line / 2, half line % 2) of a 12 x 32 float C tile into L1:
// from `in` when the tile accumulates, and `out` when it is written elsewhere or not read.
[[gnu::always_inline]] inline void prefetch_tile_line_12x32(const CTile<float>& c, int line) {
  const int64_t row = line / 2, col = line % 2 * 16;
  if (c.accumulate)
    _mm_prefetch(reinterpret_cast<const char*>(c.in + row * c.ld_in + col), _MM_HINT_T0);
  if (c.out != c.in || !c.accumulate)
    _mm_prefetch(reinterpret_cast<const char*>(c.out + row * c.ld_out + col), _MM_HINT_T0);
}

// Note [Prefetching the C tile]
// C is the one operand that does not come from the packed blocks: its 24 lines lie 12 rows
// apart in a matrix that is usually far larger than L2 (a 1024^2 float C is 4 MiB), so the
// loads before the stores miss to L3. On an AVX-512 Xeon with 48 KiB of L1 that cost a 12 x 32
// tile a tenth of its time when the A and B panels were hot (0.90 of the FMA peak against
// 1.00). Prefetching all 24 lines at the start fills the line-fill buffers that the A stream
// needs and lets the lines go cold again over 192 k steps; one line every 4 k steps spreads
// the misses and lands them shortly before the stores (1024^3 GEMM, 1 thread: about 0.80 of
// peak with none, 0.83 all at the start, 0.86 spread; docs/cpu_speed.md). The spread ends
// kLead steps before the stores: a line fetched 4 steps (about 100 cycles) before them can
// still be on its way from L3 on an AMD EPYC (Zen 4), whose kernel gained 3% on 1 thread (1-2%
// on 2) when the spread ended 16 to 64 steps earlier (32 is in the middle). When kc is too
// short for the spread, the lines it cannot reach are fetched at the start.
// The k loop runs in phases, four k per pass: the quiet one without prefetches, the spread with
// one C line fetched per pass, and the lead. Written as one loop with the prefetch test inside,
// each k paid a compare and two branches beside its 24 FMAs, and the 1024^3 GEMM ran about 2%
// slower. The accumulators are named registers of a fixed tile; GCC keeps all 24 in zmm
// registers and broadcasts each value of A into one register (vbroadcastss; renaming makes the
// twelve independent). Folding the broadcasts into the FMAs ({1to16}, written as inline
// assembly) measured the same on the Xeon and slower on the EPYC.
//
// TilePrefetch is that schedule over a kernel's `steps` (k for the float kernel, pairs of k for
// bfloat16's; a step is 24 multiply-add instructions in either): steps [0, quiet) fetch
// nothing, [quiet, spread_end) fetch one line at the start of every kStride, the last kLead
// steps nothing, and `early` lines are fetched before the first step.
struct TilePrefetch {
  static constexpr int kLines = 24, kStride = 4, kLead = 32;
  int64_t spread_end, quiet;
  int early;
  explicit TilePrefetch(int64_t steps)
      : spread_end(steps - std::min<int64_t>(kLead, steps)),
        quiet(std::max<int64_t>(spread_end - kLines * kStride, 0)),
        early(static_cast<int>(
            std::max<int64_t>(kLines - (spread_end - quiet + kStride - 1) / kStride, 0))) {}
};

// One k of the first R rows of a 12-row A panel against a 32-float B row: R = 12 for the full
// tile, 4 or 8 for Note [Edge tiles].
template <int R>
[[gnu::always_inline, gnu::target("avx512f")]] inline void k_step_rows_x32(__m512 (&acc)[R][2],
                                                                           const float* a,
                                                                           const float* b) {
  const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    const __m512 ai = _mm512_set1_ps(a[i]);
    acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
    acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
  }
}

[[gnu::always_inline, gnu::target("avx512f")]] inline void k_step_12x32(__m512 (&acc)[12][2],
                                                                        const float* a,
                                                                        const float* b) {
  k_step_rows_x32<12>(acc, a, b);
}

[[gnu::always_inline, gnu::target("avx512f")]] inline void k_steps_4_12x32(__m512 (&acc)[12][2],
                                                                           const float* a,
                                                                           const float* b) {
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) k_step_12x32(acc, a + 12 * q, b + 32 * q);
}

[[gnu::noinline, gnu::visibility("hidden"), gnu::target("avx512f")]] inline void
Kernel<float, CpuIsa::kAvx512>::micro_kernel(int64_t kc, const float* a, const float* b,
                                             const CTile<float>& c) {
  constexpr int kStride = TilePrefetch::kStride;
  const TilePrefetch schedule(kc);
  int line = 0;
  for (; line < schedule.early; ++line) prefetch_tile_line_12x32(c, line);
  __m512 acc[12][2];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + kStride <= schedule.quiet; p += kStride, a += 12 * kStride, b += 32 * kStride)
    k_steps_4_12x32(acc, a, b);
  for (; p < schedule.quiet; ++p, a += 12, b += 32) k_step_12x32(acc, a, b);
  for (; p + kStride <= schedule.spread_end; p += kStride, a += 12 * kStride, b += 32 * kStride) {
    prefetch_tile_line_12x32(c, line++);
    k_steps_4_12x32(acc, a, b);
  }
  if (p < schedule.spread_end) prefetch_tile_line_12x32(c, line++);
  for (; p < schedule.spread_end; ++p, a += 12, b += 32) k_step_12x32(acc, a, b);
  for (; p + kStride <= kc; p += kStride, a += 12 * kStride, b += 32 * kStride)
    k_steps_4_12x32(acc, a, b);
  for (; p < kc; ++p, a += 12, b += 32) k_step_12x32(acc, a, b);
  store_tile_12x32(acc, c);
}

// Note [Edge tiles]
// A block of A whose rows are not a multiple of MR ends in a panel with fewer real rows (the
// rest packed as zeros): 1024 = 85 x 12 + 4, and a layer of 64 channels is 5 x 12 + 4, one
// tile in six. The full kernel computes such a tile whole, into a scratch tile that is then
// copied: a tile of 4 rows costs as much as one of 12. Kernels that have an edge_kernel(rows,
// kc, a, b, c) compute only the first 4 or 8 rows of the panel (A's stride stays MR) and store
// the `rows` real ones straight into C; it returns false for rows it does not take (more than
// 8: the whole tile is then nearly all real rows). Each row is the same chain of
// multiply-adds as in the full kernel, so the bits do not change. The C tile's lines are
// fetched at the start: the edge tiles are too few for the spread to matter. Paired in one
// process on an AMD EPYC, 1 thread: 1024^3 1.01x; [64 x 576] @ [576 x 4096] 1.11x in float32
// and 1.06x in bfloat16; [128 x 1152] @ [1152 x 1024] 1.02x.

// Fetches the lines of the first `rows` rows of a tile of C 32 floats wide.
inline void prefetch_rows_x32(const CTile<float>& c, int64_t rows) {
  for (int line = 0; line < 2 * rows; ++line) prefetch_tile_line_12x32(c, line);
}

// The tile of `rows` real rows on Four's kernel (4 rows) or Eight's (8); false for more rows,
// which the full kernel takes.
template <auto Four, auto Eight, typename P>
[[gnu::always_inline]] inline bool edge_rows(int64_t rows, int64_t kc, const P* a, const P* b,
                                             const CTile<float>& c) {
  if (rows > 8) return false;
  if (rows <= 4)
    Four(rows, kc, a, b, c);
  else
    Eight(rows, kc, a, b, c);
  return true;
}

// Rows [0, R) of the 12 x 32 float tile.
template <int R>
[[gnu::noinline, gnu::target("avx512f")]] inline void edge_tile_12x32(int64_t rows, int64_t kc,
                                                                      const float* a,
                                                                      const float* b,
                                                                      const CTile<float>& c) {
  prefetch_rows_x32(c, rows);
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p, a += 12, b += 32) k_step_rows_x32<R>(acc, a, b);
  store_rows_x32<R>(acc, rows, c);
}

[[gnu::noinline, gnu::visibility("hidden")]] inline bool
Kernel<float, CpuIsa::kAvx512>::edge_kernel(int64_t rows, int64_t kc, const float* a,
                                            const float* b, const CTile<float>& c) {
  return edge_rows<edge_tile_12x32<4>, edge_tile_12x32<8>>(rows, kc, a, b, c);
}
#endif  // LOOM_PACKED_GEMM_SIMD

// Calls f.template operator()<I>() with the instruction set whose packed kernels run here
// (kAvx512 for kAvx512Bf16 and kAmxBf16 too) and returns true; false on the generic path (Eigen's
// GEMM), or in a build without the kernels.
template <typename F>
bool with_packed_kernel([[maybe_unused]] F&& f) {
#if LOOM_PACKED_GEMM_SIMD
  switch (cpu_isa()) {
    case CpuIsa::kAmxBf16:
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512:
      f.template operator()<CpuIsa::kAvx512>();
      return true;
    case CpuIsa::kAvx2:
      f.template operator()<CpuIsa::kAvx2>();
      return true;
    case CpuIsa::kGeneric:
      break;
  }
#endif
  return false;
}

// Note [Balanced K blocks]
// Every pass over K reads and writes the whole of C, and the kernel's C traffic is paid per
// call however short its kc: K = 1024 in blocks of 192 ends with a pass of 64 that costs C's
// traffic for a third of the work. K is instead cut into the same number of passes of nearly
// equal depth (1024: 5 x 176 + 144), rounded up to a multiple of 8 so that an A panel (kc x 12
// floats) stays a whole number of cache lines: 1024^3 on 1 thread in a harness around this
// driver, 0.83-0.86 of the FMA peak for 192-deep blocks and 0.86-0.88 for balanced ones
// (docs/cpu_speed.md). The passes' boundaries set the order in which the sums are rounded: the
// result is the same for every thread count, not the same as with the unbalanced blocks.
template <typename B>
int64_t balanced_kc(int64_t k) {
  const int64_t passes = std::max<int64_t>((k + B::kc - 1) / B::kc, 1);
  const int64_t depth = ((k + passes - 1) / passes + 7) / 8 * 8;
  return std::min(depth, B::kc);
}

// C [m, n] (row stride ldc) = (accumulate ? C : 0) + A [m, k] @ B [k, n].
//   a_block(ic, mc, pc, kc, scratch) returns rows [ic, ic+mc) x columns [pc, pc+kc) of A as
//   MR-row panels ([kc, MR] each, rows past m zero), packing into `scratch` or pointing into a
//   pre-packed copy; pack_b(pc, kc, jc, nc, dst) packs B's block as NR-column panels ([kc, NR]
//   each, columns past n zero) into dst, or returns a pointer to such a block packed earlier.
//   b_scratch holds KC x round_up(NC, NR), a_scratch MC x KC. (For a kernel whose k_group is 2,
//   read ceil(kc / 2) for kc, and KC / 2 for KC.) K is taken kc_step at a time (at most KC, a
//   multiple of k_group; balanced_kc's); callers whose A blocks were packed ahead at KC steps
//   keep the default.
// Note [Staging C]
// When C's rows are a multiple of 4 KiB apart (a 1024-wide float matrix, or conv2d's output on
// a 32 x 32 image), the six rows of a micro-tile fall into the same set of the L1 cache, beside
// the B panel the kernel is streaming: each pass over K then costs about 7% more (measured on a
// 1024^3 GEMM against the same GEMM with 1040-float rows). With more than one pass over K, the
// passes therefore accumulate in a scratch block with a harmless row stride: the first pass
// reads C (when accumulating) and writes the block, the middle ones read and write the block,
// and the last reads the block and writes C. C is touched twice instead of on every pass.
template <typename T>
bool rows_alias(int64_t ldc) {
  return ldc * static_cast<int64_t>(sizeof(T)) % 4096 == 0;
}

template <typename B, typename ABlock, typename PackB, typename T = typename B::Scalar,
          typename P = typename B::Packed>
void packed_gemm(int64_t m, int64_t n, int64_t k, ABlock&& a_block, PackB&& pack_b, T* c,
                 int64_t ldc, bool accumulate, P* b_scratch, P* a_scratch,
                 int64_t kc_step = B::kc) {
  static_assert(B::kc % B::k_group == 0, "a K block ends at the end of a group");
  kc_step = std::clamp<int64_t>(kc_step, B::k_group, B::kc) / B::k_group * B::k_group;
  if (k == 0 && !accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  const bool stage = k > kc_step && rows_alias<T>(ldc);
  alignas(64) T tile[B::mr * B::nr];
  for (int64_t jc = 0; jc < n; jc += B::nc) {
    const int64_t nc = std::min(B::nc, n - jc);
    ScratchFrame frame;
    T* staged = nullptr;
    int64_t lds = 0;
    if (stage) {
      lds = (nc + B::nr - 1) / B::nr * B::nr;
      if (rows_alias<T>(lds)) lds += B::nr;
      staged = frame.get<T>(m * lds);
    }
    for (int64_t pc = 0; pc < k; pc += kc_step) {
      const int64_t kc = std::min(kc_step, k - pc);
      const int64_t depth = (kc + B::k_group - 1) / B::k_group;  // rows of a packed panel
      const P* b_block = b_scratch;
      if constexpr (std::is_void_v<decltype(pack_b(pc, kc, jc, nc, b_scratch))>)
        pack_b(pc, kc, jc, nc, b_scratch);
      else
        b_block = pack_b(pc, kc, jc, nc, b_scratch);
      // This pass reads `in` (when accumulating) and writes `out`, both [m, nc].
      const bool first = pc == 0, last = pc + kc >= k;
      const T* in = stage && !first ? staged : c + jc;
      const int64_t ld_in = stage && !first ? lds : ldc;
      T* out = stage && !last ? staged : c + jc;
      const int64_t ld_out = stage && !last ? lds : ldc;
      const bool acc = accumulate || !first;
      for (int64_t ic = 0; ic < m; ic += B::mc) {
        const int64_t mc = std::min(B::mc, m - ic);
        const P* a = a_block(ic, mc, pc, kc, a_scratch);
        for (int64_t jr = 0; jr < nc; jr += B::nr) {
          const int64_t nr = std::min(B::nr, nc - jr);
          const P* b_panel = b_block + jr * depth;
          for (int64_t ir = 0; ir < mc; ir += B::mr) {
            const int64_t mr = std::min(B::mr, mc - ir);
            const T* tile_in = in + (ic + ir) * ld_in + jr;
            T* tile_out = out + (ic + ir) * ld_out + jr;
            if (mr == B::mr && nr == B::nr) {
              B::micro_kernel(kc, a + ir * depth, b_panel, {tile_in, ld_in, tile_out, ld_out, acc});
              continue;
            }
            if constexpr (requires { &B::edge_kernel; }) {  // Note [Edge tiles]
              if (nr == B::nr && B::edge_kernel(mr, kc, a + ir * depth, b_panel,
                                                {tile_in, ld_in, tile_out, ld_out, acc}))
                continue;
            }
            // An edge tile: computed whole into `tile`, then the part inside C is kept.
            B::micro_kernel(kc, a + ir * depth, b_panel, {tile, B::nr, tile, B::nr, false});
            for (int64_t i = 0; i < mr; ++i)
              for (int64_t j = 0; j < nr; ++j)
                tile_out[i * ld_out + j] =
                    (acc ? tile_in[i * ld_in + j] : T(0)) + tile[i * B::nr + j];
          }
        }
      }
    }
  }
}

#if LOOM_PACKED_GEMM_SIMD
// Note [Packing A's rows]
// When A's rows lie along k (A not transposed, or conv2d's weight), a panel interleaves MR rows
// that are usually a whole row of A apart: a multiple of 4 KiB for 1024-wide matrices. Element
// by element that is MR scattered loads per k. Instead MR x 8 (AVX2) or 12 x 16 (AVX-512) blocks
// are loaded a row vector at a time and transposed in registers, and since each row is only kc
// values, too short a stream for the hardware prefetcher to learn, the next panel's rows are
// fetched one line each while this one is transposed. On a 1024^3 GEMM with the AVX-512 kernel
// that took packing from 5.7% of the time to 2.6% (perf, 1 thread; docs/cpu_speed.md).

// v[i][j] becomes v[j][i]: eight rows of eight floats transposed in AVX registers (pairs of
// rows interleaved, then pairs of pairs, then the 128-bit halves exchanged). The packers of
// conv2d's engines and Winograd's tile gathers load and store around it.
[[gnu::always_inline]] inline void transpose_8x8(__m256 v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);  // a0 b0 c0 d0 | a4 b4 c4 d4
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int p = 0; p < 4; ++p) {  // column p: rows 0-3 from u[p], rows 4-7 from u[4 + p]
    v[p] = _mm256_permute2f128_ps(u[p], u[4 + p], 0x20);
    v[p + 4] = _mm256_permute2f128_ps(u[p], u[4 + p], 0x31);
  }
}

// dst[p * 6 + r] = src[r * ld + p] for r < 6, p < 8: six rows of eight floats, transposed in
// registers (as an 8 x 8 with two rows of zeros). It stops before transpose_8x8's last step:
// each column's six values are stored from the two halves where they lie, with no exchange.
[[gnu::always_inline]] inline void transpose_6x8(const float* src, int64_t ld, float* dst) {
  __m256 r[8];
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  r[6] = r[7] = _mm256_setzero_ps();
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);  // a0 b0 c0 d0 | a4 b4 c4 d4
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  // Column p is (low half of u[p % 4] | low half of u[4 + p % 4]) for p < 4, the high halves
  // for p >= 4; only its first six lanes (rows 0..5) are stored.
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    const __m256 lo = u[p % 4], hi = u[4 + p % 4];
    const __m128 rows03 = p < 4 ? _mm256_castps256_ps128(lo) : _mm256_extractf128_ps(lo, 1);
    const __m128 rows47 = p < 4 ? _mm256_castps256_ps128(hi) : _mm256_extractf128_ps(hi, 1);
    _mm_storeu_ps(dst + p * 6, rows03);
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + p * 6 + 4), rows47);
  }
}

inline void Kernel<float, CpuIsa::kAvx2>::pack_rows(const float* src, int64_t ld, int64_t kc,
                                                    const float* next, float* dst) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    if (next != nullptr && p % 16 == 0)
      for (int64_t r = 0; r < 6; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(next + r * ld + p), _MM_HINT_T0);
    transpose_6x8(src + p, ld, dst + p * 6);
  }
  for (; p < kc; ++p)
    for (int64_t r = 0; r < 6; ++r) dst[p * 6 + r] = src[r * ld + p];
}

// GCC 12 warns that the `_mm512_undefined_ps()` inside the unpack and extract intrinsics "may be
// used uninitialized" once they are inlined into a function with a target attribute: a false
// positive (that operand is the unused source of an unmasked instruction).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Column Q of a transposed 12 x 16 block: lane Q / 4 of the three 4 x 4 blocks that hold it.
template <int Q>
[[gnu::always_inline, gnu::target("avx512f")]] inline void store_column_12(const __m512 (&r)[12],
                                                                           float* dst) {
  constexpr int c = Q % 4, lane = Q / 4;
  _mm_storeu_ps(dst + Q * 12, _mm512_extractf32x4_ps(r[c], lane));
  _mm_storeu_ps(dst + Q * 12 + 4, _mm512_extractf32x4_ps(r[4 + c], lane));
  _mm_storeu_ps(dst + Q * 12 + 8, _mm512_extractf32x4_ps(r[8 + c], lane));
}

template <int... Q>
[[gnu::always_inline, gnu::target("avx512f")]] inline void store_columns_12(
    const __m512 (&r)[12], float* dst, std::integer_sequence<int, Q...> /*columns*/) {
  (store_column_12<Q>(r, dst), ...);
}

// dst[p * 12 + r] = src[r * ld + p] for r < 12, p < 16. Each 128-bit lane of the twelve rows is
// a 4 x 4 block, transposed by unpacking pairs of rows and shuffling pairs of those (as the 8 x 8
// above, per lane); column p is then lane p / 4 of three blocks, stored 4 floats at a time.
[[gnu::always_inline, gnu::target("avx512f")]] inline void transpose_12x16(const float* src,
                                                                           int64_t ld, float* dst) {
  __m512 x[12], t[12], r[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) x[i] = _mm512_loadu_ps(src + i * ld);
#pragma GCC unroll 6
  for (int i = 0; i < 12; i += 2) {
    t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5 | ...
    t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
  }
  // r[4g + c], lane l: rows 4g..4g+3 of column c + 4l.
#pragma GCC unroll 3
  for (int g = 0; g < 12; g += 4) {
    r[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    r[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    r[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    r[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  store_columns_12(r, dst, std::make_integer_sequence<int, 16>());
}

[[gnu::noinline, gnu::visibility("hidden"), gnu::target("avx512f")]] inline void
Kernel<float, CpuIsa::kAvx512>::pack_rows(const float* src, int64_t ld, int64_t kc,
                                          const float* next, float* dst) {
  int64_t p = 0;
  for (; p + 16 <= kc; p += 16) {
    if (next != nullptr)
      for (int64_t r = 0; r < 12; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(next + r * ld + p), _MM_HINT_T0);
    transpose_12x16(src + p, ld, dst + p * 12);
  }
  for (; p < kc; ++p)
    for (int64_t r = 0; r < 12; ++r) dst[p * 12 + r] = src[r * ld + p];
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// A [m, kc] with A(i, p) = src[i rs + p cs] as MR-row panels [kc, MR], rows past m zero.
template <typename K, typename T = typename K::Scalar>
void pack_a(const T* src, int64_t rs, int64_t cs, int64_t m, int64_t kc, T* dst) {
  constexpr int64_t mr = K::mr;
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += kc * mr) {
    const int64_t rows = std::min(mr, m - i0);
    if (rows == mr && cs == 1) {  // interleave MR contiguous rows: sequential writes
      const T* row = src + i0 * rs;
      if constexpr (requires { K::pack_rows(row, rs, kc, row, dst); }) {
        K::pack_rows(row, rs, kc, i0 + 2 * mr <= m ? row + mr * rs : nullptr, dst);
      } else {
        for (int64_t p = 0; p < kc; ++p)
          for (int64_t r = 0; r < mr; ++r) dst[p * mr + r] = row[r * rs + p];
      }
      continue;
    }
    if (rows == mr && rs == 1) {  // MR contiguous elements of each column
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < mr; ++r) dst[p * mr + r] = src[i0 + r + p * cs];
      continue;
    }
    if (rows < mr) std::fill(dst, dst + kc * mr, T(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = src + (i0 + r) * rs;
      for (int64_t p = 0; p < kc; ++p) dst[p * mr + r] = row[p * cs];
    }
  }
}
// B [kc, nc] with B(p, j) = src[p ld + j] as NR-column panels [kc, NR], columns past nc zero.
// Four rows at a time: the four are read front to back and dealt out to the panels, 4 x NR
// contiguous values to each. (Panel by panel would read kc rows ld apart for every panel, one
// cache miss and often one TLB miss per 64 bytes: that alone took a fifth of a 1024^3 GEMM. Row
// by row writes one line to each of nc / NR panels kc * NR apart, which for 1024^3 all fall in
// the same few cache sets: a third slower than four rows.)
template <typename K, typename T = typename K::Scalar>
void pack_b_rows(const T* src, int64_t ld, int64_t kc, int64_t nc, T* dst) {
  constexpr int64_t nr = K::nr, rows = 4;
  const int64_t full = nc / nr, tail = nc - full * nr;
  for (int64_t p0 = 0; p0 < kc; p0 += rows) {
    const int64_t count = std::min(rows, kc - p0);
    for (int64_t q = 0; q < full; ++q) {
      T* d = dst + q * kc * nr + p0 * nr;
      for (int64_t r = 0; r < count; ++r) std::copy_n(src + (p0 + r) * ld + q * nr, nr, d + r * nr);
    }
    if (tail > 0) {
      T* d = dst + full * kc * nr + p0 * nr;
      for (int64_t r = 0; r < count; ++r) {
        std::copy_n(src + (p0 + r) * ld + full * nr, tail, d + r * nr);
        std::fill(d + r * nr + tail, d + (r + 1) * nr, T(0));
      }
    }
  }
}

// B [kc, nc] with B(p, j) = src[p rs + j cs] (any layout, a transposed matrix included) as
// NR-column panels [kc, NR], columns past nc zero.
template <typename K, typename T = typename K::Scalar>
void pack_b_strided(const T* src, int64_t rs, int64_t cs, int64_t kc, int64_t nc, T* dst) {
  constexpr int64_t nr = K::nr;
  for (int64_t j0 = 0; j0 < nc; j0 += nr, dst += kc * nr) {
    const int64_t cols = std::min(nr, nc - j0);
    for (int64_t p = 0; p < kc; ++p) {
      T* d = dst + p * nr;
      for (int64_t j = 0; j < cols; ++j) d[j] = src[p * rs + (j0 + j) * cs];
      for (int64_t j = cols; j < nr; ++j) d[j] = T(0);
    }
  }
}

}  // namespace loom::cpu
