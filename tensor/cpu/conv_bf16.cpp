// tensor/cpu/conv_bf16.cpp — Note [bf16 convolutions]: conv2d and its gradients of bfloat16
// tensors as im2col and GEMMs of bfloat16 (cpu::gemm_bf16).

#include "tensor/cpu/conv_bf16.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "tensor/copy.h"
#include "tensor/cpu/bf16_gemm.h"
#include "tensor/cpu/linalg.h"
#include "tensor/cpu/scratch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

// Note [bf16 convolutions]
//   Under bf16 autocast every convolution gets bfloat16 operands. Widened to float32 (the path
//   of Note [16-bit products on the CPU]) they run at float32's speed plus the widening; on a
//   CPU whose bfloat16 products are faster than its float32 FMAs (AMX tiles, 14 times here:
//   Note [bf16 products on AMX tiles]) the convolution should run on those products. So a
//   bfloat16 layer is lowered to matrix products of bfloat16, as the im2col engine lowers a
//   float32 one, with the images taken a chunk at a time:
//       col   [K, B P] = the patches of B images (K = C kh kw, P = Ho Wo), bfloat16
//       y     [O, B P] = W [O, K] @ col                         (float32, + bias, rounded once)
//       dcol  [K, B P] = W^T @ dY [O, B P]     dx = col2im(dcol) (float32 sums, rounded once)
//       dW    [O, K]  += dY @ col^T            over the chunks   (float32, rounded once at the end)
//   The products of bfloat16 are exact in float32 and summed in float32, and each result is
//   rounded to bfloat16 once, which is the widened path's rule; the sums run in another order,
//   so the bits may differ in the last place of bfloat16 (conv_bf16_test bounds both against
//   float64). B is chosen so that a chunk has at least kMinColumns columns (the GEMM splits its
//   columns over the threads, and every chunk costs its parallel regions: with 2048, a 32 x 32
//   layer ran 32 chunks of 2 images, and 16384 took 0.81 of the stem's forward and backward
//   time, 0.93 of a 64-channel layer's, 0.97 of the ResNet-18 bf16 step's, paired on an AMD
//   EPYC) and col at most kMaxColBytes. With stride 1 and at least 16 input
//   channels, dx is instead the forward convolution of dY with the weight flipped and its
//   channels swapped (Note [dx as a convolution] in tensor/cpu/conv.cpp): no float32 dcol and
//   no col2im, whose overlap-add took a tenth of the bf16 ResNet-18 step. On the vdpbf16ps
//   kernel a "same" stride-1 layer packs the patches straight into the GEMM's panels and never
//   writes col (Note [bf16 patch panels]): the forward's B (and dx's, as a convolution), and
//   dW's col^T; on small images the forward puts the batch in the vector lanes instead and
//   skips the taps that read padding (Note [bf16 batch lanes]), and on images whose rows are
//   whole panels it reads them where they lie (Note [bf16 row panels]); the AMX kernel and
//   strided layers still go through col. x and dy are read as contiguous NCHW (a channels-last
//   operand is copied first); groups other than 1 keep the widened path.

namespace {

constexpr int64_t kMinColumns = 16384;
constexpr int64_t kMaxColBytes = int64_t{32} << 20;

struct Geometry {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
  kernels::Pair stride, padding, dilation;
  int64_t k() const { return c * kh * kw; }
  int64_t p() const { return ho * wo; }
};

Geometry geometry(const Tensor& x, const Tensor& weight, const kernels::Conv2dOptions& o,
                  const Shape& out_shape) {
  return {x.size(0),      x.size(1),    x.size(2),    x.size(3), weight.size(0), weight.size(2),
          weight.size(3), out_shape[2], out_shape[3], o.stride,  o.padding,      o.dilation};
}

// Images per chunk (Note [bf16 convolutions]).
int64_t chunk_images(const Geometry& g) {
  const int64_t by_columns = (kMinColumns + g.p() - 1) / g.p();
  const int64_t by_bytes =
      std::max<int64_t>(1, kMaxColBytes / std::max<int64_t>(1, g.k() * g.p() * 2));
  return std::clamp<int64_t>(std::min(by_columns, by_bytes), 1, std::max<int64_t>(g.n, 1));
}

// Where tap (ki, kj) reads: output pixel (oh, ow) takes input pixel (oh sh + top, ow sw +
// offset), top = ki dh - ph and offset = kj dw - pw, which lies inside its row for the output
// columns [lo_col, hi_col).
struct Tap {
  int64_t top, offset, lo_col, hi_col;
};

// The kh kw taps, tap ki kw + kj at that index.
std::vector<Tap> taps_of(const Geometry& g) {
  std::vector<Tap> taps;
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t offset = kj * g.dilation[1] - g.padding[1];
      int64_t lo = 0;
      while (lo < g.wo && lo * g.stride[1] + offset < 0) ++lo;
      int64_t hi = g.wo;
      while (hi > lo && (hi - 1) * g.stride[1] + offset >= g.w) --hi;
      taps.push_back({ki * g.dilation[0] - g.padding[0], offset, lo, hi});
    }
  return taps;
}

// Stride 1 with output rows as wide as the input's (a "same" layer, and dx as a convolution):
// a tap's plane of col is then the input plane shifted by top w + offset, with zeros where the
// tap reads the padding.
bool shifted_planes(const Geometry& g) { return g.stride == kernels::Pair{1, 1} && g.wo == g.w; }

// col [K, count P] (row stride ld) = the patches of images [first, first + count) of x.
// With shifted_planes, a tap's plane is one copy of the run between its first and last valid
// pixels, then zeros over the rows above and below and the columns at the sides, which the run
// filled with the neighbouring rows' pixels. Row by row, a 4 x 4 plane took four copies and
// eight fills of one to four values, and the calls cost more than the data (Note [bf16
// convolutions]).
void im2col(const Geometry& g, const BFloat16* x, int64_t first, int64_t count, BFloat16* col,
            int64_t ld) {
  const int64_t kk = g.kh * g.kw;
  const std::vector<Tap> taps = taps_of(g);
  const bool shifted = shifted_planes(g);
  parallel_for(0, g.k() * count, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.p())),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t unit = lo; unit < hi; ++unit) {
                   const int64_t row = unit / count, image = unit % count;
                   const int64_t c = row / kk;
                   const BFloat16* plane = x + ((first + image) * g.c + c) * g.h * g.w;
                   BFloat16* out = col + row * ld + image * g.p();
                   const auto [top, offset, lo_col, hi_col] = taps[row % kk];
                   if (shifted) {
                     const int64_t oh_lo = std::max<int64_t>(0, -top),
                                   oh_hi = std::min(g.ho, g.h - top);
                     if (oh_lo >= oh_hi || lo_col >= hi_col) {
                       std::fill(out, out + g.p(), BFloat16());
                       continue;
                     }
                     const int64_t begin = oh_lo * g.wo + lo_col, end = (oh_hi - 1) * g.wo + hi_col;
                     const int64_t shift = top * g.w + offset;  // plane[i + shift] -> out[i]
                     std::memcpy(out + begin, plane + begin + shift,
                                 static_cast<size_t>(end - begin) * sizeof(BFloat16));
                     std::fill(out, out + begin, BFloat16());
                     std::fill(out + end, out + g.p(), BFloat16());
                     for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
                       for (int64_t ow = 0; ow < lo_col; ++ow) out[oh * g.wo + ow] = BFloat16();
                       for (int64_t ow = hi_col; ow < g.wo; ++ow) out[oh * g.wo + ow] = BFloat16();
                     }
                     continue;
                   }
                   for (int64_t oh = 0; oh < g.ho; ++oh) {
                     const int64_t ih = oh * g.stride[0] + top;
                     BFloat16* dst = out + oh * g.wo;
                     if (ih < 0 || ih >= g.h || lo_col >= hi_col) {
                       std::fill(dst, dst + g.wo, BFloat16());
                       continue;
                     }
                     const BFloat16* src = plane + ih * g.w;
                     std::fill(dst, dst + lo_col, BFloat16());
                     if (g.stride[1] == 1) {
                       std::copy(src + lo_col + offset, src + hi_col + offset, dst + lo_col);
                     } else {
                       for (int64_t ow = lo_col; ow < hi_col; ++ow)
                         dst[ow] = src[ow * g.stride[1] + offset];
                     }
                     std::fill(dst + hi_col, dst + g.wo, BFloat16());
                   }
                 }
               });
}

#if LOOM_PACKED_GEMM_SIMD
// Note [bf16 patch panels]
//   On the vdpbf16ps kernel, a "same" stride-1 layer (the planes of im2col above) skips col:
//   the GEMM's B panels, 32 columns of k-pairs (Note [bf16 dot products]), are packed from the
//   image itself, as the float32 packed engine packs its patches (Note [conv2d on the CPU]).
//   A panel's 32 columns are consecutive pixels of the chunk: one span of pixels per image it
//   touches (one on images of 32 or more pixels, two on 4 x 4 ones). In a "same" layer a tap
//   reads pixel i of the output from pixel i + top w + offset of the input plane, for every
//   output row alike, so each span of each tap is one masked load of the plane: the lanes whose
//   input is padding (rows above or below the image, columns past its sides) masked off. The
//   masks and offsets are worked out once per panel for every (span, tap); the rows of the
//   panel then walk (channel, tap) without a division. For each pair of k the two rows of 32
//   are interleaved into 32 pairs by two permutes. im2col and the pair packer wrote and read
//   col, nine times the input, and took about 30% of a bf16 layer's time (perf, ResNet-18
//   width 64 layers on an AMD EPYC). A first packer loaded each output row's run of each tap
//   on its own (four loads per tap on 8 x 8 images, eight on 4 x 4) and divided k by the taps
//   per row; against it, paired in one process, forward and dx of the ResNet-18 layers take
//   0.84 (64 channels, 32 x 32) to 0.90 (512, 4 x 4) of the time, a 5 x 5 layer 0.60.
//   dW = dY col^T takes col^T's panels the same way, k now running over the pixels: each of a
//   panel's 32 rows of col is gathered from the image 32 pixels at a time (the same span
//   tables, over the block's pixels) into a buffer of 32 x kc, which the pair transposes of a
//   stored col^T then pack. Against im2col and those transposes, paired, dW alone takes 0.78
//   (512, 4 x 4) to 0.83 (64, 32 x 32) of the time.
namespace avx512 {

// The permutes that interleave two rows of 32 bfloat16 into 32 pairs: word 2l of the first is
// lo[l] and word 2l + 1 is hi[l] (index 32 + l, the second source), for pairs 0..15; the second
// does pairs 16..31.
alignas(64) constexpr auto kPairOrder = [] {
  std::array<std::array<uint16_t, 32>, 2> order{};
  for (int half = 0; half < 2; ++half)
    for (int l = 0; l < 16; ++l) {
      order[half][2 * l] = static_cast<uint16_t>(16 * half + l);
      order[half][2 * l + 1] = static_cast<uint16_t>(32 + 16 * half + l);
    }
  return order;
}();

// Lanes [lo, hi) of 32 as a mask (empty when lo >= hi).
[[gnu::always_inline]] inline uint32_t lanes(int64_t lo, int64_t hi) {
  if (lo >= hi) return 0;
  const uint64_t ones = (uint64_t{1} << hi) - 1;
  return static_cast<uint32_t>(ones & ~((uint64_t{1} << lo) - 1));
}

// A panel's lanes [pos, pos + len) that hold consecutive pixels of one image, from pixel
// `pixel` of image `image`; and per tap, which of the panel's lanes it reads inside the image
// (`mask`) and where lane 0 would read in channel 0 (`from`, an element offset into the chunk).
struct PanelSpan {
  int64_t image, pixel, pos, len;
};
struct SpanTap {
  uint32_t mask;
  int64_t from;
};

// A row of col over a panel: for each of span_count spans, the tap's entry (`tap` points at
// the first span's; the others follow kk apart) read `channel` elements further into the
// chunk (c h w for channel c), zeros in the lanes no span covers.
[[gnu::always_inline, gnu::target("avx512f,avx512bw")]] inline __m512i span_row(
    const BFloat16* x, const SpanTap* tap, int64_t kk, int span_count, int64_t channel) {
  __m512i row = _mm512_setzero_si512();
  for (int s = 0; s < span_count; ++s) {
    const SpanTap& st = tap[s * kk];
    if (st.mask == 0) continue;
    // The address of lane 0 may lie outside the chunk; its lanes there are masked off.
    const auto address = reinterpret_cast<const void*>(
        reinterpret_cast<uintptr_t>(x) + static_cast<uintptr_t>((st.from + channel) * 2));
    row = _mm512_mask_loadu_epi16(row, st.mask, address);
  }
  return row;
}

// The spans of the chunk's pixels [col0, col0 + width) (width at most 32, lane 0 at col0), and
// for each span s and tap t, table[s kk + t]: the lanes where the tap reads inside the image
// (the output rows the span crosses, each cut to the columns whose input lies inside the row,
// none where the input row is padding) and where lane 0 reads in channel 0. Returns the count.
int span_table(const Geometry& g, const Tap* taps, int64_t col0, int64_t width,
               std::vector<SpanTap>& table) {
  const int64_t p = g.p(), kk = g.kh * g.kw, plane = g.h * g.w;
  PanelSpan spans[32];
  int span_count = 0;
  for (int64_t pos = 0; pos < width;) {
    const int64_t column = col0 + pos, image = column / p, pixel = column % p;
    const int64_t len = std::min(p - pixel, width - pos);
    spans[span_count++] = {image, pixel, pos, len};
    pos += len;
  }
  table.assign(static_cast<size_t>(span_count * kk), SpanTap{0, 0});
  for (int s = 0; s < span_count; ++s) {
    const PanelSpan& span = spans[s];
    for (int64_t t = 0; t < kk; ++t) {
      const Tap& tap = taps[t];
      uint32_t mask = 0;
      for (int64_t pixel = span.pixel; pixel < span.pixel + span.len;) {
        const int64_t oh = pixel / g.wo, ow0 = pixel % g.wo;
        const int64_t end = std::min(span.pixel + span.len, (oh + 1) * g.wo);
        const int64_t ih = oh + tap.top;
        if (ih >= 0 && ih < g.h) {
          const int64_t lo = std::max(ow0, tap.lo_col),
                        hi = std::min(ow0 + end - pixel, tap.hi_col);
          const int64_t lane0 = span.pos + pixel - span.pixel - ow0;  // lane of column 0
          mask |= lanes(lane0 + lo, lane0 + hi);
        }
        pixel = end;
      }
      // Lane l reads input pixel (l - pos + span.pixel) + top w + offset of the image.
      table[s * kk + t] = {
          mask, span.image * g.c * plane + span.pixel - span.pos + tap.top * g.w + tap.offset};
    }
  }
  return span_count;
}

// pack_b of gemm_bf16_pair_panels for col [K, count P] of a chunk whose first image is x: the
// forward's B, and dx's as a convolution.
[[gnu::target("avx512f,avx512bw")]] void pack_patch_pairs(const Geometry& g, const Tap* taps,
                                                          const BFloat16* x, int64_t pc, int64_t kc,
                                                          int64_t j, int64_t nc, uint32_t* dst) {
  const __m512i first = _mm512_load_si512(kPairOrder[0].data()),
                second = _mm512_load_si512(kPairOrder[1].data());
  const int64_t pairs = (kc + 1) / 2, kk = g.kh * g.kw, plane = g.h * g.w;
  std::vector<SpanTap> table;
  for (int64_t panel = 0; panel * 32 < nc; ++panel) {
    const int span_count =
        span_table(g, taps, j + panel * 32, std::min<int64_t>(32, nc - panel * 32), table);
    uint32_t* out = dst + panel * pairs * 32;
    int64_t c = pc / kk, t = pc % kk;
    for (int64_t q = 0; q < pairs; ++q, out += 32) {
      const __m512i lo = span_row(x, table.data() + t, kk, span_count, c * plane);
      if (++t == kk) t = 0, ++c;
      __m512i hi = _mm512_setzero_si512();
      if (2 * q + 1 < kc) {
        hi = span_row(x, table.data() + t, kk, span_count, c * plane);
        if (++t == kk) t = 0, ++c;
      }
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(lo, first, hi));
      _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi16(lo, second, hi));
    }
  }
}

// pack_b of gemm_bf16_pair_panels for col^T [count P, K] of a chunk whose first image is x, the
// weight gradient's B (dW = dY col^T): k runs over the chunk's pixels, a panel's 32 columns are
// 32 rows of col. Each row's kc pixels are gathered into `rows`, 32 pixels (a span table's
// width) at a time, then the 32 rows are turned into pairs as a stored col^T would be.
[[gnu::target("avx512f,avx512bw")]] void pack_patch_columns(const Geometry& g, const Tap* taps,
                                                            const BFloat16* x, int64_t pc,
                                                            int64_t kc, int64_t j, int64_t nc,
                                                            uint32_t* dst) {
  const int64_t pairs = (kc + 1) / 2, kk = g.kh * g.kw, plane = g.h * g.w;
  const int64_t blocks = (kc + 31) / 32;
  std::vector<std::vector<SpanTap>> tables(static_cast<size_t>(blocks));
  std::vector<int> span_counts(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b)
    span_counts[b] =
        span_table(g, taps, pc + 32 * b, std::min<int64_t>(32, kc - 32 * b), tables[b]);
  std::vector<BFloat16> rows(static_cast<size_t>(32 * kc));
  for (int64_t panel = 0; panel * 32 < nc; ++panel) {
    const int64_t width = std::min<int64_t>(32, nc - panel * 32);
    for (int64_t l = 0; l < 32; ++l) {
      BFloat16* row = rows.data() + l * kc;
      if (l >= width) {
        std::fill(row, row + kc, BFloat16());
        continue;
      }
      const int64_t r = j + panel * 32 + l, c = r / kk, t = r % kk;
      for (int64_t b = 0; b < blocks; ++b) {
        const __m512i v = span_row(x, tables[b].data() + t, kk, span_counts[b], c * plane);
        _mm512_mask_storeu_epi16(row + 32 * b, lanes(0, std::min<int64_t>(32, kc - 32 * b)), v);
      }
    }
    pack_rows_of_pairs(rows.data(), kc, 32, kc, dst + panel * pairs * 32, 32);
  }
}

}  // namespace avx512
#endif  // LOOM_PACKED_GEMM_SIMD

// Whether conv2d_bf16's forward packs patch panels (Note [bf16 patch panels]): a "same" stride-1
// layer, on the vdpbf16ps kernel.
bool patch_panels(const Geometry& g) {
#if LOOM_PACKED_GEMM_SIMD
  return shifted_planes(g) && pair_panel_products();
#else
  (void)g;
  return false;
#endif
}

#if LOOM_PACKED_GEMM_SIMD
// Note [bf16 batch lanes]
//   On small images much of a "same" layer's products multiply padding: a 3 x 3 tap reads
//   inside a 4 x 4 image for (2.5 / 3)^2 = 0.69 of the output pixels, inside an 8 x 8 one for
//   0.84. The patch panels cannot skip those products: a panel's 32 columns are 32 consecutive
//   pixels, for which a tap is inside at some and outside at others. Turned round, a panel's 32
//   columns are one pixel of 32 images (the batch in the vector lanes), every column of it has
//   the same taps inside, and a tap outside is skipped whole (lanes_products):
//       xt    [P_in, C/2, 32]          the input of 32 images: for each input pixel the pairs of
//                                      channels (2i, 2i + 1) across the images, which is a B
//                                      panel of the vdpbf16ps kernel as it lies (32 pairs a row)
//       wt    [kh kw, O/12, C/2, 12]   the weight's A panels, one set per tap
//       yt[q] [O, 32]                  = sum over the taps t inside at output pixel q of
//                                        wt[t] @ xt[the input pixel t reads at q]
//   one call of dot_segments_12x32 per tile and output pixel, a segment per tap inside over all
//   C channels (k = C), the tile in registers across the taps (against a kernel call per tap,
//   the tile kept in memory between them, paired: 0.96 of the forward's time at 128 channels
//   on 16 x 16, 0.99 at 256 and 512); then y[n, o, q] = yt[q][o, n] + bias[o], rounded once.
//   The products and sums are those of the patch panels less the zeros, in another order. The
//   input is paired and transposed once, where the panels pack each value once per tap and
//   im2col writes nine copies of it, so the lanes pay beyond the padding: against the panels
//   they took 0.92-0.94 of the forward's time at 128 channels on 16 x 16 (0.918 of the taps
//   inside) and 0.92-0.95 at 64 on 32 x 32. Each unit of work (32 images, 12 output channels)
//   goes kBlock output pixels at a time so that its yt stays in cache.
//   The same products serve three more passes: a strided forward (a tap's input pixel depends
//   only on the output pixel, at any stride); dx as a convolution (stride 1); and a strided dx,
//   each input pixel summing the (tap, output pixel) pairs that read it (reading_taps) with
//   the weight's channels swapped, instead of dcol and col2im. The weight gradient turns the
//   idea round (weight_grad_batch_lanes: k over pairs of images and the pixels where a tap
//   reads inside, x laid out by phase at a stride so that a run of outputs reads a run of
//   inputs). The images are taken 32 at a time, the last group padded with zero images,
//   so a batch that leaves many lanes empty loses what the skipped taps gain: a layer takes the
//   lanes where they run fewer products than the panels or col (the taps inside over the lanes
//   in use), every input pixel is read (not a 1 x 1 kernel at stride 2, which ran 1.1-2x
//   slower), the output has at most kMaxLanePixels pixels (at 32 x 32 the forward gained and
//   dx as a convolution lost, 1.13-1.16) and, for a strided dx, the input at most
//   kMaxDxLanePixels. Paired in one process, AMD EPYC, 2 threads, batch 64, against the
//   panels: forward 0.72 of the time at 512 channels on 4 x 4 (dx alike), 0.88-0.90 at 256 on
//   8 x 8; dW 0.78 and 0.90; against im2col, the forward of 256 -> 512 at stride 2 0.55-0.67;
//   against dcol and col2im, the strided dx 0.69 (64 -> 128 on 32 x 32), 0.62 and 0.47 (8 x 8);
//   against im2col, the strided dW 0.81-0.84, 0.71-0.78 and 0.67-0.73.
//   The ResNet-18 width-64 bf16 step took 0.94 of the panels' time with the lanes on small
//   images, and 0.95-0.96 of that again with the strided dx and 16 x 16 layers.
constexpr int64_t kLanes = 32;              // Kernel<BFloat16, kAvx512Bf16>::nr
constexpr int64_t kMaxLanePixels = 256;     // output pixels per image
constexpr int64_t kMaxDxLanePixels = 1024;  // input pixels per image, for a strided dx
constexpr int64_t kBlock = 64;              // pixels per block of the transposes and of a unit's yt

// The products of Note [bf16 batch lanes] as lanes_products sees them: n images of c channels
// of p_src pixels in, o channels of p_dst pixels out, a weight [o, c, taps].
struct LaneShape {
  int64_t n, c, p_src, o, p_dst, taps;
};

// For output pixel q, the taps inside the image: entries [first[q], first[q + 1]) of `taps`,
// each the tap's index and the input pixel it reads.
struct InsideTaps {
  std::vector<int64_t> first;
  std::vector<std::pair<int64_t, int64_t>> taps;
};

InsideTaps inside_taps(const Geometry& g) {
  InsideTaps inside;
  inside.first.push_back(0);
  for (int64_t oh = 0; oh < g.ho; ++oh)
    for (int64_t ow = 0; ow < g.wo; ++ow) {
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          const int64_t ih = oh * g.stride[0] + ki * g.dilation[0] - g.padding[0];
          const int64_t iw = ow * g.stride[1] + kj * g.dilation[1] - g.padding[1];
          if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
            inside.taps.emplace_back(ki * g.kw + kj, ih * g.w + iw);
        }
      inside.first.push_back(static_cast<int64_t>(inside.taps.size()));
    }
  return inside;
}

// The entries of a strided layer's dx in lanes_products: for each input pixel, the taps and
// output pixels whose products read it (the forward's inside_taps turned round).
InsideTaps reading_taps(const Geometry& g) {
  const InsideTaps inside = inside_taps(g);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> by_pixel(static_cast<size_t>(g.h * g.w));
  for (int64_t q = 0; q < g.p(); ++q)
    for (int64_t e = inside.first[q]; e < inside.first[q + 1]; ++e)
      by_pixel[inside.taps[e].second].emplace_back(inside.taps[e].first, q);
  InsideTaps reading;
  reading.first.push_back(0);
  for (const auto& entries : by_pixel) {
    reading.taps.insert(reading.taps.end(), entries.begin(), entries.end());
    reading.first.push_back(static_cast<int64_t>(reading.taps.size()));
  }
  return reading;
}

// Whether the lanes pay for a layer (Note [bf16 batch lanes]): the vdpbf16ps kernel, at most 16
// taps, every input pixel read by some product, and fewer products than the patch panels or col
// run (the taps inside the image over the lanes in use; a layer that reads no padding keeps
// its plain product).
bool lanes_pay(const Geometry& g) {
  if (g.n == 0 || g.kh * g.kw > 16 || !pair_panel_products()) return false;
  const int64_t taps_inside = static_cast<int64_t>(inside_taps(g).taps.size());
  if (taps_inside < g.h * g.w) return false;
  const double inside = static_cast<double>(taps_inside) / static_cast<double>(g.p() * g.kh * g.kw);
  const int64_t padded = (g.n + kLanes - 1) / kLanes * kLanes;
  return inside * static_cast<double>(padded) / static_cast<double>(g.n) < 1.0;
}

// Whether conv2d_bf16's forward and dW take Note [bf16 batch lanes].
bool batch_lanes(const Geometry& g) { return g.p() <= kMaxLanePixels && lanes_pay(g); }

// Whether a strided layer's dx takes the lanes (lanes_products with reading_taps) instead of
// dcol and col2im.
bool strided_dx_lanes(const Geometry& g) {
  return g.stride != kernels::Pair{1, 1} && g.h * g.w <= kMaxDxLanePixels && lanes_pay(g);
}

// out[i] = the pair (lo[i], lo[apart + i]) for i < n: two channels (or images) `apart` values
// apart; without a second one (has_hi false) lo[i] with a zero high half.
void pair_runs(const BFloat16* lo, int64_t apart, bool has_hi, int64_t n, uint32_t* out) {
  if (has_hi)
    for (int64_t i = 0; i < n; ++i) out[i] = pair_of(lo[i], lo[apart + i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = lo[i].bits;
}

namespace avx512 {

// The A panels of rows [12 tile, 12 tile + 12) of w [O, C, kh, kw] for every tap: panel (t,
// tile) of wt, pairs of channels (2i, 2i + 1) in its rows, zeros past O and C. A row's two
// channels are 2 kh kw contiguous values (kh kw <= 16); a permute turns them into the kh kw
// pairs, which `rows` holds for the 12 rows of one i before they are dealt out to the taps.
[[gnu::target("avx512f,avx512bw")]] void pack_lane_weights(const LaneShape& s, const BFloat16* w,
                                                           int64_t tile, int64_t tiles,
                                                           uint32_t* wt) {
  constexpr int64_t kRows = Kernel<BFloat16, CpuIsa::kAvx512Bf16>::mr;
  const int64_t kk = s.taps, pairs = (s.c + 1) / 2;
  alignas(64) uint16_t order[32] = {};
  for (int64_t t = 0; t < kk; ++t)
    order[2 * t] = static_cast<uint16_t>(t), order[2 * t + 1] = static_cast<uint16_t>(kk + t);
  const __m512i permute = _mm512_load_si512(order);
  alignas(64) uint32_t rows[kRows][16];
  for (int64_t i = 0; i < pairs; ++i) {
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t o = tile * kRows + r, c = 2 * i;
      __m512i both = _mm512_setzero_si512();
      if (o < s.o) {
        const int64_t count = c + 1 < s.c ? 2 * kk : kk;
        both = _mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t{1} << count) - 1),
                                        w + (o * s.c + c) * kk);
      }
      _mm512_store_si512(rows[r], _mm512_permutexvar_epi16(permute, both));
    }
    for (int64_t t = 0; t < kk; ++t) {
      uint32_t* dst = wt + ((t * tiles + tile) * pairs + i) * kRows;
      for (int64_t r = 0; r < kRows; ++r) dst[r] = rows[r][t];
    }
  }
}

}  // namespace avx512

// The weight's A panels, one set per tap (wt of Note [bf16 batch lanes]), packed into frame.
uint32_t* pack_tap_weights(const LaneShape& s, const BFloat16* w, ScratchFrame& frame) {
  using K = Kernel<BFloat16, CpuIsa::kAvx512Bf16>;
  const int64_t tiles = (s.o + K::mr - 1) / K::mr;
  uint32_t* wt = frame.get<uint32_t>(s.taps * tiles * K::mr * ((s.c + 1) / 2));
  parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t tile = lo; tile < hi; ++tile) avx512::pack_lane_weights(s, w, tile, tiles, wt);
  });
  return wt;
}

// y [n, o, p_dst] (bfloat16) = sum over the (tap, source pixel) entries of `inside` for each
// output pixel of w[:, :, tap] @ x [n, c, p_src] at that pixel, plus bias (null: none), by Note
// [bf16 batch lanes]: a convolution's forward, or its strided dx (the sources dy's pixels).
void lanes_products(const LaneShape& g, const InsideTaps& inside, const BFloat16* x,
                    const BFloat16* w, const float* bias, BFloat16* y) {
  using K = Kernel<BFloat16, CpuIsa::kAvx512Bf16>;
  const int64_t p_in = g.p_src, p_out = g.p_dst, pairs = (g.c + 1) / 2;
  const int64_t tiles = (g.o + K::mr - 1) / K::mr;
  const int64_t groups = (g.n + kLanes - 1) / kLanes;
  ScratchFrame frame;
  const uint32_t* wt = pack_tap_weights(g, w, frame);
  const int64_t group_bytes = p_in * pairs * kLanes * 4;
  const int64_t per_chunk = std::clamp<int64_t>(kMaxColBytes / group_bytes, 1, groups);
  uint32_t* xt = frame.get<uint32_t>(per_chunk * p_in * pairs * kLanes);
  for (int64_t group0 = 0; group0 < groups; group0 += per_chunk) {
    const int64_t count = std::min(per_chunk, groups - group0);
    // Each unit pairs one pair of channels of 32 images, kBlock pixels at a time, in a buffer
    // [32, kBlock], then writes it to xt as [kBlock, 32]: 128 contiguous bytes per pixel.
    // Written a pair at a time, the pixels of an image lie pairs x 128 bytes apart (32 KiB at
    // 512 channels): a page per store.
    parallel_for(0, count * pairs, 1, [&](int64_t lo, int64_t hi) {
      uint32_t by_image[kLanes][kBlock];
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t group = unit / pairs, i = unit % pairs, c = 2 * i;
        const int64_t image0 = (group0 + group) * kLanes;
        uint32_t* dst = xt + (group * p_in * pairs + i) * kLanes;
        for (int64_t p0 = 0; p0 < p_in; p0 += kBlock) {
          const int64_t width = std::min(kBlock, p_in - p0);
          for (int64_t lane = 0; lane < kLanes; ++lane) {
            uint32_t* row = by_image[lane];
            const int64_t n = image0 + lane;
            if (n >= g.n) {
              std::fill(row, row + width, 0u);
              continue;
            }
            pair_runs(x + (n * g.c + c) * p_in + p0, p_in, c + 1 < g.c, width, row);
          }
          for (int64_t pixel = 0; pixel < width; ++pixel)
            for (int64_t lane = 0; lane < kLanes; ++lane)
              dst[(p0 + pixel) * pairs * kLanes + lane] = by_image[lane][pixel];
        }
      }
    });
    // Each unit's 12 rows of yt, for kBlock output pixels at a time, stay in this thread's
    // cache until they are rounded into y.
    parallel_for(0, count * tiles, 1, [&](int64_t lo, int64_t hi) {
      ScratchFrame unit_frame;
      float* yt = unit_frame.get<float>(kBlock * K::mr * kLanes);
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t group = unit / tiles, first_o = unit % tiles * K::mr;
        const int64_t rows = std::min(K::mr, g.o - first_o);
        const uint32_t* images = xt + group * p_in * pairs * kLanes;
        const int64_t image0 = (group0 + group) * kLanes;
        const int64_t lanes = std::min(kLanes, g.n - image0);
        for (int64_t q0 = 0; q0 < p_out; q0 += kBlock) {
          const int64_t width = std::min(kBlock, p_out - q0);
          for (int64_t q = q0; q < q0 + width; ++q) {
            float* tile = yt + (q - q0) * K::mr * kLanes;
            PairSegment segments[16];  // one per tap inside (at most 16 taps)
            int64_t count_inside = 0;
            for (int64_t e = inside.first[q]; e < inside.first[q + 1]; ++e) {
              const auto [t, pixel] = inside.taps[e];
              segments[count_inside++] = {wt + (t * tiles + first_o / K::mr) * pairs * K::mr,
                                          images + pixel * pairs * kLanes, pairs};
            }
            dot_segments_12x32(rows, segments, count_inside, {tile, kLanes, tile, kLanes, false});
          }
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t o = first_o + r;
            const float b = bias != nullptr ? bias[o] : 0.0f;
            for (int64_t lane = 0; lane < lanes; ++lane) {
              BFloat16* dst = y + ((image0 + lane) * g.o + o) * p_out + q0;
              for (int64_t q = 0; q < width; ++q)
                dst[q] = BFloat16(yt[(q * K::mr + r) * kLanes + lane] + b);
            }
          }
        }
      }
    });
  }
}

// The runs of Note [bf16 batch lanes]'s weight gradient: for tap t, the output pixels where it
// reads inside the image, as runs of consecutive pixels whose inputs are consecutive too (one
// output row's columns inside, each run within a row): entries [first[t], first[t + 1]). At a
// stride the inputs of a run are a stride apart, so x's pixels are laid out by phase (PhaseSlots):
// those of one phase (ih mod sh, iw mod sw) together, row by row, where a run's inputs are
// consecutive again.
struct TapRun {
  int64_t out, in, len;  // first output pixel, the slot of the input it reads, pixels in the run
};
struct TapRuns {
  std::vector<int64_t> first;
  std::vector<TapRun> runs;
};

// Slots of x's pixels by phase: pixel (ih, iw) at ((ih % sh) sw + iw % sw) rows cols + (ih / sh)
// cols + iw / sw, with rows = ceil(h / sh) and cols = ceil(w / sw); slots past a phase's pixels
// are never read. At stride 1, slot = pixel.
struct PhaseSlots {
  int64_t sh, sw, rows, cols;
  explicit PhaseSlots(const Geometry& g)
      : sh(g.stride[0]),
        sw(g.stride[1]),
        rows((g.h + g.stride[0] - 1) / g.stride[0]),
        cols((g.w + g.stride[1] - 1) / g.stride[1]) {}
  int64_t count() const { return sh * sw * rows * cols; }
  int64_t of(int64_t ih, int64_t iw) const {
    return ((ih % sh) * sw + iw % sw) * rows * cols + ih / sh * cols + iw / sw;
  }
};

TapRuns tap_runs(const Geometry& g) {
  const PhaseSlots slots(g);
  TapRuns runs;
  runs.first.push_back(0);
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t offset = kj * g.dilation[1] - g.padding[1];
      int64_t lo = 0, hi = g.wo;  // the output columns whose input column lies inside
      while (lo < hi && lo * g.stride[1] + offset < 0) ++lo;
      while (hi > lo && (hi - 1) * g.stride[1] + offset >= g.w) --hi;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const int64_t ih = oh * g.stride[0] + ki * g.dilation[0] - g.padding[0];
        if (ih < 0 || ih >= g.h || lo >= hi) continue;
        runs.runs.push_back({oh * g.wo + lo, slots.of(ih, lo * g.stride[1] + offset), hi - lo});
      }
      runs.first.push_back(static_cast<int64_t>(runs.runs.size()));
    }
  return runs;
}

// dw [O, C, kh, kw] (float32) = the weight gradient of the convolution of x by Note [bf16 batch
// lanes], turned for the weight: k runs over the images, paired, and the pixels,
//       dW_t [O, C] = sum over runs of tap t of dyt[the run's pixels] @ xc[their inputs]
//   dyt  [O/12, P_out, 16, 12]  dY's A panels: pairs of images (2j, 2j + 1) of a group of 32
//   xc   [C/32, slots, 16, 32]  x's B panels: the same pairs of images, 32 channels a panel,
//                               x's pixels in their PhaseSlots
// so a run of r pixels is a segment of k = 32 r, and a tap's runs one dot_segments_12x32 call;
// each thread owns whole tiles of dW_t, summed over the runs and the groups of 32 images.
void weight_grad_batch_lanes(const Geometry& g, const BFloat16* dy, const BFloat16* x, float* dw) {
  using K = Kernel<BFloat16, CpuIsa::kAvx512Bf16>;
  constexpr int64_t kImagePairs = kLanes / 2;
  const int64_t kk = g.kh * g.kw, p_in = g.h * g.w, p_out = g.p();
  const int64_t tiles = (g.o + K::mr - 1) / K::mr, o_pad = tiles * K::mr;
  const int64_t panels = (g.c + K::nr - 1) / K::nr, c_pad = panels * K::nr;
  const int64_t groups = (g.n + kLanes - 1) / kLanes;
  const TapRuns runs = tap_runs(g);
  const PhaseSlots slots(g);
  const int64_t p_slots = slots.count();
  std::vector<int64_t> slot_of(static_cast<size_t>(p_in));
  for (int64_t ih = 0; ih < g.h; ++ih)
    for (int64_t iw = 0; iw < g.w; ++iw) slot_of[ih * g.w + iw] = slots.of(ih, iw);
  ScratchFrame frame;
  float* dwt = frame.get<float>(o_pad * kk * c_pad);  // [O, kh kw, C] padded
  const int64_t group_bytes = (tiles * p_out * K::mr + panels * p_slots * K::nr) * kImagePairs * 4;
  const int64_t per_chunk = std::clamp<int64_t>(kMaxColBytes / group_bytes, 1, groups);
  uint32_t* dyt = frame.get<uint32_t>(per_chunk * tiles * p_out * kImagePairs * K::mr);
  uint32_t* xc = frame.get<uint32_t>(per_chunk * panels * p_slots * kImagePairs * K::nr);
  // Row `row` of images 2j and 2j + 1 of group `group` of t [N, rows, len] as len pairs in out
  // (zeros for images past the batch and rows past `rows`).
  auto pair_rows = [&](const BFloat16* t, int64_t rows, int64_t len, int64_t group, int64_t j,
                       int64_t row, uint32_t* out) {
    const int64_t n = group * kLanes + 2 * j;
    if (n >= g.n || row >= rows) return std::fill(out, out + len, 0u);
    pair_runs(t + (n * rows + row) * len, rows * len, n + 1 < g.n, len, out);
  };
  // Rows [first, first + width) of group `group`'s images of t [N, rows, len], each pair of
  // images (2j, 2j + 1) paired in `buffer` [width, len], then dealt out as panels [slots, 16,
  // width] at dst, element i of a row at slot(i).
  auto pack_image_pairs = [&](const BFloat16* t, int64_t rows, int64_t len, int64_t group,
                              int64_t first, int64_t width, auto slot, uint32_t* buffer,
                              uint32_t* dst) {
    for (int64_t j = 0; j < kImagePairs; ++j) {
      for (int64_t r = 0; r < width; ++r)
        pair_rows(t, rows, len, group, j, first + r, buffer + r * len);
      for (int64_t i = 0; i < len; ++i)
        for (int64_t r = 0; r < width; ++r)
          dst[(slot(i) * kImagePairs + j) * width + r] = buffer[r * len + i];
    }
  };
  for (int64_t group0 = 0; group0 < groups; group0 += per_chunk) {
    const int64_t count = std::min(per_chunk, groups - group0);
    parallel_for(0, count * (tiles + panels), 1, [&](int64_t lo, int64_t hi) {
      ScratchFrame unit_frame;
      uint32_t* buffer = unit_frame.get<uint32_t>(K::nr * std::max(p_in, p_out));
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t group = unit / (tiles + panels), part = unit % (tiles + panels);
        if (part < tiles) {
          pack_image_pairs(
              dy, g.o, p_out, group0 + group, part * K::mr, K::mr, [](int64_t q) { return q; },
              buffer, dyt + (group * tiles + part) * p_out * kImagePairs * K::mr);
        } else {
          const int64_t panel = part - tiles;
          pack_image_pairs(
              x, g.c, p_in, group0 + group, panel * K::nr, K::nr,
              [&](int64_t pixel) { return slot_of[pixel]; }, buffer,
              xc + (group * panels + panel) * p_slots * kImagePairs * K::nr);
        }
      }
    });
    parallel_for(0, tiles * panels, 1, [&](int64_t lo, int64_t hi) {
      std::vector<PairSegment> segments;  // a tap's runs
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t tile = unit / panels, panel = unit % panels;
        const int64_t rows = std::min(K::mr, g.o - tile * K::mr);
        for (int64_t group = 0; group < count; ++group) {
          const uint32_t* a_panels = dyt + (group * tiles + tile) * p_out * kImagePairs * K::mr;
          const uint32_t* b_panels = xc + (group * panels + panel) * p_slots * kImagePairs * K::nr;
          for (int64_t t = 0; t < kk; ++t) {
            float* tile_out = dwt + (tile * K::mr * kk + t) * c_pad + panel * K::nr;
            segments.clear();
            for (int64_t e = runs.first[t]; e < runs.first[t + 1]; ++e) {
              const TapRun& run = runs.runs[e];
              segments.push_back({a_panels + run.out * kImagePairs * K::mr,
                                  b_panels + run.in * kImagePairs * K::nr, run.len * kImagePairs});
            }
            // The first group writes the tile (zeros for a tap wholly in the padding).
            dot_segments_12x32(rows, segments.data(), static_cast<int64_t>(segments.size()),
                               {tile_out, kk * c_pad, tile_out, kk * c_pad, group0 + group > 0});
          }
        }
      }
    });
  }
  parallel_for(0, g.o, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t t = 0; t < kk; ++t) dw[(o * g.c + c) * kk + t] = dwt[(o * kk + t) * c_pad + c];
  });
}

// Note [bf16 row panels]
//   On large images a "same" layer's taps read padding for few pixels (0.96 of a 3 x 3 layer's
//   products on 32 x 32 read inside), so the batch lanes gain little there, and the patch panels
//   pack each input value once per tap: that packing took 10-12% of a 64-channel 32 x 32
//   layer's forward (perf, AMD EPYC). Where the rows are whole panels (W a multiple of 32) and
//   the stride and dilation are 1, the panels need no packing: with the image paired once and
//   padded,
//       xp [H + kh - 1, C/2, W + kw - 1]   the pairs of channels (2i, 2i + 1) of each padded row
//                                          (zeros in the padding)
//   the B panel of tap (ki, kj) for the 32 output pixels [j, j + 32) of output row oh is
//   xp[oh + ki, :, j + kj ...] as it lies: 32 consecutive pairs per k-pair, the k-pairs a
//   padded row apart (PairSegment::ldb). A tile, 12 output channels by those 32 pixels, sums its
//   kh kw taps over all C channels in registers (one call of dot_segments_12x32, a segment per
//   tap, the weight's A panels packed per tap as for the lanes) and is rounded into y with the
//   bias. The products and sums are the patch panels' in another order. Each thread takes whole
//   images, pairs one into its scratch (148 KiB at 64 channels on 32 x 32) and runs its rows;
//   the kh padded rows a tile reads stay in L1 across the tiles of a row. The forward of a
//   convolution and dx as a convolution take it (both go through conv2d_bf16).
constexpr int64_t kRowPanel = 32;  // Kernel<BFloat16, kAvx512Bf16>::nr

// Whether conv2d_bf16's forward takes Note [bf16 row panels] (where the lanes do not): stride
// and dilation 1, a "same" output whose rows are whole panels, at most 16 taps, and at least 16
// input channels (the 3-channel stem, 2 pairs a tap, took 1.2x the patch panels' time).
bool row_panels(const Geometry& g) {
  return pair_panel_products() && g.stride == kernels::Pair{1, 1} &&
         g.dilation == kernels::Pair{1, 1} && g.ho == g.h && g.wo == g.w && g.w % kRowPanel == 0 &&
         g.kh * g.kw <= 16 && g.c >= 16;
}

// xp (Note [bf16 row panels]) of one image x [C, H, W].
void pair_padded_rows(const Geometry& g, const BFloat16* x, uint32_t* xp) {
  const int64_t pairs = (g.c + 1) / 2, wp = g.w + g.kw - 1, hp = g.h + g.kh - 1;
  const int64_t top = g.padding[0], left = g.padding[1];
  for (int64_t r = 0; r < hp; ++r) {
    const int64_t ih = r - top;
    for (int64_t i = 0; i < pairs; ++i) {
      uint32_t* dst = xp + (r * pairs + i) * wp;
      if (ih < 0 || ih >= g.h) {
        std::fill(dst, dst + wp, 0u);
        continue;
      }
      std::fill(dst, dst + left, 0u);
      std::fill(dst + left + g.w, dst + wp, 0u);
      pair_runs(x + (2 * i * g.h + ih) * g.w, g.h * g.w, 2 * i + 1 < g.c, g.w, dst + left);
    }
  }
}

// y [n, o, H, W] (bfloat16) = the convolution of x by w (plus bias; null: none) by Note [bf16
// row panels].
void row_panel_products(const Geometry& g, const BFloat16* x, const BFloat16* w, const float* bias,
                        BFloat16* y) {
  using K = Kernel<BFloat16, CpuIsa::kAvx512Bf16>;
  const int64_t kk = g.kh * g.kw, pairs = (g.c + 1) / 2;
  const int64_t tiles = (g.o + K::mr - 1) / K::mr;
  const int64_t wp = g.w + g.kw - 1, hp = g.h + g.kh - 1;
  ScratchFrame frame;
  const uint32_t* wt = pack_tap_weights({g.n, g.c, g.h * g.w, g.o, g.p(), kk}, w, frame);
  parallel_for(0, g.n, 1, [&](int64_t lo, int64_t hi) {
    ScratchFrame image_frame;
    uint32_t* xp = image_frame.get<uint32_t>(hp * pairs * wp);
    float* tile = image_frame.get<float>(K::mr * kRowPanel);
    for (int64_t n = lo; n < hi; ++n) {
      pair_padded_rows(g, x + n * g.c * g.h * g.w, xp);
      for (int64_t oh = 0; oh < g.h; ++oh) {
        for (int64_t j = 0; j < g.w; j += kRowPanel) {
          for (int64_t t = 0; t < tiles; ++t) {
            PairSegment segments[16];
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj)
                segments[ki * g.kw + kj] = {wt + ((ki * g.kw + kj) * tiles + t) * pairs * K::mr,
                                            xp + (oh + ki) * pairs * wp + j + kj, pairs, wp};
            const int64_t first_o = t * K::mr, rows = std::min(K::mr, g.o - first_o);
            dot_segments_12x32(rows, segments, kk, {tile, kRowPanel, tile, kRowPanel, false});
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t o = first_o + r;
              const float b = bias != nullptr ? bias[o] : 0.0f;
              const float* src = tile + r * kRowPanel;
              BFloat16* dst = y + ((n * g.o + o) * g.h + oh) * g.w + j;
              for (int64_t q = 0; q < kRowPanel; ++q) dst[q] = BFloat16(src[q] + b);
            }
          }
        }
      }
    }
  });
}
#else   // no vdpbf16ps kernel, no lanes
bool batch_lanes(const Geometry&) { return false; }
bool strided_dx_lanes(const Geometry&) { return false; }
bool row_panels(const Geometry&) { return false; }
#endif  // LOOM_PACKED_GEMM_SIMD

// dx planes of images [first, first + count) (float32, zeroed here) += col2im(dcol [K, count
// P]); each (image, channel) plane on one thread.
void col2im(const Geometry& g, const float* dcol, int64_t ld, int64_t count, float* dx) {
  const int64_t kk = g.kh * g.kw;
  const std::vector<Tap> taps = taps_of(g);
  parallel_for(0, count * g.c, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t image = unit / g.c, c = unit % g.c;
      float* plane = dx + unit * g.h * g.w;
      std::fill(plane, plane + g.h * g.w, 0.0f);
      for (int64_t tap = 0; tap < kk; ++tap) {
        const auto [top, offset, lo_col, hi_col] = taps[tap];
        const float* src = dcol + (c * kk + tap) * ld + image * g.p();
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t ih = oh * g.stride[0] + top;
          if (ih < 0 || ih >= g.h) continue;
          float* row = plane + ih * g.w;
          const float* from = src + oh * g.wo;
          if (g.stride[1] == 1) {
            for (int64_t ow = lo_col; ow < hi_col; ++ow) row[ow + offset] += from[ow];
          } else {
            for (int64_t ow = lo_col; ow < hi_col; ++ow) row[ow * g.stride[1] + offset] += from[ow];
          }
        }
      }
    }
  });
}

// dst [O, count P] (bfloat16) = the planes of images [first, first + count) of y [N, O, P].
void gather_planes(const Geometry& g, const BFloat16* y, int64_t first, int64_t count,
                   BFloat16* dst) {
  parallel_for(0, g.o * count, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t o = unit / count, image = unit % count;
      const BFloat16* src = y + ((first + image) * g.o + o) * g.p();
      std::copy(src, src + g.p(), dst + o * count * g.p() + image * g.p());
    }
  });
}

Tensor nchw(const Tensor& t) { return kernels::contiguous(t); }

// Note [dx as a convolution]: where it applies, and the weight it convolves dY with,
// W'[c, o, kh-1-ki, kw-1-kj] = W[o, c, ki, kj].
bool dx_as_conv(const Geometry& g) {
  return g.stride == kernels::Pair{1, 1} && g.c >= 16 &&
         g.padding[0] <= g.dilation[0] * (g.kh - 1) && g.padding[1] <= g.dilation[1] * (g.kw - 1);
}

// W [O, C, kh, kw] as [C, O, kh, kw]: with `flip`, each kernel turned 180 degrees too (the
// weight of Note [dx as a convolution]); without, the weight of a strided dx in the lanes.
Tensor swapped_weight(const Geometry& g, const BFloat16* w, bool flip) {
  Tensor swapped = empty({g.c, g.o, g.kh, g.kw}, kBFloat16);
  BFloat16* dst = swapped.data_ptr<BFloat16>();
  const int64_t kk = g.kh * g.kw;
  parallel_for(0, g.c, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c)
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t tap = 0; tap < kk; ++tap)
          dst[(c * g.o + o) * kk + (flip ? kk - 1 - tap : tap)] = w[(o * g.c + c) * kk + tap];
  });
  return swapped;
}

}  // namespace

bool conv2d_bf16_fits(const Tensor& x, const kernels::Conv2dOptions& options) {
  return x.dtype() == kBFloat16 && options.groups == 1 && multiplies_16bit(kBFloat16);
}

bool conv2d_bf16_batch_lanes(const Tensor& x, const Tensor& weight,
                             const kernels::Conv2dOptions& options) {
  return conv2d_bf16_fits(x, options) &&
         batch_lanes(geometry(x, weight, options,
                              kernels::conv2d_output_shape(x, weight, Tensor(), options)));
}

bool conv2d_bf16_row_panels(const Tensor& x, const Tensor& weight,
                            const kernels::Conv2dOptions& options) {
  if (!conv2d_bf16_fits(x, options)) return false;
  const Geometry g =
      geometry(x, weight, options, kernels::conv2d_output_shape(x, weight, Tensor(), options));
  return !batch_lanes(g) && row_panels(g);
}

Tensor conv2d_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const kernels::Conv2dOptions& options, const Shape& out_shape) {
  const Geometry g = geometry(x, weight, options, out_shape);
  const MemoryFormat format = suggest_memory_format(x);
  Tensor y = empty(out_shape, kBFloat16);
  const Tensor xc = nchw(x), wc = nchw(weight);
  const Tensor bc = bias.defined() ? kernels::contiguous(kernels::to_dtype(bias, kFloat32)) : bias;
  const BFloat16* xp = xc.data_ptr<BFloat16>();
  const BFloat16* wp = wc.data_ptr<BFloat16>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  BFloat16* yp = y.data_ptr<BFloat16>();
#if LOOM_PACKED_GEMM_SIMD
  if (batch_lanes(g)) {
    lanes_products({g.n, g.c, g.h * g.w, g.o, g.p(), g.kh * g.kw}, inside_taps(g), xp, wp, bp, yp);
    return format == MemoryFormat::kContiguous ? y : kernels::contiguous(y, format);
  }
  if (row_panels(g)) {
    row_panel_products(g, xp, wp, bp, yp);
    return format == MemoryFormat::kContiguous ? y : kernels::contiguous(y, format);
  }
#endif
  const int64_t chunk = chunk_images(g), p = g.p();
  const bool panels = patch_panels(g);
  ScratchFrame frame;
  BFloat16* col = panels ? nullptr : frame.get<BFloat16>(g.k() * chunk * p);
  float* out = frame.get<float>(g.o * chunk * p);
  const std::vector<Tap> taps = panels ? taps_of(g) : std::vector<Tap>();
  for (int64_t first = 0; first < g.n; first += chunk) {
    const int64_t count = std::min(chunk, g.n - first), cols = count * p;
    if (panels) {
#if LOOM_PACKED_GEMM_SIMD
      const BFloat16* chunk_x = xp + first * g.c * g.h * g.w;
      gemm_bf16_pair_panels(
          g.o, cols, g.k(), wp, g.k(),
          [&](int64_t pc, int64_t kc, int64_t j, int64_t nc, uint32_t* dst) {
            avx512::pack_patch_pairs(g, taps.data(), chunk_x, pc, kc, j, nc, dst);
          },
          out, cols);
#endif
    } else {
      im2col(g, xp, first, count, col, cols);
      gemm_bf16(false, false, g.o, cols, g.k(), 1.0f, wp, g.k(), col, cols, 0.0f, out, cols);
    }
    parallel_for(0, count * g.o, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t image = unit / g.o, o = unit % g.o;
        const float* src = out + o * cols + image * p;
        BFloat16* dst = yp + ((first + image) * g.o + o) * p;
        const float b = bp != nullptr ? bp[o] : 0.0f;
        for (int64_t i = 0; i < p; ++i) dst[i] = BFloat16(src[i] + b);
      }
    });
  }
  return format == MemoryFormat::kContiguous ? y : kernels::contiguous(y, format);
}

kernels::Conv2dGrads conv2d_bf16_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                          const kernels::Conv2dOptions& options,
                                          std::array<bool, 3> needs) {
  const Geometry g = geometry(x, weight, options, dout.sizes());
  const Tensor dc = nchw(dout), xc = nchw(x), wc = nchw(weight);
  const BFloat16* dyp = dc.data_ptr<BFloat16>();
  const BFloat16* xp = xc.data_ptr<BFloat16>();
  const BFloat16* wp = wc.data_ptr<BFloat16>();
  const int64_t chunk = chunk_images(g), p = g.p(), k = g.k();
  kernels::Conv2dGrads grads;
  const bool dx_by_conv = needs[0] && dx_as_conv(g);
  const bool dx_in_lanes = needs[0] && !dx_by_conv && strided_dx_lanes(g);
  const bool dx_by_dcol = needs[0] && !dx_by_conv && !dx_in_lanes;
  Tensor dx;
  if (dx_by_conv) {
    const kernels::Conv2dOptions flipped{
        {1, 1},
        {g.dilation[0] * (g.kh - 1) - g.padding[0], g.dilation[1] * (g.kw - 1) - g.padding[1]},
        g.dilation,
        1};
    dx = conv2d_bf16(dc, swapped_weight(g, wp, /*flip=*/true), Tensor(), flipped, x.sizes());
  } else if (needs[0]) {
    dx = empty(x.sizes(), kBFloat16);
#if LOOM_PACKED_GEMM_SIMD
    if (dx_in_lanes)
      lanes_products({g.n, g.o, g.p(), g.c, g.h * g.w, g.kh * g.kw}, reading_taps(g), dyp,
                     swapped_weight(g, wp, /*flip=*/false).data_ptr<BFloat16>(), nullptr,
                     dx.data_ptr<BFloat16>());
#endif
  }
  // dW in the lanes (Note [bf16 batch lanes]); else its B straight from the image where the
  // forward packs its panels so (Note [bf16 patch panels]); col otherwise, by chunks of images.
  const bool dw_lanes = needs[1] && batch_lanes(g);
  const bool dw_panels = needs[1] && !dw_lanes && patch_panels(g);
  const bool dw_by_chunks = needs[1] && !dw_lanes;
  const std::vector<Tap> taps = dw_panels ? taps_of(g) : std::vector<Tap>();
  ScratchFrame frame;
  // Every path writes all of dw before it reads it (the first chunk does not accumulate); with no
  // images it is not read.
  float* dw = needs[1] ? frame.get<float>(g.o * k) : nullptr;
  const bool by_chunks = dw_by_chunks || dx_by_dcol;
  BFloat16* dy = by_chunks ? frame.get<BFloat16>(g.o * chunk * p) : nullptr;
  BFloat16* col = dw_by_chunks && !dw_panels ? frame.get<BFloat16>(k * chunk * p) : nullptr;
  float* dcol = dx_by_dcol ? frame.get<float>(k * chunk * p) : nullptr;
  float* dx_chunk = dx_by_dcol ? frame.get<float>(chunk * g.c * g.h * g.w) : nullptr;
#if LOOM_PACKED_GEMM_SIMD
  if (dw_lanes && g.n > 0) weight_grad_batch_lanes(g, dyp, xp, dw);
#endif
  for (int64_t first = 0; first < g.n && by_chunks; first += chunk) {
    const int64_t count = std::min(chunk, g.n - first), cols = count * p;
    gather_planes(g, dyp, first, count, dy);
    if (dw_panels) {  // dW [O, K] += dY [O, cols] @ col^T
#if LOOM_PACKED_GEMM_SIMD
      const BFloat16* chunk_x = xp + first * g.c * g.h * g.w;
      gemm_bf16_pair_panels(
          g.o, k, cols, dy, cols,
          [&](int64_t pc, int64_t kc, int64_t j, int64_t nc, uint32_t* dst) {
            avx512::pack_patch_columns(g, taps.data(), chunk_x, pc, kc, j, nc, dst);
          },
          dw, k, /*accumulate=*/first != 0);
#endif
    } else if (dw_by_chunks) {
      im2col(g, xp, first, count, col, cols);
      gemm_bf16(false, true, g.o, k, cols, 1.0f, dy, cols, col, cols, first == 0 ? 0.0f : 1.0f, dw,
                k);
    }
    if (dx_by_dcol) {  // dcol [K, cols] = W^T @ dY, then col2im
      gemm_bf16(true, false, k, cols, g.o, 1.0f, wp, k, dy, cols, 0.0f, dcol, cols);
      col2im(g, dcol, cols, count, dx_chunk);
      BFloat16* dst = dx.data_ptr<BFloat16>() + first * g.c * g.h * g.w;
      const int64_t size = count * g.c * g.h * g.w;
      parallel_for(0, size, kParallelGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) dst[i] = BFloat16(dx_chunk[i]);
      });
    }
  }
  if (needs[0]) {
    if (g.n == 0 && dx_by_dcol) kernels::fill_(dx, 0);
    grads.dx = suggest_memory_format(x) == MemoryFormat::kContiguous
                   ? dx
                   : kernels::contiguous(dx, suggest_memory_format(x));
  }
  if (needs[1]) {
    Tensor dweight = empty(weight.sizes(), kBFloat16);
    BFloat16* dst = dweight.data_ptr<BFloat16>();
    parallel_for(0, g.o * k, kParallelGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = BFloat16(g.n == 0 ? 0.0f : dw[i]);
    });
    grads.dweight = suggest_memory_format(weight) == MemoryFormat::kContiguous
                        ? dweight
                        : kernels::contiguous(dweight, suggest_memory_format(weight));
  }
  if (needs[2]) {  // the sum of dY over the batch and the pixels, in double
    grads.dbias = empty({g.o}, kBFloat16);
    BFloat16* db = grads.dbias.data_ptr<BFloat16>();
    parallel_for(0, g.o, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        double sum = 0;
        for (int64_t n = 0; n < g.n; ++n) {
          const BFloat16* v = dyp + (n * g.o + o) * p;
          for (int64_t i = 0; i < p; ++i) sum += static_cast<float>(v[i]);
        }
        db[o] = BFloat16(static_cast<float>(sum));
      }
    });
  }
  return grads;
}

}  // namespace loom::cpu
