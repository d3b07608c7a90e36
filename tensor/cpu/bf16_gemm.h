// tensor/cpu/bf16_gemm.h — GEMM of bfloat16 operands with float32 accumulation. On CPUs with
// AMX it runs tdpbf16ps on tiles (Note [bf16 products on AMX tiles]); on CPUs with AVX512_BF16,
// vdpbf16ps; both in the packed driver of tensor/cpu/packed_gemm.h, on operands packed in
// k-pairs (Note [bf16 dot products]); elsewhere it widens the operands to float32 for
// cpu::gemm<float>. The matrix products of bfloat16 tensors use it (Note [16-bit products on the
// CPU] in tensor/linalg.cpp).
#pragma once

#include <cstdint>
#include <functional>

#include "tensor/cpu/packed_gemm.h"
#include "tensor/dtype.h"

namespace loom::cpu {

// Note [bf16 dot products]
//   vdpbf16ps (AVX512_BF16) reads each 32-bit lane of its two sources as a pair of bfloat16 and
//   adds both products of the pair to the float32 in that lane of the destination:
//     c[j] += a[2j+1] * b[2j+1], then c[j] += a[2j] * b[2j]      for j < 16
//   32 multiply-adds per 512-bit instruction, against 16 for a float32 FMA; how many of each
//   issue per cycle depends on the CPU (bf16_dot_peak_gflops and fma_peak_gflops measure both),
//   and vdpbf16ps may issue at a quarter of the FMAs' rate. The product of two bfloat16 is exact
//   in float32; each addition is rounded to nearest even; denormal inputs and results count as
//   zero. So the result is a float32 accumulation of 16-bit products, as the widened path's, but
//   summed in another order and with denormals flushed: not bitwise equal to it, within k
//   float32 roundings of it.
//
//   The GEMM therefore packs both operands in k-pairs: a packed element is the uint32 holding
//   A(i, 2q) in its low half and A(i, 2q+1) in its high half (B(2q, j) and B(2q+1, j) for B),
//   and an odd K ends in a pair whose high half is zero. An A panel is [ceil(kc / 2), 12] pairs,
//   a B panel [ceil(kc / 2), 32]. The micro-kernel is the AVX-512 float kernel's 12 x 32 tile
//   with a vdpbf16ps for each FMA: per pair of k, two vectors of B (32 columns), twelve pairs of
//   A broadcast from the panel, 24 instructions into 24 accumulators. The cache blocks hold the
//   float kernel's bytes: a B panel of 192 pairs is 24 KiB, in L1 (KC = 384 k); an A block
//   144 x 384 bfloat16 is 108 KiB, in L2.
//
//   alpha is applied to the float32 result, never to a bfloat16 operand (that would round it).

// Note [bf16 products on AMX tiles]
//   AMX adds eight tile registers of up to 16 rows of 64 bytes and tdpbf16ps, which multiplies
//   two of them as matrices of bfloat16 pairs into a third of float32: for a 16 x 16 C tile,
//       C[i][j] += sum over t < 16 of A[i][2t] B[2t][j] + A[i][2t+1] B[2t+1][j]
//   16 x 16 x 32 = 8192 multiply-adds per instruction, with the pair rule of vdpbf16ps (each
//   pair's products added to the float32 in turn, round to nearest even, denormals as zero).
//   Measured on the Intel Xeon of docs/cpu_speed.md: 3.1 TFLOP/s on one core from registers,
//   14 times its float32 FMA peak.
//   The micro-tile is 32 x 32 of C in four accumulator tiles (tmm0-3), two tiles of A (rows
//   0-15 and 16-31, tmm4-5) and two of B (columns 0-15 and 16-31, tmm6-7): per 32 k, four tile
//   loads and four tdpbf16ps. The packed element is a chunk of 32 k (16 pairs, 64 bytes), so
//   the driver's panels are [ceil(kc / 32), 32] chunks:
//   - an A panel's chunk q holds its 32 rows one after another, each row's 32 k contiguous (a
//     tile row is a row of A: the rows are 64 bytes apart);
//   - a B panel's chunk q holds the 16 pairs of k one after another, each as 32 columns of
//     pairs (a tile row is a pair of k across 16 columns: the rows are 128 bytes apart).
//   k past kc, rows past m and columns past n are zero. C's tiles are loaded from C (strided)
//   and stored back: no float32 work outside the tile unit. Each thread sets its tile shapes
//   (ldtilecfg) once per GEMM and releases the tiles after (tilerelease), so no tile state
//   outlives a call. Blocks: a B panel of KC = 512 is 32 KiB (L1 holds it and streams A), an A
//   block of MC = 128 rows 128 KiB (L2).

// Whether gemm_bf16 multiplies bfloat16 directly here: this build has the vdpbf16ps kernel and
// cpu_isa() is kAvx512Bf16 or above (Note [CPU instruction sets] in tensor/cpu_info.h).
bool bf16_dot_products();

// Whether it does so on AMX tiles: cpu_isa() is kAmxBf16 (Note [bf16 products on AMX tiles]).
bool amx_bf16_products();

// Whether they run on the vdpbf16ps kernel (bf16_dot_products() and not AMX tiles), whose pair
// panels callers may pack themselves (gemm_bf16_pair_panels, dot_segments_12x32).
bool pair_panel_products();

// C [m, n] (float32, row stride ldc) = alpha op(A) op(B) + beta C, op(A) [m, k] of bfloat16
// (stored [m, k] with leading dim lda, or [k, m] when trans_a), likewise op(B) [k, n]: products
// of bfloat16 summed in float32, by tdpbf16ps where amx_bf16_products(), by vdpbf16ps where
// bf16_dot_products(), else by cpu::gemm<float>
// on the operands widened. beta = 0 ignores C (NaNs included). Threads split C's columns.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

#if LOOM_PACKED_GEMM_SIMD

// pack_b(pc, kc, j, nc, dst): rows [pc, pc + kc) and columns [j, j + nc) of a B [k, n] as
// 32-column panels of k-pairs, [ceil(kc / 2), 32] each (Note [bf16 dot products]), columns past
// nc and the high half of an odd kc's last pair zero. pc is even.
using PairPanelPacker =
    std::function<void(int64_t pc, int64_t kc, int64_t j, int64_t nc, uint32_t* dst)>;

// C [m, n] (float32, row stride ldc) = (accumulate ? C : 0) + A [m, k] (bfloat16, rows lda
// apart) @ B, B packed by the caller: conv2d packs image patches straight into the panels (Note
// [bf16 patch panels] in tensor/cpu/conv_bf16.cpp). Threads split C's columns, each packing its
// own; pack_b runs on them. The vdpbf16ps kernel only: ValueError unless bf16_dot_products() and
// not amx_bf16_products().
void gemm_bf16_pair_panels(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
                           const PairPanelPacker& pack_b, float* c, int64_t ldc,
                           bool accumulate = false);

// The pair (lo, hi) of consecutive k as the vdpbf16ps kernel reads it: lo in the low half.
inline uint32_t pair_of(BFloat16 lo, BFloat16 hi) {
  return lo.bits | static_cast<uint32_t>(hi.bits) << 16;
}

// Rows r < count (each src + r * ld_src, k contiguous) as `count` columns of a panel [pairs, ld]
// starting at dst: 8 x 8 transposes of pairs over whole groups of eight pairs, then one pair at
// a time, the last half zero when kc is odd. count is a multiple of 4 (12 for A, 32 for B).
void pack_rows_of_pairs(const BFloat16* src, int64_t ld_src, int64_t count, int64_t kc,
                        uint32_t* dst, int64_t ld);

// The vdpbf16ps micro-kernel (Note [bf16 dot products]): C's tile is float32, the packed panels
// hold pairs of bfloat16. Defined in bf16_gemm.cpp, compiled for AVX512F and AVX512_BF16, and
// reached only where cpu_isa() is kAvx512Bf16.
template <>
struct Kernel<BFloat16, CpuIsa::kAvx512Bf16> {
  using Scalar = float;
  using Packed = uint32_t;
  static constexpr int64_t k_group = 2;
  static constexpr int64_t mr = 12, nr = 32, kc = 384, mc = 144, nc = 3072;
  static void micro_kernel(int64_t kc, const uint32_t* a, const uint32_t* b, const CTile<float>& c);
  static bool edge_kernel(int64_t rows, int64_t kc, const uint32_t* a, const uint32_t* b,
                          const CTile<float>& c);
};

// One term of dot_segments_12x32: A's panel [pairs, 12] at a and B's [pairs, 32] at b, its
// rows ldb pairs apart (32: a packed panel; more where B is read where it lies).
struct PairSegment {
  const uint32_t* a;
  const uint32_t* b;
  int64_t pairs;
  int64_t ldb = 32;
};

// The first `rows` (1 to 12) rows of the vdpbf16ps kernel's 12 x 32 tile: C = (accumulate ? C :
// 0) + the sum of the segments' products, the tile in registers across all of them (the k loop
// of micro_kernel run over panels that do not follow one another). Defined in bf16_gemm.cpp,
// compiled for AVX512F and AVX512_BF16; where cpu_isa() is kAvx512Bf16 only.
void dot_segments_12x32(int64_t rows, const PairSegment* segments, int64_t count,
                        const CTile<float>& c);

// The packed element of the AMX kernel, 64 bytes (Note [bf16 products on AMX tiles]): the 32
// elements of an A panel's chunk are its 32 rows of 32 k; those of a B panel's chunk, its 16
// pairs of k across 32 columns.
struct alignas(64) AmxChunk {
  uint32_t pairs[16];
};

// The tdpbf16ps micro-kernel (Note [bf16 products on AMX tiles]), defined in bf16_gemm.cpp,
// compiled for AMX-TILE and AMX-BF16, reached only where cpu_isa() is kAmxBf16 and only on a
// thread whose tiles gemm_bf16 has configured.
template <>
struct Kernel<BFloat16, CpuIsa::kAmxBf16> {
  using Scalar = float;
  using Packed = AmxChunk;
  static constexpr int64_t k_group = 32;
  static constexpr int64_t mr = 32, nr = 32, kc = 512, mc = 128, nc = 3072;
  static void micro_kernel(int64_t kc, const AmxChunk* a, const AmxChunk* b, const CTile<float>& c);
};

#endif  // LOOM_PACKED_GEMM_SIMD

}  // namespace loom::cpu
