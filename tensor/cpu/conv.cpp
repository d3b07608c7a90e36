// tensor/cpu/conv.cpp — conv2d forward and backward on the CPU: GEMMs on the patches of the
// input, by a packed GEMM whose packers read the patches straight from the image (implicit
// im2col), or by im2col + cpu::gemm; parallel over the batch, one set of buffers per thread.
// The plan is Note [conv2d on the CPU]. The front (tensor/conv.cpp) checks the arguments.

#include "tensor/cpu/conv.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensor/copy.h"
#include "tensor/cpu/conv_direct.h"
#include "tensor/cpu/conv_nhwc.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/packed_gemm.h"
#include "tensor/cpu/winograd.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

using kernels::contiguous;
using kernels::Conv2dAlgorithm;
using kernels::Conv2dGrads;
using kernels::Conv2dOptions;
using kernels::Pair;

// Note [conv2d on the CPU]
//   Legend: N batch, C in channels, O out channels, G groups, Cg = C/G, Og = O/G, kernel kh x kw,
//   output Ho x Wo, P = Ho Wo pixels, K = Cg kh kw (the length of one input patch).
//   Per sample and group a convolution is one GEMM, out_g [Og,P] = W_g [Og,K] @ col_g [K,P],
//   where col (im2col) holds in column p the input patch that output pixel p sees (zeros in the
//   padding). The backward is two more GEMMs: dW_g += dout_g @ col_g^T, and dcol = W_g^T @ dout_g,
//   which col2im (the adjoint of im2col) adds into dx; with stride 1, dx is rather computed as a
//   convolution of dout (Note [dx as a convolution]), which needs no dcol and no col2im.
//
//   Threads: the batch is cut into one contiguous range of samples per thread ("part"); a part
//   runs single-threaded GEMMs with its own buffers, allocated once per call; dweight and dbias
//   are per-part partial sums added at the end. Convs under kMinParallelFlops stay on one thread.
//   Chunks: small images make thin GEMMs (P = 16 at 4x4), and the weight gradient, whose inner
//   dimension is P, would read and write all of dW for every sample; so a part takes its samples
//   in chunks of nb with nb P >= kMinColumns: the GEMMs see [K, nb P] patch matrices, the output
//   goes through an [Og, nb P] buffer scattered into [N, O, P], and dout is gathered likewise.
//
//   Two ways to multiply (Conv2dAlgorithm):
//   - kPacked (the default where the CPU has AVX2+FMA): a BLIS-style GEMM (packed_gemm below).
//     [KC x NR] panels of B and [MR x KC] panels of A meet in the micro-kernel of the
//     instruction set in use (a 6 x 16 tile of C in twelve 8-float registers with AVX2, 12 x 32
//     in 24 16-float ones with AVX-512). The B packers read the patches from a zero-padded copy of
//     the chunk, through a table of per-k offsets: no im2col buffer, no bounds checks, one copy (or
//     for the weight gradient, one 8x8 transpose) per run of pixels. The weight (forward) and its
//     transpose (backward data) are packed once per call, in parallel, and shared by all threads.
//     On the ResNet-18 layers this is 2-3x faster than kIm2colGemm (bench/README_conv.md).
//   - kIm2colGemm: im2col into a buffer, then cpu::gemm. Used on the generic path (no AVX2/FMA,
//     or LOOM_CPU_ISA=generic), and when the batch is smaller than the thread count (cpu::gemm
//     then threads each product, while kPacked would run on one thread).
//   A 1x1 stride-1 unpadded conv needs no im2col: its patch matrix is x itself.

namespace {

constexpr int64_t kMinColumns = 256;
constexpr double kMinParallelFlops = 4e6;

// ------------------------------------------------------------------ geometry and buffers

struct Geometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // weight
  int64_t ho, wo;      // output
  int64_t groups, cg, og, p, k;
  int64_t in_sample, out_sample;  // elements per sample of x and of out
  Pair stride, padding, dilation;
  bool direct;  // 1x1, stride 1, no padding: the patch matrix is x itself
  // For kernel column kj: the output columns [lo, hi) whose input column lies inside the image.
  std::vector<std::pair<int64_t, int64_t>> valid_cols;
  // The packed engine and col2im read x zero-padded to [C, hp, wp], where every patch is in
  // bounds, stored with rows `pitch` apart: as it is (pitch wp), or for stride-2 columns with
  // each row's even columns, then its odd ones (phases: Note [Stride-2 columns in phases]; pitch
  // 2 ceil(wp / 2)). col(k, pixel) = copy[patch_offset[k] + oh sh pitch + ow step], step sw, or
  // 1 in phases. flat: consecutive pixels are consecutive elements (stride 1 and wp == wo).
  int64_t hp, wp;
  bool flat, phases;
  int64_t pitch, step;
  std::vector<int64_t> patch_offset;  // k = (c, ki, kj) -> c hp pitch + ki dh pitch + column
};

Geometry make_geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh,
                       int64_t kw, const Conv2dOptions& opt) {
  Geometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.o = o, g.kh = kh, g.kw = kw;
  g.stride = opt.stride, g.padding = opt.padding, g.dilation = opt.dilation;
  g.ho = (h + 2 * opt.padding[0] - opt.dilation[0] * (kh - 1) - 1) / opt.stride[0] + 1;
  g.wo = (w + 2 * opt.padding[1] - opt.dilation[1] * (kw - 1) - 1) / opt.stride[1] + 1;
  g.groups = opt.groups, g.cg = c / g.groups, g.og = o / g.groups;
  g.p = g.ho * g.wo, g.k = g.cg * kh * kw;
  g.in_sample = c * h * w, g.out_sample = o * g.p;
  g.direct = kh == 1 && kw == 1 && opt.stride == Pair{1, 1} && opt.padding == Pair{0, 0};
  const int64_t sw = g.stride[1];
  for (int64_t kj = 0; kj < kw; ++kj) {
    const int64_t offset = kj * g.dilation[1] - g.padding[1];  // input column: ow sw + offset
    int64_t lo = offset >= 0 ? 0 : (-offset + sw - 1) / sw;
    int64_t hi = w - offset <= 0 ? 0 : (w - offset + sw - 1) / sw;
    lo = std::min(lo, g.wo);
    g.valid_cols.emplace_back(lo, std::clamp(hi, lo, g.wo));
  }
  g.hp = h + 2 * opt.padding[0], g.wp = w + 2 * opt.padding[1];
  g.flat = opt.stride == Pair{1, 1} && g.wp == g.wo;
  g.phases = sw == 2 && g.dilation[1] == 1 && kw > 1 && (g.hp != h || g.wp != w);
  g.pitch = g.phases ? 2 * ((g.wp + 1) / 2) : g.wp;
  g.step = g.phases ? 1 : sw;
  g.patch_offset.resize(g.k);
  for (int64_t ch = 0, k = 0; ch < g.cg; ++ch)
    for (int64_t ki = 0; ki < kh; ++ki)
      for (int64_t kj = 0; kj < kw; ++kj, ++k) {
        // Padded column kj dw; in phases, column kj / 2 of phase kj % 2.
        const int64_t column = g.phases ? kj % 2 * (g.pitch / 2) + kj / 2 : kj * g.dilation[1];
        g.patch_offset[k] = (ch * g.hp + ki * g.dilation[0]) * g.pitch + column;
      }
  return g;
}

// How the batch is cut: `parts` contiguous ranges, each taken in chunks of at most nb samples.
struct Schedule {
  int64_t parts, nb;
  bool small;  // too little work for several threads
  int64_t begin(int64_t part, int64_t n) const { return n * part / parts; }
};

Schedule schedule(const Geometry& g) {
  Schedule s;
  // Small convs stay on one thread: waking the others would cost more than it saves.
  const double flops =
      2.0 * static_cast<double>(g.n * g.og) * static_cast<double>(g.p * g.k * g.groups);
  s.small = flops < kMinParallelFlops;
  const int64_t threads = s.small ? 1 : get_num_threads();
  s.parts = std::clamp<int64_t>(threads, 1, std::max<int64_t>(g.n, 1));
  const int64_t per_part = (g.n + s.parts - 1) / s.parts;
  const int64_t want = (kMinColumns + g.p - 1) / std::max<int64_t>(g.p, 1);
  const int64_t nb = std::clamp<int64_t>(want, 1, std::max<int64_t>(per_part, 1));
  const int64_t chunks = (per_part + nb - 1) / nb;  // even out the chunks of a part
  s.nb = std::max<int64_t>(1, (per_part + chunks - 1) / chunks);
  return s;
}

// Uninitialised, 64-byte aligned scratch memory.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
Buffer<T> buffer(int64_t size) {
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(size, 1)) * sizeof(T) + 63) / 64 * 64;
  T* data = static_cast<T*>(std::aligned_alloc(64, bytes));
  LOOM_CHECK(data != nullptr, Error, "conv2d: out of memory asking for ", bytes,
             " bytes of scratch");
  return Buffer<T>(data);
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ------------------------------------------------------------------ im2col and its adjoint

// col [K, P] (row stride ldcol) = the patches of one sample's group of Cg channels x [Cg, H, W].
template <typename T>
void im2col(const T* x, const Geometry& g, T* col, int64_t ldcol) {
  const auto [sh, sw] = g.stride;
  for (int64_t c = 0; c < g.cg; ++c) {
    const T* plane = x + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * ldcol;
        const int64_t offset = kj * g.dilation[1] - g.padding[1];
        const auto [lo, hi] = g.valid_cols[kj];
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          T* dst = row + oh * g.wo;
          const int64_t ih = oh * sh - g.padding[0] + ki * g.dilation[0];
          if (ih < 0 || ih >= g.h) {
            std::fill(dst, dst + g.wo, T(0));
            continue;
          }
          const T* src = plane + ih * g.w;  // input column of ow: ow sw + offset
          std::fill(dst, dst + lo, T(0));
          if (sw == 1) {
            std::copy(src + lo + offset, src + hi + offset, dst + lo);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * sw + offset];
          }
          std::fill(dst + hi, dst + g.wo, T(0));
        }
      }
    }
  }
}

// The adjoint of im2col, for a chunk of cnt samples: dx [cnt, Cg, H, W] (sample stride
// g.in_sample) = the patch gradients in col [K, cnt P] summed where patches overlap. Channel c
// only receives rows (c, ., .) of col, so each (channel, sample) plane is accumulated on its
// own in a zero-padded scratch plane [hp, pitch] (no bounds checks), then its interior copied
// out; the col rows of a channel stay in cache while the samples go by. A stride-2 layer's plane
// is in column phases, as the packers' copy of x (Note [Stride-2 columns in phases]): each tap
// then adds runs of consecutive elements, and the interior is interleaved back on the way out.
template <typename T>
void col2im(const T* col, int64_t cnt, const Geometry& g, T* plane, T* dx) {
  const int64_t sh = g.stride[0], sw = g.step, pitch = g.pitch, half = pitch / 2;
  const int64_t taps = g.kh * g.kw, ldcol = cnt * g.p, pw = g.padding[1];
  for (int64_t c = 0; c < g.cg; ++c) {
    for (int64_t s = 0; s < cnt; ++s) {
      std::fill(plane, plane + g.hp * pitch, T(0));
      for (int64_t t = 0; t < taps; ++t) {
        const T* src = col + (c * taps + t) * ldcol + s * g.p;
        T* dst = plane + g.patch_offset[t];  // channel 0's taps
        for (int64_t oh = 0; oh < g.ho; ++oh, src += g.wo, dst += sh * pitch) {
          if (sw == 1) {
            for (int64_t ow = 0; ow < g.wo; ++ow) dst[ow] += src[ow];
          } else {
            for (int64_t ow = 0; ow < g.wo; ++ow) dst[ow * sw] += src[ow];
          }
        }
      }
      T* out = dx + s * g.in_sample + c * g.h * g.w;
      for (int64_t ih = 0; ih < g.h; ++ih) {
        const T* row = plane + (ih + g.padding[0]) * pitch;
        T* o = out + ih * g.w;
        if (!g.phases) {
          std::memcpy(o, row + pw, sizeof(T) * g.w);
          continue;
        }
        // Input column j is padded column j + pw: even j in phase pw % 2, odd j in the other.
        const T* even_j = row + pw % 2 * half + pw / 2;
        const T* odd_j = row + (pw + 1) % 2 * half + (pw + 1) / 2;
        for (int64_t m = 0; m < g.w / 2; ++m) {
          o[2 * m] = even_j[m];
          o[2 * m + 1] = odd_j[m];
        }
        if (g.w % 2) o[g.w - 1] = even_j[g.w / 2];
      }
    }
  }
}

// Rows [rows, P] of `cnt` samples (sample stride `stride`) side by side into dst [rows, cnt P].
template <typename T>
void gather_samples(const T* src, int64_t stride, int64_t cnt, int64_t rows, int64_t p, T* dst) {
  const int64_t ld = cnt * p;
  for (int64_t s = 0; s < cnt; ++s)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * ld + s * p, src + s * stride + r * p, sizeof(T) * p);
}

// The inverse of gather_samples.
template <typename T>
void scatter_samples(const T* src, int64_t cnt, int64_t rows, int64_t p, T* dst, int64_t stride) {
  const int64_t ld = cnt * p;
  for (int64_t s = 0; s < cnt; ++s)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + s * stride + r * p, src + r * ld + s * p, sizeof(T) * p);
}

// All of A [m, k] packed once, in the layout a_block hands out: KC-column blocks, each of
// round_up(m, MR) rows in MR-row panels. pack(src, rs, cs, pc) fills the block at column pc
// from A(i, p) = src[i rs + p cs].
template <typename K, typename T = typename K::Scalar>
class PackedA {
 public:
  PackedA(int64_t m, int64_t k)
      : m_(m), k_(k), m_padded_(round_up(m, K::mr)), data_(buffer<T>(m_padded_ * k)) {}
  void pack(const T* src, int64_t rs, int64_t cs, int64_t pc) {
    pack_a<K>(src + pc * cs, rs, cs, m_, std::min(K::kc, k_ - pc), data_.get() + pc * m_padded_);
  }
  const T* block(int64_t ic, int64_t pc, int64_t kc) const {
    return data_.get() + pc * m_padded_ + ic * kc;
  }

 private:
  int64_t m_, k_, m_padded_;
  Buffer<T> data_;
};

#if LOOM_PACKED_GEMM_SIMD
// dst[c ld + r] = rows[r][j + c] for 16 float rows (8 double rows) and the c < V columns of
// one vector: two 8x8 float transposes, or two 4x4 double transposes. ld is the panel's NR: 16
// and 8 for the AVX2 kernels' panels; the AVX-512 float kernel's 32-wide panels take two calls.
inline void transpose_rows(const float* const* rows, int64_t j, float* dst, int64_t ld = 16) {
  for (int half = 0; half < 2; ++half) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(rows[8 * half + i] + j);
    transpose_8x8(v);
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + 8 * half + c * ld, v[c]);
  }
}

inline void transpose_rows(const double* const* rows, int64_t j, double* dst, int64_t ld = 8) {
  for (int half = 0; half < 2; ++half) {
    const double* const* r = rows + 4 * half;
    const __m256d r0 = _mm256_loadu_pd(r[0] + j), r1 = _mm256_loadu_pd(r[1] + j);
    const __m256d r2 = _mm256_loadu_pd(r[2] + j), r3 = _mm256_loadu_pd(r[3] + j);
    const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
    const __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    double* d = dst + 4 * half;
    _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(d + ld, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(d + 2 * ld, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(d + 3 * ld, _mm256_permute2f128_pd(t1, t3, 0x31));
  }
}
#endif

// x planes [H, W] -> [H + 2 ph, W + 2 pw] with zeros around.
template <typename T>
void pad_planes(const T* x, int64_t planes, int64_t h, int64_t w, int64_t ph, int64_t pw, T* dst) {
  const int64_t wp = w + 2 * pw;
  for (int64_t i = 0; i < planes; ++i) {
    const T* src = x + i * h * w;
    std::fill(dst, dst + ph * wp, T(0));
    dst += ph * wp;
    for (int64_t r = 0; r < h; ++r, dst += wp, src += w) {
      std::fill(dst, dst + pw, T(0));
      std::copy(src, src + w, dst + pw);
      std::fill(dst + pw + w, dst + wp, T(0));
    }
    std::fill(dst, dst + ph * wp, T(0));
    dst += ph * wp;
  }
}

// Note [Stride-2 columns in phases]
// With stride 2 the pixels of an output row read every other column of the padded image, and
// the packers gathered them one element at a time: about 40% of a 32->64 stride-2 forward at
// 16 x 16 (perf). Each padded row is instead copied as its even columns followed by its odd
// ones (pad_planes_in_phases). Tap kj of output column ow then reads column ow + kj / 2 of phase
// kj % 2: consecutive pixels are consecutive elements again, and the packers take their
// stride-1 paths (copies and register transposes). The packed panels hold the same values, so
// the results are the same to the bit.

// x planes [H, W] -> padded planes [H + 2 ph, W + 2 pw] stored in phases: each padded row's
// even columns in [0, wq), its odd ones in [wq, 2 wq), wq = ceil((W + 2 pw) / 2), zeros past
// the row. Each row is padded in `row` (2 wq values, its borders kept zero) and dealt out from
// there, a loop with no bounds to test.
template <typename T>
void pad_planes_in_phases(const T* x, int64_t planes, int64_t h, int64_t w, int64_t ph, int64_t pw,
                          T* row, T* dst) {
  const int64_t wq = (w + 2 * pw + 1) / 2, pitch = 2 * wq;
  std::fill(row, row + pitch, T(0));
  for (int64_t i = 0; i < planes; ++i) {
    const T* src = x + i * h * w;
    std::fill(dst, dst + ph * pitch, T(0));
    dst += ph * pitch;
    for (int64_t r = 0; r < h; ++r, dst += pitch, src += w) {
      std::copy(src, src + w, row + pw);
      for (int64_t c = 0; c < wq; ++c) {
        dst[c] = row[2 * c];
        dst[wq + c] = row[2 * c + 1];
      }
    }
    std::fill(dst, dst + ph * pitch, T(0));
    dst += ph * pitch;
  }
}

// The patch matrix col(k, n) of a chunk, read from its padded copy xp [cnt, C, hp, pitch] (from
// the group's first channel), for k in [k0, k0+kn) and columns n in [n0, n0+nn) (n = sample P
// + pixel), written to dst[(k-k0) k_stride + (n-n0) NStride]. Columns go in runs that are
// consecutive in xp (one output row, or a whole sample when flat): per (run, k) one copy.
template <typename K, int64_t NStride, typename T>
void pack_patches(const T* xp, const Geometry& g, int64_t k0, int64_t kn, int64_t n0, int64_t nn,
                  T* dst, int64_t k_stride) {
  const int64_t sh = g.stride[0], sw = g.step;
  const int64_t* offset = g.patch_offset.data() + k0;
  const int64_t sample = g.c * g.hp * g.pitch;
  for (int64_t n = n0; n < n0 + nn;) {
    const int64_t s = n / g.p, pixel = n % g.p;
    int64_t len;
    const T* base = xp + s * sample;
    if (g.flat) {
      len = std::min(g.p - pixel, n0 + nn - n);
      base += pixel;
    } else {
      const int64_t oh = pixel / g.wo, ow = pixel % g.wo;
      len = std::min(g.wo - ow, n0 + nn - n);
      base += oh * sh * g.pitch + ow * sw;
    }
    T* d = dst + (n - n0) * NStride;
    if (NStride == 1 && len == K::nr && sw == 1) {  // a whole panel row: fixed size
      for (int64_t kk = 0; kk < kn; ++kk)
        std::memcpy(d + kk * k_stride, base + offset[kk], sizeof(T) * K::nr);
    } else if (sw == 1) {
#if LOOM_PACKED_GEMM_SIMD
      // 16 float rows (8 double) per transpose: one for the AVX2 kernels' panels, two for the
      // AVX-512 float kernel's 32. Element by element, the 32-wide panels' packing was half of
      // a weight gradient's time at 32 channels (docs/cpu_speed.md).
      constexpr int64_t per_transpose = 64 / sizeof(T);
      if (K::nr % per_transpose == 0 && NStride == K::nr && kn == K::nr && k_stride == 1) {
        // NR patch rows x len pixels -> [len, NR]: vector transposes, then the leftover columns
        const T* rows[K::nr];
        for (int64_t kk = 0; kk < kn; ++kk) rows[kk] = base + offset[kk];
        constexpr int64_t v = 32 / sizeof(T);
        int64_t j = 0;
        for (; j + v <= len; j += v)
          for (int64_t r0 = 0; r0 < K::nr; r0 += per_transpose)
            transpose_rows(rows + r0, j, d + j * NStride + r0, NStride);
        for (; j < len; ++j)
          for (int64_t kk = 0; kk < kn; ++kk) d[j * NStride + kk] = rows[kk][j];
        n += len;
        continue;
      }
#endif
      for (int64_t kk = 0; kk < kn; ++kk) {
        const T* src = base + offset[kk];
        T* dk = d + kk * k_stride;
#pragma GCC ivdep
        for (int64_t j = 0; j < len; ++j) dk[j * NStride] = src[j];
      }
    } else {
      for (int64_t kk = 0; kk < kn; ++kk) {
        const T* src = base + offset[kk];
        T* dk = d + kk * k_stride;
#pragma GCC ivdep
        for (int64_t j = 0; j < len; ++j) dk[j * NStride] = src[j * sw];
      }
    }
    n += len;
  }
}

// ------------------------------------------------------------------ the two GEMM engines
//
// Each engine computes, for a chunk of cnt samples side by side (cols = cnt P columns) and one
// group g, the three products of Note [conv2d on the CPU]:
//   forward:     c [Og, cols] (row stride cols) = (accumulate ? c : 0) + W_g @ col(x_g)
//   weight_grad: dw_g [Og, K] = (accumulate ? dw_g : 0) + dy_g [Og, cols] @ col(x_g)^T
//   data_grad:   dcol [K, cols] = W_g^T @ dy_g
// where x is the chunk given to set_chunk. Shared is built once per call, before the threads
// start; an engine is built per part and holds that part's buffers.

template <typename T>
class Im2colEngine {
 public:
  struct Shared {
    Shared(const Geometry&, const T* w, bool, bool) : weight(w) {}
    const T* weight;
  };
  Im2colEngine(const Geometry& g, const Schedule& s, const Shared& shared)
      : g_(g), weight_(shared.weight) {
    if (!g.direct)
      col_ = buffer<T>(g.k * s.nb * g.p);
    else if (s.nb > 1)
      col_ = buffer<T>(g.cg * s.nb * g.p);
  }

  void set_chunk(const T* x, int64_t cnt) { x_ = x, cnt_ = cnt; }
  void forward(int64_t grp, T* c, bool accumulate) {
    const int64_t cols = cnt_ * g_.p;
    cpu::gemm<T>(false, false, g_.og, cols, g_.k, T(1), weight_ + grp * g_.og * g_.k, g_.k,
                 patches(grp), cols, accumulate ? T(1) : T(0), c, cols);
  }
  void weight_grad(const T* dy_g, int64_t grp, T* dw_g, bool accumulate) {
    const int64_t cols = cnt_ * g_.p;
    cpu::gemm<T>(false, true, g_.og, g_.k, cols, T(1), dy_g, cols, patches(grp), cols,
                 accumulate ? T(1) : T(0), dw_g, g_.k);
  }
  void data_grad(const T* dy_g, int64_t cnt, int64_t grp, T* dcol) {
    const int64_t cols = cnt * g_.p;
    cpu::gemm<T>(true, false, g_.k, cols, g_.og, T(1), weight_ + grp * g_.og * g_.k, g_.k, dy_g,
                 cols, T(0), dcol, cols);
  }

 private:
  // The chunk's patch matrix [K, cols]: x itself for one direct sample, else built in col_.
  const T* patches(int64_t grp) {
    const T* x_g = x_ + grp * g_.cg * g_.h * g_.w;
    if (g_.direct && cnt_ == 1) return x_g;
    if (g_.direct) {
      gather_samples(x_g, g_.in_sample, cnt_, g_.cg, g_.p, col_.get());
    } else {
      for (int64_t i = 0; i < cnt_; ++i)
        im2col(x_g + i * g_.in_sample, g_, col_.get() + i * g_.p, cnt_ * g_.p);
    }
    return col_.get();
  }

  const Geometry& g_;
  const T* weight_;
  const T* x_ = nullptr;
  int64_t cnt_ = 0;
  Buffer<T> col_;
};

template <typename B, typename T = typename B::Scalar>
class PackedEngine {
 public:
  // W_g packed for the forward, W_g^T for the data gradient, each group once; the blocks are
  // packed in parallel.
  struct Shared {
    Shared(const Geometry& g, const T* weight, bool forward, bool data_grad) {
      struct Task {
        PackedA<B>* packed;
        const T* src;
        int64_t rs, cs, pc;
      };
      std::vector<Task> tasks;
      w.reserve(g.groups), wt.reserve(g.groups);
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* w_g = weight + grp * g.og * g.k;
        if (forward) {
          w.emplace_back(g.og, g.k);
          for (int64_t pc = 0; pc < g.k; pc += B::kc) tasks.push_back({&w.back(), w_g, g.k, 1, pc});
        }
        if (data_grad) {
          wt.emplace_back(g.k, g.og);
          for (int64_t pc = 0; pc < g.og; pc += B::kc)
            tasks.push_back({&wt.back(), w_g, 1, g.k, pc});
        }
      }
      const int64_t count = static_cast<int64_t>(tasks.size());
      const int64_t grain = g.o * g.k < (1 << 16) ? count + 1 : 1;  // small weights: inline
      parallel_for(0, count, grain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i)
          tasks[i].packed->pack(tasks[i].src, tasks[i].rs, tasks[i].cs, tasks[i].pc);
      });
    }
    std::vector<PackedA<B>> w, wt;
  };
  PackedEngine(const Geometry& g, const Schedule& s, const Shared& shared)
      : g_(g),
        shared_(shared),
        b_(buffer<T>(B::kc * round_up(std::min(B::nc, std::max(s.nb * g.p, g.k)), B::nr))),
        a_(buffer<T>(B::mc * B::kc)) {
    if (g.hp != g.h || g.wp != g.w) padded_ = buffer<T>(s.nb * g.c * g.hp * g.pitch);
    if (g.phases) row_ = buffer<T>(g.pitch);
  }

  void set_chunk(const T* x, int64_t cnt) {
    cnt_ = cnt;
    xp_ = x;
    if (padded_) {
      if (g_.phases)
        pad_planes_in_phases(x, cnt * g_.c, g_.h, g_.w, g_.padding[0], g_.padding[1], row_.get(),
                             padded_.get());
      else
        pad_planes(x, cnt * g_.c, g_.h, g_.w, g_.padding[0], g_.padding[1], padded_.get());
      xp_ = padded_.get();
    }
  }
  void forward(int64_t grp, T* c, bool accumulate) {
    const PackedA<B>& w = shared_.w[grp];
    const T* x_g = group_input(grp);
    packed_gemm<B>(
        g_.og, cnt_ * g_.p, g_.k,
        [&](int64_t ic, int64_t, int64_t pc, int64_t kc, T*) { return w.block(ic, pc, kc); },
        [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* dst) {
          for (int64_t j0 = 0; j0 < nc; j0 += B::nr, dst += kc * B::nr) {
            const int64_t cols = std::min(B::nr, nc - j0);
            if (cols < B::nr) std::fill(dst, dst + kc * B::nr, T(0));
            pack_patches<B, 1>(x_g, g_, pc, kc, jc + j0, cols, dst, B::nr);
          }
        },
        c, cnt_ * g_.p, accumulate, b_.get(), a_.get());
  }
  void weight_grad(const T* dy_g, int64_t grp, T* dw_g, bool accumulate) {
    const int64_t cols = cnt_ * g_.p;
    const T* x_g = group_input(grp);
    packed_gemm<B>(
        g_.og, g_.k, cols,
        [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* scratch) {
          pack_a<B>(dy_g + ic * cols + pc, cols, 1, mc, kc, scratch);
          return static_cast<const T*>(scratch);
        },
        [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* dst) {
          for (int64_t j0 = 0; j0 < nc; j0 += B::nr, dst += kc * B::nr) {
            const int64_t ks = std::min(B::nr, nc - j0);
            if (ks < B::nr) std::fill(dst, dst + kc * B::nr, T(0));
            pack_patches<B, B::nr>(x_g, g_, jc + j0, ks, pc, kc, dst, 1);
          }
        },
        dw_g, g_.k, accumulate, b_.get(), a_.get());
  }
  void data_grad(const T* dy_g, int64_t cnt, int64_t grp, T* dcol) {
    const int64_t cols = cnt * g_.p;
    const PackedA<B>& wt = shared_.wt[grp];
    packed_gemm<B>(
        g_.k, cols, g_.og,
        [&](int64_t ic, int64_t, int64_t pc, int64_t kc, T*) { return wt.block(ic, pc, kc); },
        [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* dst) {
          pack_b_rows<B>(dy_g + pc * cols + jc, cols, kc, nc, dst);
        },
        dcol, cols, false, b_.get(), a_.get());
  }

 private:
  const T* group_input(int64_t grp) const { return xp_ + grp * g_.cg * g_.hp * g_.pitch; }

  const Geometry& g_;
  const Shared& shared_;
  Buffer<T> b_, a_, padded_, row_;
  const T* xp_ = nullptr;
  int64_t cnt_ = 0;
};

// The packed engine of one instruction set's kernels, as the drivers' Engine<T>.
template <CpuIsa I>
struct Packed {
  template <typename T>
  using Engine = PackedEngine<Kernel<T, I>>;
};

// ------------------------------------------------------------------ the drivers

// Runs part(i) for every part: in parallel when there are several.
template <typename F>
void for_parts(int64_t parts, F&& part) {
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) part(i);
  });
}

template <typename T, template <typename> class Engine>
void conv2d_forward(const Geometry& g, const Schedule& s, const T* x, const T* weight,
                    const T* bias, T* out) {
  const typename Engine<T>::Shared shared(g, weight, /*forward=*/true, /*data_grad=*/false);
  for_parts(s.parts, [&](int64_t part) {
    Engine<T> engine(g, s, shared);
    const int64_t n_lo = s.begin(part, g.n), n_hi = s.begin(part + 1, g.n);
    Buffer<T> tmp;
    if (s.nb > 1) tmp = buffer<T>(g.og * s.nb * g.p);
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += s.nb) {
      const int64_t cnt = std::min(s.nb, n_hi - n0), cols = cnt * g.p;
      engine.set_chunk(x + n0 * g.in_sample, cnt);
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        T* out_g = out + n0 * g.out_sample + grp * g.og * g.p;
        T* c = cnt == 1 ? out_g : tmp.get();
        if (bias) {  // start from the bias, and let the GEMM add to it
          for (int64_t o = 0; o < g.og; ++o)
            std::fill(c + o * cols, c + (o + 1) * cols, bias[grp * g.og + o]);
        }
        engine.forward(grp, c, bias != nullptr);
        if (cnt > 1) scatter_samples(c, cnt, g.og, g.p, out_g, g.out_sample);
      }
    }
  });
}

// dweight, dbias, and dx through dcol + col2im when dx is not null.
template <typename T, template <typename> class Engine>
void conv2d_backward(const Geometry& g, const Schedule& s, const T* dout, const T* x,
                     const T* weight, T* dx, T* dweight, T* dbias) {
  const typename Engine<T>::Shared shared(g, weight, /*forward=*/false,
                                          /*data_grad=*/dx != nullptr);
  const int64_t weight_numel = g.o * g.k;
  // Partial sums of dweight and dbias: part 0 writes the outputs, the others their own buffers.
  std::vector<Buffer<T>> dweight_parts(s.parts), dbias_parts(s.parts);
  for_parts(s.parts, [&](int64_t part) {
    Engine<T> engine(g, s, shared);
    const int64_t n_lo = s.begin(part, g.n), n_hi = s.begin(part + 1, g.n);
    T* dw = dweight;
    T* db = dbias;
    if (part > 0 && dweight) dw = (dweight_parts[part] = buffer<T>(weight_numel)).get();
    if (part > 0 && dbias) db = (dbias_parts[part] = buffer<T>(g.o)).get();
    if (db) std::fill(db, db + g.o, T(0));
    Buffer<T> dcol, dout_chunk, padded;
    if (dx && !(g.direct && s.nb == 1)) dcol = buffer<T>(g.k * s.nb * g.p);
    if (dx && !g.direct) padded = buffer<T>(g.hp * g.pitch);
    if (s.nb > 1) dout_chunk = buffer<T>(g.o * s.nb * g.p);
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += s.nb) {
      const int64_t cnt = std::min(s.nb, n_hi - n0), cols = cnt * g.p;
      const T* dy = dout + n0 * g.out_sample;  // dout of the chunk as [O, cols]
      if (cnt > 1) {
        gather_samples(dy, g.out_sample, cnt, g.o, g.p, dout_chunk.get());
        dy = dout_chunk.get();
      }
      if (db) {  // dbias = sum over n, h, w of dout
        for (int64_t o = 0; o < g.o; ++o) {
          const T* row = dy + o * cols;
          T sum = 0;
          for (int64_t i = 0; i < cols; ++i) sum += row[i];
          db[o] += sum;
        }
      }
      if (dw) engine.set_chunk(x + n0 * g.in_sample, cnt);
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* dy_g = dy + grp * g.og * cols;
        if (dw) engine.weight_grad(dy_g, grp, dw + grp * g.og * g.k, n0 != n_lo);
        if (!dx) continue;
        T* dx_g = dx + n0 * g.in_sample + grp * g.cg * g.h * g.w;
        if (g.direct && cnt == 1) {  // dx_g is dcol
          engine.data_grad(dy_g, cnt, grp, dx_g);
        } else if (g.direct) {
          engine.data_grad(dy_g, cnt, grp, dcol.get());
          scatter_samples(dcol.get(), cnt, g.cg, g.p, dx_g, g.in_sample);
        } else {
          engine.data_grad(dy_g, cnt, grp, dcol.get());
          col2im(dcol.get(), cnt, g, padded.get(), dx_g);
        }
      }
    }
  });
  // Add the other parts' partial sums into the outputs, in parallel over elements.
  auto reduce = [&](T* total, const std::vector<Buffer<T>>& partial, int64_t size) {
    if (!total || s.parts == 1) return;
    parallel_for(0, size, 1 << 16, [&](int64_t lo, int64_t hi) {
      for (int64_t part = 1; part < s.parts; ++part) {
        const T* src = partial[part].get();
        for (int64_t i = lo; i < hi; ++i) total[i] += src[i];
      }
    });
  };
  reduce(dweight, dweight_parts, weight_numel);
  reduce(dbias, dbias_parts, g.o);
}

// Note [dx as a convolution]
//   With stride 1, dx[c, i, j] = sum over o, ki, kj of W[o, c, ki, kj] dout[o, i + p - ki d,
//   j + p - kj d]: the forward conv of dout with W flipped in space and with its channel dims
//   swapped (W'[c, o, kh-1-ki, kw-1-kj], per group), padding d (k-1) - p. It needs no dcol
//   buffer and no col2im, and reuses the forward's packing; it applies when p <= d (k-1).
// With few input channels (the first layer of a net) the GEMM would have too few rows; there
// dcol + col2im is faster.
bool dx_as_conv(const Geometry& g) {
  return g.stride == Pair{1, 1} && g.cg >= 16 && g.padding[0] <= g.dilation[0] * (g.kh - 1) &&
         g.padding[1] <= g.dilation[1] * (g.kw - 1);
}

template <typename T, template <typename> class Engine>
void conv2d_dx_as_conv(const Geometry& g, const T* dout, const T* weight, T* dx) {
  const Conv2dOptions options{
      {1, 1},
      {g.dilation[0] * (g.kh - 1) - g.padding[0], g.dilation[1] * (g.kw - 1) - g.padding[1]},
      g.dilation,
      g.groups};
  const Geometry gt = make_geometry(g.n, g.o, g.ho, g.wo, g.c, g.kh, g.kw, options);
  LOOM_ASSERT(gt.ho == g.h && gt.wo == g.w, "conv2d: transposed geometry");
  Buffer<T> flipped = buffer<T>(g.o * g.k);  // [C, Og, kh, kw]
  const int64_t taps = g.kh * g.kw;
  auto flip = [&](int64_t lo, int64_t hi) {  // input channels [lo, hi)
    for (int64_t ch = lo; ch < hi; ++ch) {
      const int64_t grp = ch / g.cg, c = ch % g.cg;
      for (int64_t o = 0; o < g.og; ++o) {
        const T* src = weight + ((grp * g.og + o) * g.cg + c) * taps;
        T* dst = flipped.get() + (ch * g.og + o) * taps;
        for (int64_t t = 0; t < taps; ++t) dst[taps - 1 - t] = src[t];
      }
    }
  };
  parallel_for(0, g.c, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(g.o * taps, 1)), flip);
  conv2d_forward<T, Engine>(gt, schedule(gt), dout, flipped.get(), nullptr, dx);
}

template <typename T, template <typename> class Engine>
void conv2d_backward_all(const Geometry& g, const T* dout, const T* x, const T* weight, T* dx,
                         T* dweight, T* dbias) {
  if (dx && dx_as_conv(g)) {
    conv2d_dx_as_conv<T, Engine>(g, dout, weight, dx);
    dx = nullptr;
  }
  if (dx || dweight || dbias)
    conv2d_backward<T, Engine>(g, schedule(g), dout, x, weight, dx, dweight, dbias);
}

// The ways conv2d can compute one layer's pass: the two engines of Note [conv2d on the CPU],
// Winograd where the layer has its shape (winograd_fits), and the direct 3x3 kernels where they
// run it (direct_fits). kPackedNhwc is Note [conv2d in channels-last]: a candidate only for a
// channels-last x.
enum class Method : uint8_t {
  kPacked,
  kIm2col,
  kWinogradF2x2,
  kWinogradF4x4,
  kDirect,
  kPackedNhwc
};

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kPacked:
      return "packed";
    case Method::kIm2col:
      return "im2col";
    case Method::kWinogradF2x2:
      return "winograd F(2x2,3x3)";
    case Method::kWinogradF4x4:
      return "winograd F(4x4,3x3)";
    case Method::kDirect:
      return "direct 3x3";
    case Method::kPackedNhwc:
      return "packed channels-last";
  }
  return "?";
}

// The layers Winograd computes: float32, 3x3, stride 1, no dilation, one group, padding up to 2.
bool winograd_fits(const Geometry& g, DType dtype) {
  return dtype == kFloat32 && g.kh == 3 && g.kw == 3 && g.stride == Pair{1, 1} &&
         g.dilation == Pair{1, 1} && g.groups == 1 && g.padding[0] <= 2 && g.padding[1] <= 2;
}

DirectShape direct_shape(const Geometry& g) {
  return {.n = g.n, .c = g.c, .h = g.h, .w = g.w, .o = g.o, .stride = g.stride[0]};
}

// The layers the direct 3x3 kernels compute: float32, 3x3, stride 1 or 2 (the same both ways),
// padding 1, no dilation, one group, and a shape direct_conv3x3_fits (AVX2 or AVX-512, output
// rows of whole vectors or with AVX-512 rows that divide one, 8 to 128 channels; stride 2 on
// even sides).
bool direct_fits(const Geometry& g, DType dtype) {
  return dtype == kFloat32 && g.kh == 3 && g.kw == 3 && g.stride[0] == g.stride[1] &&
         (g.stride[0] == 1 || g.stride[0] == 2) && g.padding == Pair{1, 1} &&
         g.dilation == Pair{1, 1} && g.groups == 1 && direct_conv3x3_fits(direct_shape(g));
}

// Note [Winograd in kAuto]
// kAuto takes Winograd F(4x4,3x3) for a layer it fits whose output holds at least one whole
// 4 x 4 tile, where both channel counts are at least 128, or at least 64 where the direct 3x3
// kernels do not take the layer (on AVX2, and for a channels-last x, which Winograd reads as it
// is: Note [Winograd in channels-last]). Its 36 products per tile replace 144 multiplies, and
// the transforms, paid per channel rather than per channel pair, shrink next to the
// per-frequency GEMMs as the channels grow. Measured, batch 64-128, 2 threads, AVX-512
// (docs/cpu_speed.md): the forward and the backward in 0.5-0.8 of the packed engine's time and
// 0.65-0.9 of the direct kernels' at 128 to 512 channels (4 x 4 to 16 x 16 images), level with
// the direct kernels at 64 channels, slower at 16; in channels-last, 0.55-0.85 of the packed
// channels-last engine's time from 64 channels. On the AVX2 kernels it wins from 64 channels
// (0.4-0.7 of the packed engine's time). Its error, at most 3.8e-6 of the output's range against
// float64 (Note [Winograd convolution]), is about 3x the direct kernels'; docs/decisions.md
// weighs that.
bool winograd_pays(const Geometry& g, DType dtype, bool direct) {
  const int64_t channels = std::min(g.c, g.o);
  return winograd_fits(g, dtype) && g.ho >= 4 && g.wo >= 4 &&
         (channels >= 128 || (channels >= 64 && !direct));
}

// What a fixed algorithm (not kBenchmark) computes this layer's forward or backward pass with.
// kAuto: where every thread gets samples (or the conv is small), Winograd F(4x4) where it pays
// (Note [Winograd in kAuto]), else the packed channels-last engine for a channels-last x it fits,
// else the direct 3x3 kernels where they pay for the pass (direct_conv3x3_pays: where they fit
// on AVX-512, faster than the packed engine; docs/decisions.md), else kPacked; else im2col +
// cpu::gemm, which threads each product. A Winograd or direct algorithm on a layer it does not
// fit takes kAuto's choice. A channels-last x that conv2d_nhwc fits (nhwc) is convolved as it is
// under kAuto and kPacked.
Method fixed_method(Conv2dAlgorithm algorithm, const Geometry& g, const Schedule& s, DType dtype,
                    bool nhwc, bool backward) {
  switch (algorithm) {
    case Conv2dAlgorithm::kPacked:
      return nhwc ? Method::kPackedNhwc : Method::kPacked;
    case Conv2dAlgorithm::kIm2colGemm:
      return Method::kIm2col;
    case Conv2dAlgorithm::kWinogradF2x2:
      if (winograd_fits(g, dtype)) return Method::kWinogradF2x2;
      break;
    case Conv2dAlgorithm::kWinogradF4x4:
      if (winograd_fits(g, dtype)) return Method::kWinogradF4x4;
      break;
    case Conv2dAlgorithm::kDirect:
      if (direct_fits(g, dtype)) return Method::kDirect;
      break;
    case Conv2dAlgorithm::kAuto:
    case Conv2dAlgorithm::kBenchmark:
      break;
  }
  if (s.small || s.parts == get_num_threads()) {
    if (nhwc)
      return winograd_pays(g, dtype, /*direct=*/false) ? Method::kWinogradF4x4
                                                       : Method::kPackedNhwc;
    const bool direct = direct_fits(g, dtype) && direct_conv3x3_pays(direct_shape(g), backward);
    if (winograd_pays(g, dtype, direct)) return Method::kWinogradF4x4;
    return direct ? Method::kDirect : Method::kPacked;
  }
  return Method::kIm2col;
}

// Note [Choosing convolutions by measurement]
//   Conv2dAlgorithm::kBenchmark does what PyTorch's torch.backends.cudnn.benchmark does for
//   cuDNN. The first call of each layer shape and pass times every method that computes it, on
//   the call's own data: the packed and im2col engines, and Winograd F(2x2) and F(4x4) where the
//   layer fits. Each runs twice and its faster run counts. The fastest method is kept for every
//   later call with the same shape, pass (forward; backward with the gradients asked for),
//   dtype, thread count and instruction set.
//
//   Accuracy is part of the candidacy, not of the race. Both Winograd tiles stay within 3e-6
//   relative error of float64 on ResNet-18's layers, a few times conv2d's own float32 rounding
//   (docs/cpu_speed.md; winograd_test bounds them). Larger tiles, such as F(6x6), lose
//   precision fast and are not candidates.
//
//   The choice depends on timings, so two runs can choose differently, and their results then
//   differ in the last bits. kAuto stays the default: its choice depends only on the shape and
//   the thread count, and training with it is reproducible to the bit. conv2d_choices() lists
//   what was chosen and how long each candidate took; resnet18_cifar prints it
//   (--conv-algorithm benchmark).
struct LayerKey {
  std::array<int64_t, 9> shape;  // n, c, h, w, o, kh, kw, stride h, stride w
  std::array<int64_t, 7> rest;   // pad h, pad w, groups, dilation h and w, dtype, threads
  int isa;
  int pass;   // 0 forward; 1 + the bits of the backward's needs (dx 1, dweight 2, dbias 4)
  bool nhwc;  // x channels-last, where kPackedNhwc is a candidate
  auto operator<=>(const LayerKey&) const = default;
};

struct Measured {
  Method chosen;
  std::vector<std::pair<Method, double>> seconds;  // each candidate's faster run
  int64_t calls = 0;                               // calls that used the choice
  int64_t order = 0;                               // when it was measured
};

std::mutex g_choices_mutex;
std::map<LayerKey, Measured>& choices() {
  static std::map<LayerKey, Measured> table;
  return table;
}

LayerKey layer_key(const Geometry& g, DType dtype, int pass, bool nhwc) {
  return {.shape = {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.stride[0], g.stride[1]},
          .rest = {g.padding[0], g.padding[1], g.groups, g.dilation[0], g.dilation[1],
                   static_cast<int64_t>(dtype), get_num_threads()},
          .isa = static_cast<int>(cpu_isa()),
          .pass = pass,
          .nhwc = nhwc};
}

// The method for this call. Under kBenchmark a layer not measured yet is measured first by
// run(method), which computes the pass into the call's outputs; the caller then runs the
// method returned, so the outputs are always the chosen method's.
template <typename Run>
Method choose_method(const Geometry& g, const Schedule& s, DType dtype, int pass, bool nhwc,
                     Run&& run) {
  const Conv2dAlgorithm algorithm = kernels::get_conv2d_algorithm();
  if (algorithm != Conv2dAlgorithm::kBenchmark)
    return fixed_method(algorithm, g, s, dtype, nhwc, /*backward=*/pass != 0);
  const LayerKey key = layer_key(g, dtype, pass, nhwc);
  {
    std::lock_guard lock(g_choices_mutex);
    if (auto it = choices().find(key); it != choices().end()) {
      ++it->second.calls;
      return it->second.chosen;
    }
  }
  std::vector<Method> candidates{Method::kPacked, Method::kIm2col};
  if (winograd_fits(g, dtype))
    candidates.insert(candidates.end(), {Method::kWinogradF2x2, Method::kWinogradF4x4});
  if (direct_fits(g, dtype)) candidates.push_back(Method::kDirect);
  if (nhwc) candidates.push_back(Method::kPackedNhwc);
  Measured measured{.chosen = candidates.front(), .seconds = {}};
  double best = std::numeric_limits<double>::infinity();
  for (const Method m : candidates) {
    double fastest = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < 2; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      run(m);
      fastest = std::min(
          fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    measured.seconds.emplace_back(m, fastest);
    if (fastest < best) {
      best = fastest;
      measured.chosen = m;
    }
  }
  measured.calls = 1;
  std::lock_guard lock(g_choices_mutex);
  measured.order = static_cast<int64_t>(choices().size());
  return choices().emplace(key, std::move(measured)).first->second.chosen;
}

std::optional<WinogradTile> winograd_tile(Method m) {
  if (m == Method::kWinogradF2x2) return WinogradTile::kF2x2;
  if (m == Method::kWinogradF4x4) return WinogradTile::kF4x4;
  return std::nullopt;
}

WinogradShape winograd_shape(const Geometry& g, bool channels_last) {
  return {.n = g.n,
          .c = g.c,
          .h = g.h,
          .w = g.w,
          .k = g.o,
          .pad_h = g.padding[0],
          .pad_w = g.padding[1],
          .channels_last = channels_last};
}

// run.template operator()<Engine>() with the engine of `m`: the packed one with the kernels of
// the instruction set in use, or im2col + cpu::gemm (also on the generic path).
template <typename F>
void with_engine(Method m, F&& run) {
  if (m == Method::kPacked && with_packed_kernel([&]<CpuIsa I>() {
        run.template operator()<Packed<I>::template Engine>();
      }))
    return;
  run.template operator()<Im2colEngine>();
}

// xc and out are contiguous NCHW, or for a Winograd method with channels_last, dense NHWC
// (Note [Winograd in channels-last] in tensor/cpu/winograd.cpp).
void conv2d_by(Method m, const Geometry& g, const Schedule& s, const Tensor& xc, const Tensor& wc,
               const Tensor& bc, const Tensor& out, bool channels_last = false) {
  const auto tile = winograd_tile(m);
  if (tile || m == Method::kDirect) {
    float* y = out.data_ptr<float>();
    if (tile)
      winograd_conv2d(winograd_shape(g, channels_last), *tile, xc.data_ptr<float>(),
                      wc.data_ptr<float>(), y);
    else
      direct_conv3x3(direct_shape(g), xc.data_ptr<float>(), wc.data_ptr<float>(), y);
    if (bc.defined()) {
      const float* b = bc.data_ptr<float>();
      if (channels_last) {
        parallel_for(0, g.n * g.p, 16, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i)
            for (int64_t o = 0; o < g.o; ++o) y[i * g.o + o] += b[o];
        });
      } else {
        parallel_for(0, g.n * g.o, 16, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i)
            for (float *v = y + i * g.p, *end = v + g.p; v < end; ++v) *v += b[i % g.o];
        });
      }
    }
    return;
  }
  dispatch_floating(xc.dtype(), "conv2d", [&]<typename T>() {
    const T* b = bc.defined() ? bc.data_ptr<T>() : nullptr;
    with_engine(m, [&]<template <typename> class Engine>() {
      conv2d_forward<T, Engine>(g, s, xc.data_ptr<T>(), wc.data_ptr<T>(), b, out.data_ptr<T>());
    });
  });
}

// dc, xc and grads.dx as conv2d_by's xc and out; grads.dweight contiguous.
void conv2d_backward_by(Method m, const Geometry& g, const Tensor& dc, const Tensor& xc,
                        const Tensor& wc, const Conv2dGrads& grads, bool channels_last = false) {
  const auto tile = winograd_tile(m);
  if (tile || m == Method::kDirect) {
    const float* dy = dc.data_ptr<float>();
    if (tile) {
      const WinogradShape shape = winograd_shape(g, channels_last);
      if (grads.dx.defined())
        winograd_conv2d_backward_data(shape, *tile, dy, wc.data_ptr<float>(),
                                      grads.dx.data_ptr<float>());
      if (grads.dweight.defined())
        winograd_conv2d_backward_weight(shape, *tile, xc.data_ptr<float>(), dy,
                                        grads.dweight.data_ptr<float>());
    } else {
      if (grads.dx.defined())
        direct_conv3x3_backward_data(direct_shape(g), dy, wc.data_ptr<float>(),
                                     grads.dx.data_ptr<float>());
      float* dw = grads.dweight.defined() ? grads.dweight.data_ptr<float>() : nullptr;
      if (dw && direct_weight_grad_pays(direct_shape(g))) {
        direct_conv3x3_backward_weight(direct_shape(g), xc.data_ptr<float>(), dy, dw);
      } else if (dw) {  // the packed engine's, where the lane sums would leave the cache
        with_engine(Method::kPacked, [&]<template <typename> class Engine>() {
          conv2d_backward_all<float, Engine>(g, dy, xc.data_ptr<float>(), wc.data_ptr<float>(),
                                             nullptr, dw, nullptr);
        });
      }
    }
    if (grads.dbias.defined()) {
      float* db = grads.dbias.data_ptr<float>();
      parallel_for(0, g.o, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          double sum = 0;
          if (channels_last) {
            for (int64_t i = 0; i < g.n * g.p; ++i) sum += dy[i * g.o + o];
          } else {
            for (int64_t n = 0; n < g.n; ++n)
              for (const float *v = dy + (n * g.o + o) * g.p, *end = v + g.p; v < end; ++v)
                sum += *v;
          }
          db[o] = static_cast<float>(sum);
        }
      });
    }
    return;
  }
  dispatch_floating(xc.dtype(), "conv2d_backward", [&]<typename T>() {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    with_engine(m, [&]<template <typename> class Engine>() {
      conv2d_backward_all<T, Engine>(g, dc.data_ptr<T>(), xc.data_ptr<T>(), wc.data_ptr<T>(),
                                     ptr(grads.dx), ptr(grads.dweight), ptr(grads.dbias));
    });
  });
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options, const Shape& out_shape) {
  // A channels-last x gets a channels-last result, as on cuDNN.
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty(out_shape, x.dtype(), x.device(), format);
  if (out.numel() == 0) return out;
  const Geometry g = make_geometry(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0),
                                   weight.size(2), weight.size(3), options);
  const Schedule s = schedule(g);
  const bool nhwc = conv2d_nhwc_fits(x, weight, options);
  const auto run = [&](Method m) {
    if (m == Method::kPackedNhwc) return conv2d_nhwc(x, weight, bias, options, out);
    const Tensor bc = bias.defined() ? contiguous(bias) : Tensor();
    if (nhwc && winograd_tile(m))  // Winograd reads and writes channels-last as it is
      return conv2d_by(m, g, s, x, contiguous(weight), bc, out, /*channels_last=*/true);
    // The NCHW engines, through NCHW copies where x is channels-last (timed with them).
    const Tensor y = format == MemoryFormat::kContiguous ? out : empty(out_shape, x.dtype());
    conv2d_by(m, g, s, contiguous(x), contiguous(weight), bc, y);
    if (y.data() != out.data()) kernels::copy_(out, y);
  };
  run(choose_method(g, s, x.dtype(), /*pass=*/0, nhwc, run));
  return out;
}

Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Conv2dOptions& options, std::array<bool, 3> needs) {
  // dx takes x's format and dweight the weight's, as on cuDNN. The kernels write every element;
  // an empty batch leaves zeros.
  const auto make = [zero = dout.numel() == 0](const Tensor& like) {
    const MemoryFormat format = suggest_memory_format(like);
    Tensor t = empty(like.sizes(), like.dtype(), like.device(), format);
    if (zero) kernels::fill_(t, 0);
    return t;
  };
  Conv2dGrads grads;
  if (needs[0]) grads.dx = make(x);
  if (needs[1]) grads.dweight = make(weight);
  if (needs[2]) {
    grads.dbias = empty({weight.size(0)}, x.dtype(), x.device());
    if (dout.numel() == 0) kernels::fill_(grads.dbias, 0);
  }
  if (dout.numel() == 0 || (!needs[0] && !needs[1] && !needs[2])) return grads;
  const Geometry g = make_geometry(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0),
                                   weight.size(2), weight.size(3), options);
  const int pass = 1 + (needs[0] ? 1 : 0) + (needs[1] ? 2 : 0) + (needs[2] ? 4 : 0);
  const bool nhwc = conv2d_nhwc_fits(x, weight, options);
  const auto run = [&](Method m) {
    if (m == Method::kPackedNhwc) return conv2d_nhwc_backward(dout, x, weight, options, grads);
    // The NCHW engines, into NCHW gradients copied out where the formats differ; Winograd on a
    // channels-last x reads dout channels-last and writes dx (channels-last, as x) directly.
    const bool native = nhwc && winograd_tile(m).has_value();
    const auto nchw = [](const Tensor& t) {
      return !t.defined() || t.is_contiguous() ? t : empty(t.sizes(), t.dtype(), t.device());
    };
    const Conv2dGrads work{native ? grads.dx : nchw(grads.dx), nchw(grads.dweight), grads.dbias};
    if (native)
      conv2d_backward_by(m, g, contiguous(dout, MemoryFormat::kChannelsLast), x, contiguous(weight),
                         work, /*channels_last=*/true);
    else
      conv2d_backward_by(m, g, contiguous(dout), contiguous(x), contiguous(weight), work);
    if (work.dx.defined() && work.dx.data() != grads.dx.data()) kernels::copy_(grads.dx, work.dx);
    if (work.dweight.defined() && work.dweight.data() != grads.dweight.data())
      kernels::copy_(grads.dweight, work.dweight);
  };
  run(choose_method(g, schedule(g), x.dtype(), pass, nhwc, run));
  return grads;
}

std::vector<kernels::Conv2dChoice> conv2d_choices() {
  std::lock_guard lock(g_choices_mutex);
  std::vector<std::pair<int64_t, kernels::Conv2dChoice>> ordered;
  for (const auto& [key, measured] : choices()) {
    const auto [n, c, h, w, o, kh, kw, sh, sw] = key.shape;
    [[maybe_unused]] const auto [ph, pw, groups, dh, dw, dtype, threads] = key.rest;
    std::string pass = "forward";
    if (key.pass > 0) {
      pass = "backward";
      const int needs = key.pass - 1;
      if (needs & 1) pass += " dx";
      if (needs & 2) pass += " dw";
      if (needs & 4) pass += " db";
    }
    kernels::Conv2dChoice choice{.x = {n, c, h, w},
                                 .weight = {o, c / groups, kh, kw},
                                 .stride = {sh, sw},
                                 .padding = {ph, pw},
                                 .channels_last = key.nhwc,
                                 .pass = pass,
                                 .threads = static_cast<int>(threads),
                                 .chosen = std::string(method_name(measured.chosen)),
                                 .seconds = {},
                                 .calls = measured.calls};
    for (const auto& [m, seconds] : measured.seconds)
      choice.seconds.emplace_back(std::string(method_name(m)), seconds);
    ordered.emplace_back(measured.order, std::move(choice));
  }
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<kernels::Conv2dChoice> out;
  for (auto& [order, choice] : ordered) out.push_back(std::move(choice));
  return out;
}

void clear_conv2d_choices() {
  std::lock_guard lock(g_choices_mutex);
  choices().clear();
}

}  // namespace loom::cpu
