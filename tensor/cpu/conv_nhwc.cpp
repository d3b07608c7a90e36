// tensor/cpu/conv_nhwc.cpp — conv2d forward and backward on channels-last (NHWC) tensors, with
// no conversion to NCHW: the packed GEMM of tensor/cpu/packed_gemm.h with packers that read the
// patches from the channels-last image. The plan is Note [conv2d in channels-last].

#include "tensor/cpu/conv_nhwc.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tensor/copy.h"
#include "tensor/cpu/packed_gemm.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

using kernels::contiguous;
using kernels::Conv2dGrads;
using kernels::Conv2dOptions;
using kernels::Pair;

// Note [conv2d in channels-last]
//   In NHWC the channels of a pixel are adjacent, so the GEMMs of Note [conv2d on the CPU] are
//   taken the other way round, with the pixels as rows. A patch index k runs over (ki, kj, c),
//   c fastest, so that the K values of one output pixel's patch are kh kw runs of C adjacent
//   values of the zero-padded input xp [hp, wp, C]: col(q, k) = xp[base(q) + offset(k)], with
//   base(q) the input position of output pixel q and offset(k) = (ki dh wp + kj dw) C + c.
//   - forward: out [Q, O] = col [Q, K] @ W' [K, O], where Q = N Ho Wo pixels and W'(k, o) =
//     W[o, c, ki, kj]. out [Q, O] is the NHWC output itself: no scatter. W' is packed once per
//     call, shared by the threads; the packer of col transposes MR pixels x 8 channels at a time
//     in vector registers (the kernels broadcast A's values, so A's panels hold MR pixels per k).
//   - weight gradient: dW' [O, K] = dout^T [O, Q] @ col [Q, K]. Here the patches are B: a panel
//     row is NR consecutive k of one pixel, NR adjacent channels of xp when they lie in one
//     (ki, kj), so packing B is one copy per pixel.
//   - data gradient, stride 1: a convolution of dout with W flipped in space and its channel
//     dims swapped (Note [dx as a convolution]), by the forward above with the weight's strides
//     rearranged; no copy of W. Otherwise dcol [Q, K] = dout [Q, O] @ W'^T [O, K], then each
//     pixel's K values are added into dx's padded copy, C adjacent values per (ki, kj).
//   The batch is cut into one range of samples per thread, as in NCHW, taken in chunks of at
//   least kMinRows pixels; dW' and dbias are per-thread partial sums added at the end. Groups
//   other than 1 are left to the NCHW engines (conv2d_nhwc_fits).

namespace {

constexpr int64_t kMinRows = 512;
constexpr double kMinParallelFlops = 4e6;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

// Uninitialised, 64-byte aligned scratch memory.
template <typename T>
Buffer<T> buffer(int64_t size) {
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(size, 1)) * sizeof(T) + 63) / 64 * 64;
  T* data = static_cast<T*>(std::aligned_alloc(64, bytes));
  LOOM_CHECK(data != nullptr, Error, "conv2d: out of memory asking for ", bytes,
             " bytes of scratch");
  return Buffer<T>(data);
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct Geometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // weight
  int64_t ho, wo;      // output
  int64_t p, k;        // pixels of an output image, length of a patch (kh kw C)
  Pair stride, padding, dilation;
  int64_t hp, wp;               // the padded input
  std::vector<int64_t> offset;  // k = (ki, kj, c) -> (ki dh wp + kj dw) C + c

  // Where output pixel q (sample q / P) reads its patch in a padded chunk [cnt, hp, wp, C].
  int64_t base(int64_t q) const {
    const int64_t s = q / p, pixel = q % p, oh = pixel / wo, ow = pixel % wo;
    return ((s * hp + oh * stride[0]) * wp + ow * stride[1]) * c;
  }
};

Geometry make_geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh,
                       int64_t kw, const Conv2dOptions& opt) {
  Geometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.o = o, g.kh = kh, g.kw = kw;
  g.stride = opt.stride, g.padding = opt.padding, g.dilation = opt.dilation;
  g.ho = (h + 2 * opt.padding[0] - opt.dilation[0] * (kh - 1) - 1) / opt.stride[0] + 1;
  g.wo = (w + 2 * opt.padding[1] - opt.dilation[1] * (kw - 1) - 1) / opt.stride[1] + 1;
  g.p = g.ho * g.wo, g.k = kh * kw * c;
  g.hp = h + 2 * opt.padding[0], g.wp = w + 2 * opt.padding[1];
  g.offset.resize(g.k);
  for (int64_t ki = 0, k = 0; ki < kh; ++ki)
    for (int64_t kj = 0; kj < kw; ++kj)
      for (int64_t ch = 0; ch < c; ++ch, ++k)
        g.offset[k] = (ki * g.dilation[0] * g.wp + kj * g.dilation[1]) * c + ch;
  return g;
}

// How the batch is cut: `parts` ranges of samples, each taken in chunks of at most nb samples.
struct Schedule {
  int64_t parts, nb;
  int64_t begin(int64_t part, int64_t n) const { return n * part / parts; }
};

Schedule schedule(const Geometry& g) {
  const double flops = 2.0 * static_cast<double>(g.n * g.o) * static_cast<double>(g.p * g.k);
  const int64_t threads = flops < kMinParallelFlops ? 1 : get_num_threads();
  Schedule s;
  s.parts = std::clamp<int64_t>(threads, 1, std::max<int64_t>(g.n, 1));
  const int64_t per_part = (g.n + s.parts - 1) / s.parts;
  const int64_t want = (kMinRows + g.p - 1) / std::max<int64_t>(g.p, 1);
  const int64_t nb = std::clamp<int64_t>(want, 1, std::max<int64_t>(per_part, 1));
  const int64_t chunks = (per_part + nb - 1) / nb;  // even out the chunks of a part
  s.nb = std::max<int64_t>(1, (per_part + chunks - 1) / chunks);
  return s;
}

// A weight read through its strides: W(o, c, ki, kj) = data[o so + c sc + ki sh + kj sw]. The
// data gradient's convolution reads W flipped and transposed through negative strides.
template <typename T>
struct WeightView {
  const T* data;
  int64_t so, sc, sh, sw;
};

// x [cnt, H, W, C] -> [cnt, hp, wp, C] with zeros around.
template <typename T>
void pad_images(const T* x, int64_t cnt, const Geometry& g, T* dst) {
  const int64_t row = g.wp * g.c, left = g.padding[1] * g.c, inner = g.w * g.c;
  for (int64_t s = 0; s < cnt; ++s) {
    const T* src = x + s * g.h * inner;
    std::fill(dst, dst + g.padding[0] * row, T(0));
    dst += g.padding[0] * row;
    for (int64_t r = 0; r < g.h; ++r, dst += row, src += inner) {
      std::fill(dst, dst + left, T(0));
      std::copy(src, src + inner, dst + left);
      std::fill(dst + left + inner, dst + row, T(0));
    }
    std::fill(dst, dst + (g.hp - g.padding[0] - g.h) * row, T(0));
    dst += (g.hp - g.padding[0] - g.h) * row;
  }
}

#if LOOM_PACKED_GEMM_SIMD
// dst[p ld + r] = rows[r][p] for r < R (R <= 8) and p < 8: an 8 x 8 float transpose in AVX
// registers, missing rows read as zeros and not stored.
template <int R>
[[gnu::always_inline]] inline void transpose_8(const float* const* rows, float* dst, int64_t ld) {
  static_assert(R == 8 || R == 6 || R == 4, "transpose_8: 4, 6 or 8 rows");
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = i < R ? _mm256_loadu_ps(rows[i]) : _mm256_setzero_ps();
  transpose_8x8(r);
  for (int p = 0; p < 8; ++p) {
    const __m256 column = r[p];
    float* d = dst + p * ld;
    if constexpr (R == 8) {
      _mm256_storeu_ps(d, column);
    } else {
      const __m128 low = _mm256_castps256_ps128(column);
      if constexpr (R >= 4) _mm_storeu_ps(d, low);
      if constexpr (R == 6)
        _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(column, 1));
    }
  }
}

// MR rows x 8 values from each row pointer, transposed into an A panel of row length MR.
template <int64_t MR>
inline bool transpose_panel_8(const float* const* rows, float* dst) {
  if constexpr (MR == 6) {
    transpose_8<6>(rows, dst, 6);
    return true;
  } else if constexpr (MR == 12) {
    transpose_8<8>(rows, dst, 12);
    transpose_8<4>(rows + 8, dst + 8, 12);
    return true;
  }
  return false;
}
#endif

// A [m, kc] as MR-row panels [kc, MR] (rows past m zero), where A(i, p) = row(i)[offset[p]]:
// the rows of MR output pixels (forward), or of dout (data gradient, offset the identity).
// Where the offsets run on by one (one (ki, kj) of a patch), 8 columns are transposed at once.
template <typename K, typename T, typename Row>
void pack_rows(Row&& row, int64_t m, const int64_t* offset, int64_t kc, T* dst) {
  constexpr int64_t mr = K::mr;
  const T* rows[mr];
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += kc * mr) {
    const int64_t count = std::min(mr, m - i0);
    for (int64_t r = 0; r < count; ++r) rows[r] = row(i0 + r);
    if (count < mr) {
      std::fill(dst, dst + kc * mr, T(0));
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < count; ++r) dst[p * mr + r] = rows[r][offset[p]];
      continue;
    }
    int64_t p = 0;
#if LOOM_PACKED_GEMM_SIMD
    if constexpr (std::is_same_v<T, float>) {
      const T* shifted[mr];
      while (p + 8 <= kc) {
        if (offset[p + 7] - offset[p] != 7) {  // a run of the patch ends inside: one column
          for (int64_t r = 0; r < mr; ++r) dst[p * mr + r] = rows[r][offset[p]];
          ++p;
          continue;
        }
        for (int64_t r = 0; r < mr; ++r) shifted[r] = rows[r] + offset[p];
        if (!transpose_panel_8<mr>(shifted, dst + p * mr)) break;
        p += 8;
      }
    }
#endif
    for (; p < kc; ++p)
      for (int64_t r = 0; r < mr; ++r) dst[p * mr + r] = rows[r][offset[p]];
  }
}

// B [K, N] with B(k, j) = at(k, j), packed whole once in the blocks packed_gemm asks for: for
// each NC-column block jc and KC-row block pc, NR-column panels [kc, NR] (columns past N zero).
template <typename K, typename T = typename K::Scalar>
class PackedB {
 public:
  template <typename At>
  PackedB(int64_t k, int64_t n, At&& at)
      : k_(k), n_padded_(round_up(n, K::nr)), data_(buffer<T>(k * n_padded_)) {
    // One task per (jc, pc) block, in parallel when the weight is large.
    std::vector<std::pair<int64_t, int64_t>> blocks;
    for (int64_t jc = 0; jc < n; jc += K::nc)
      for (int64_t pc = 0; pc < k; pc += K::kc) blocks.emplace_back(jc, pc);
    const int64_t count = static_cast<int64_t>(blocks.size());
    parallel_for(0, count, k * n < (1 << 16) ? count + 1 : 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const auto [jc, pc] = blocks[b];
        const int64_t nc = std::min(K::nc, n - jc), kc = std::min(K::kc, k - pc);
        T* dst = const_cast<T*>(block(pc, jc, nc));
        for (int64_t j0 = 0; j0 < nc; j0 += K::nr, dst += kc * K::nr)
          for (int64_t p = 0; p < kc; ++p)
            for (int64_t j = 0; j < K::nr; ++j)
              dst[p * K::nr + j] = j0 + j < nc ? at(pc + p, jc + j0 + j) : T(0);
      }
    });
  }
  const T* block(int64_t pc, int64_t jc, int64_t nc) const {
    return data_.get() + jc * k_ + pc * round_up(nc, K::nr);
  }

 private:
  int64_t k_, n_padded_;
  Buffer<T> data_;
};

// Runs part(i) for every part: in parallel when there are several.
template <typename F>
void for_parts(int64_t parts, F&& part) {
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) part(i);
  });
}

// out [N, Ho, Wo, O] = conv(x [N, H, W, C], w) + bias.
template <typename K, typename T = typename K::Scalar>
void forward(const Geometry& g, const T* x, const WeightView<T>& w, const T* bias, T* out) {
  const Schedule s = schedule(g);
  const int64_t channels = g.c;
  const PackedB<K> weight(g.k, g.o, [&](int64_t k, int64_t o) {
    const int64_t tap = k / channels, c = k % channels;
    return w.data[o * w.so + c * w.sc + (tap / g.kw) * w.sh + (tap % g.kw) * w.sw];
  });
  const bool padded = g.hp != g.h || g.wp != g.w;
  for_parts(s.parts, [&](int64_t part) {
    Buffer<T> a = buffer<T>(K::mc * K::kc);
    Buffer<T> xp = padded ? buffer<T>(s.nb * g.hp * g.wp * g.c) : nullptr;
    const int64_t n_lo = s.begin(part, g.n), n_hi = s.begin(part + 1, g.n);
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += s.nb) {
      const int64_t cnt = std::min(s.nb, n_hi - n0), rows = cnt * g.p;
      const T* chunk = x + n0 * g.h * g.w * g.c;
      if (padded) {
        pad_images(chunk, cnt, g, xp.get());
        chunk = xp.get();
      }
      T* c = out + n0 * g.p * g.o;
      if (bias)
        for (int64_t q = 0; q < rows; ++q) std::copy(bias, bias + g.o, c + q * g.o);
      packed_gemm<K>(
          rows, g.o, g.k,
          [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* scratch) {
            pack_rows<K>([&](int64_t i) { return chunk + g.base(ic + i); }, mc,
                         g.offset.data() + pc, kc, scratch);
            return static_cast<const T*>(scratch);
          },
          [&](int64_t pc, int64_t, int64_t jc, int64_t nc, T*) { return weight.block(pc, jc, nc); },
          c, g.o, bias != nullptr, static_cast<T*>(nullptr), a.get());
    }
  });
}

// dW' [O, K] (k = (ki, kj, c)), dbias [O] and, when dcol_into_dx, dx [N, H, W, C] by dcol.
template <typename K, typename T = typename K::Scalar>
void backward(const Geometry& g, const T* dout, const T* x, const WeightView<T>& w, T* dx,
              T* dweight, T* dbias) {
  const Schedule s = schedule(g);
  const int64_t channels = g.c;
  std::unique_ptr<PackedB<K>> weight_t;  // W'^T [O, K]
  if (dx)
    weight_t = std::make_unique<PackedB<K>>(g.o, g.k, [&](int64_t o, int64_t k) {
      const int64_t tap = k / channels, c = k % channels;
      return w.data[o * w.so + c * w.sc + (tap / g.kw) * w.sh + (tap % g.kw) * w.sw];
    });
  const bool padded = g.hp != g.h || g.wp != g.w;
  std::vector<int64_t> identity(std::max(g.o, g.k));
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
  std::vector<Buffer<T>> dweight_parts(s.parts), dbias_parts(s.parts);
  for_parts(s.parts, [&](int64_t part) {
    T* dw = dweight;
    T* db = dbias;
    if (part > 0 && dweight) dw = (dweight_parts[part] = buffer<T>(g.o * g.k)).get();
    if (part > 0 && dbias) db = (dbias_parts[part] = buffer<T>(g.o)).get();
    if (db) std::fill(db, db + g.o, T(0));
    Buffer<T> a = buffer<T>(K::mc * K::kc);
    Buffer<T> b = buffer<T>(K::kc * round_up(std::min(K::nc, g.k), K::nr));
    Buffer<T> xp = padded && dw ? buffer<T>(s.nb * g.hp * g.wp * g.c) : nullptr;
    Buffer<T> dcol = dx ? buffer<T>(s.nb * g.p * g.k) : nullptr;
    Buffer<T> dxp = padded && dx ? buffer<T>(s.nb * g.hp * g.wp * g.c) : nullptr;
    const int64_t n_lo = s.begin(part, g.n), n_hi = s.begin(part + 1, g.n);
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += s.nb) {
      const int64_t cnt = std::min(s.nb, n_hi - n0), rows = cnt * g.p;
      const T* dy = dout + n0 * g.p * g.o;  // [rows, O]
      if (db)
        for (int64_t q = 0; q < rows; ++q)
          for (int64_t o = 0; o < g.o; ++o) db[o] += dy[q * g.o + o];
      if (dw) {
        const T* chunk = x + n0 * g.h * g.w * g.c;
        if (padded) {
          pad_images(chunk, cnt, g, xp.get());
          chunk = xp.get();
        }
        packed_gemm<K>(
            g.o, g.k, rows,
            [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* scratch) {
              pack_a<K>(dy + pc * g.o + ic, 1, g.o, mc, kc, scratch);
              return static_cast<const T*>(scratch);
            },
            [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* dst) {
              for (int64_t j0 = 0; j0 < nc; j0 += K::nr, dst += kc * K::nr) {
                const int64_t k0 = jc + j0, cols = std::min(K::nr, nc - j0);
                const int64_t* off = g.offset.data() + k0;
                const bool run = k0 / channels == (k0 + cols - 1) / channels;
                for (int64_t q = 0; q < kc; ++q) {
                  const T* src = chunk + g.base(pc + q);
                  T* d = dst + q * K::nr;
                  if (run) {
                    std::copy_n(src + off[0], cols, d);
                  } else {
                    for (int64_t j = 0; j < cols; ++j) d[j] = src[off[j]];
                  }
                  std::fill(d + cols, d + K::nr, T(0));
                }
              }
            },
            dw, g.k, n0 != n_lo, b.get(), a.get());
      }
      if (dx) {
        packed_gemm<K>(
            rows, g.k, g.o,
            [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* scratch) {
              pack_rows<K>([&](int64_t i) { return dy + (ic + i) * g.o; }, mc, identity.data() + pc,
                           kc, scratch);
              return static_cast<const T*>(scratch);
            },
            [&](int64_t pc, int64_t, int64_t jc, int64_t nc, T*) {
              return weight_t->block(pc, jc, nc);
            },
            dcol.get(), g.k, false, static_cast<T*>(nullptr), a.get());
        // Each pixel's patch gradient, added where its patch came from.
        T* image = padded ? dxp.get() : dx + n0 * g.h * g.w * g.c;
        std::fill(image, image + cnt * g.hp * g.wp * g.c, T(0));
        for (int64_t q = 0; q < rows; ++q) {
          T* base = image + g.base(q);
          const T* src = dcol.get() + q * g.k;
          for (int64_t tap = 0; tap < g.kh * g.kw; ++tap, src += channels) {
            T* d = base + g.offset[tap * channels];
            for (int64_t c = 0; c < channels; ++c) d[c] += src[c];
          }
        }
        if (padded) {  // the interior of the padded images
          const int64_t row = g.wp * g.c, left = g.padding[1] * g.c, inner = g.w * g.c;
          for (int64_t i = 0; i < cnt; ++i)
            for (int64_t r = 0; r < g.h; ++r)
              std::copy_n(image + (i * g.hp + g.padding[0] + r) * row + left, inner,
                          dx + ((n0 + i) * g.h + r) * inner);
        }
      }
    }
  });
  auto reduce = [&](T* total, const std::vector<Buffer<T>>& partial, int64_t size) {
    if (!total || s.parts == 1) return;
    parallel_for(0, size, 1 << 16, [&](int64_t lo, int64_t hi) {
      for (int64_t part = 1; part < s.parts; ++part) {
        const T* src = partial[part].get();
        for (int64_t i = lo; i < hi; ++i) total[i] += src[i];
      }
    });
  };
  reduce(dweight, dweight_parts, g.o * g.k);
  reduce(dbias, dbias_parts, g.o);
}

template <typename T>
WeightView<T> view(const Tensor& weight) {
  return {weight.data_ptr<T>(), weight.stride(0), weight.stride(1), weight.stride(2),
          weight.stride(3)};
}

// The packed kernels of the instruction set in use, for T.
template <typename T, typename F>
void with_kernel(F&& run) {
  const bool ran = with_packed_kernel([&]<CpuIsa I>() { run.template operator()<Kernel<T, I>>(); });
  LOOM_ASSERT(ran, "conv2d_nhwc: no packed kernel (conv2d_nhwc_fits said yes)");
}

}  // namespace

bool conv2d_nhwc_fits(const Tensor& x, const Tensor& weight, const Conv2dOptions& options) {
  if (options.groups != 1 || suggest_memory_format(x) != MemoryFormat::kChannelsLast) return false;
  if (x.dtype() != kFloat32 && x.dtype() != kFloat64) return false;
  return with_packed_kernel([]<CpuIsa>() {}) && weight.dim() == 4;
}

void conv2d_nhwc(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Conv2dOptions& options, const Tensor& out) {
  LOOM_ASSERT(has_memory_format(out, MemoryFormat::kChannelsLast), "conv2d_nhwc: out format");
  const Geometry g = make_geometry(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0),
                                   weight.size(2), weight.size(3), options);
  dispatch_floating(x.dtype(), "conv2d", [&]<typename T>() {
    const Tensor bc = bias.defined() ? contiguous(bias) : Tensor();
    const T* b = bc.defined() ? bc.data_ptr<T>() : nullptr;
    with_kernel<T>([&]<typename K>() {
      forward<K>(g, x.data_ptr<T>(), view<T>(weight), b, out.data_ptr<T>());
    });
  });
}

void conv2d_nhwc_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Conv2dOptions& options, const Conv2dGrads& grads) {
  LOOM_ASSERT(!grads.dx.defined() || has_memory_format(grads.dx, MemoryFormat::kChannelsLast),
              "conv2d_nhwc_backward: dx format");
  const Geometry g = make_geometry(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0),
                                   weight.size(2), weight.size(3), options);
  const Tensor dc = contiguous(dout, MemoryFormat::kChannelsLast);
  // dx as the forward convolution of dout (Note [dx as a convolution]) where it applies.
  const bool dx_as_conv = grads.dx.defined() && g.stride == Pair{1, 1} &&
                          g.padding[0] <= g.dilation[0] * (g.kh - 1) &&
                          g.padding[1] <= g.dilation[1] * (g.kw - 1);
  dispatch_floating(x.dtype(), "conv2d_backward", [&]<typename T>() {
    with_kernel<T>([&]<typename K>() {
      const WeightView<T> w = view<T>(weight);
      if (dx_as_conv) {
        const Conv2dOptions flipped_options{
            {1, 1},
            {g.dilation[0] * (g.kh - 1) - g.padding[0], g.dilation[1] * (g.kw - 1) - g.padding[1]},
            g.dilation,
            1};
        const Geometry gt = make_geometry(g.n, g.o, g.ho, g.wo, g.c, g.kh, g.kw, flipped_options);
        LOOM_ASSERT(gt.ho == g.h && gt.wo == g.w, "conv2d: transposed geometry");
        // W'(c, o, ki, kj) = W[o, c, kh-1-ki, kw-1-kj]
        const WeightView<T> flipped{w.data + (g.kh - 1) * w.sh + (g.kw - 1) * w.sw, w.sc, w.so,
                                    -w.sh, -w.sw};
        forward<K>(gt, dc.data_ptr<T>(), flipped, static_cast<const T*>(nullptr),
                   grads.dx.data_ptr<T>());
      }
      const bool dcol_dx = grads.dx.defined() && !dx_as_conv;
      if (!dcol_dx && !grads.dweight.defined() && !grads.dbias.defined()) return;
      Buffer<T> dw_rows;  // [O, (ki, kj, c)]
      if (grads.dweight.defined()) dw_rows = buffer<T>(g.o * g.k);
      backward<K>(g, dc.data_ptr<T>(), x.data_ptr<T>(), w,
                  dcol_dx ? grads.dx.data_ptr<T>() : nullptr, dw_rows.get(),
                  grads.dbias.defined() ? grads.dbias.data_ptr<T>() : nullptr);
      if (grads.dweight.defined()) {  // into dweight, through its strides
        T* dst = grads.dweight.data_ptr<T>();
        const int64_t so = grads.dweight.stride(0), sc = grads.dweight.stride(1);
        const int64_t sh = grads.dweight.stride(2), sw = grads.dweight.stride(3);
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t tap = 0, k = 0; tap < g.kh * g.kw; ++tap)
            for (int64_t c = 0; c < g.c; ++c, ++k)
              dst[o * so + c * sc + (tap / g.kw) * sh + (tap % g.kw) * sw] = dw_rows[o * g.k + k];
      }
    });
  });
}

}  // namespace loom::cpu
