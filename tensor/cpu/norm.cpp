// tensor/cpu/norm.cpp — batch norm and layer norm on the CPU. Batch norm runs one channel per
// thread over x [N, C, S] (a channel's N rows of S values; a channels-last x is walked as
// [N S, C, 1], its memory order, and its outputs stay channels-last); layer norm runs rows of
// x [M, D] in parallel and its dweight/dbias as column blocks. Sums accumulate in double. Loops
// only: the front (tensor/norm.cpp) has checked the arguments and widened a 16-bit x.

#include "tensor/cpu/norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

using kernels::BatchNormEpilogue;
using kernels::BatchNormStats;
using kernels::BatchNormSums;
using kernels::ChannelLayout;
using kernels::LayerNormForward;
using kernels::NormGrads;

// The kernels these loops are written with (tensor/copy.h, tensor/elementwise.h,
// tensor/view.h); they dispatch on the device themselves.
using kernels::add;
using kernels::add_scalar;
using kernels::contiguous;
using kernels::copy_;
using kernels::mul_scalar;
using kernels::reshape;
using kernels::rsqrt;
using kernels::to_dtype;

namespace {

// A sum in kLanes independent accumulators, added pairwise at the end. The compiler keeps the
// lanes in vector registers (four of 256 bits), so the adds neither wait on one another's
// latency nor run a lane at a time: four scalar accumulators, which GCC packed two to a
// 128-bit register, summed about one value per cycle; these sum about three. The lanes carry
// over from one add() to the next, so a channel's short rows (16 values at 4 x 4) do not each
// pay for the final additions.
class LaneSum {
 public:
  // Adds f(0..n-1).
  template <typename F>
  void add(int64_t n, F&& f) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes_[j] += f(i + j);
    for (int j = 0; j < kLanes && i + j < n; ++j) lanes_[j] += f(i + j);
  }

  // Adds f(0..n-1) to a and g(0..n-1) to b in one pass over i: each lane takes the same values
  // in the same order as two calls of add would give it.
  template <typename F, typename G>
  static void add_pairs(LaneSum& a, LaneSum& b, int64_t n, F&& f, G&& g) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) a.lanes_[j] += f(i + j), b.lanes_[j] += g(i + j);
    for (int j = 0; j < kLanes && i + j < n; ++j) a.lanes_[j] += f(i + j), b.lanes_[j] += g(i + j);
  }

  double total() const {
    double t[kLanes];
    std::copy_n(lanes_, kLanes, t);
    for (int width = kLanes / 2; width > 0; width /= 2)
      for (int j = 0; j < width; ++j) t[j] += t[j + width];
    return t[0];
  }

 private:
  static constexpr int kLanes = 16;
  double lanes_[kLanes] = {};
};

// Sum of f(0..n-1).
template <typename F>
inline double accumulate(int64_t n, F&& f) {
  LaneSum sum;
  sum.add(n, f);
  return sum.total();
}

// ---------------------------------------------------------------- channel helpers

// A checked vector as a contiguous tensor of dtype; undefined stays undefined.
Tensor channel_vector(const Tensor& t, DType dtype) {
  return t.defined() ? contiguous(to_dtype(t, dtype)) : t;
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// Note [Fetching a channel's rows ahead]
// A channel of [N, C, S] is N rows of S values, C S apart. The hardware prefetchers follow a
// stream within a page, so they start over at every row, and the passes that read a channel
// from memory (its statistics, the backward's sums) wait on the first lines of each row: all of
// a row at 8 x 8 (S = 64, four lines). Where a row is shorter than a page, these passes ask for
// the row `ahead` rows on, about 2 KiB ahead, a line at a time, as they start each row. On
// [128, C, S] with 2 threads that took 15-20% off the batch norm's forward and backward at 16 x
// 16 and 8 x 8; at 32 x 32 (a page per row) it added 5-20%, so rows of a page or more are left
// to the hardware (ahead = 0).
template <typename T>
int64_t rows_ahead(const ChannelLayout& l) {
  const int64_t per_page = 4096 / static_cast<int64_t>(sizeof(T));
  if (l.s >= per_page) return 0;
  return std::max<int64_t>(2, per_page / 2 / std::max<int64_t>(l.s, 1));
}

template <typename T>
inline void fetch_row(const T* row, int64_t s) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t i = 0; i < s; i += kLine) __builtin_prefetch(row + i);
}

// Note [Batch norm on bfloat16]
//   A bfloat16 x, with its residual, dy and the ReLU's y, is read and written as it is: the
//   loops take each row kChunk values at a time, widen the chunk into float32 buffers on the
//   thread's stack, run the float32 code on them and round y or dx once on the way out. Every
//   value and sum is that of the float32 loops on a widened copy, bit for bit (a chunk holds a
//   whole number of LaneSum's lanes, so each lane adds the same values in the same order;
//   norm_test compares the two). What goes is the copies in memory: the widened path wrote a
//   float32 copy of each operand and read it back, and wrote y or dx in float32 for a pass that
//   rounded it, about three times the bytes of the bfloat16 tensors. That lets bf16 autocast
//   keep the activations around batch norm in bfloat16 on the CPU (Note [Autocast policy] in
//   autograd/autocast.h). Loops written element by element on bfloat16 (a conversion in every
//   load and store) vectorised poorly: the backward took 2.5-4 times the float32 one's time.
//   With chunks, against the float32 loops, with a residual and the ReLU, batch 64, 2 threads
//   (AMD EPYC): 0.71-0.73 of their forward's time and 0.81-0.87 of their backward's on 64
//   channels of 32 x 32, where the bytes decide; on smaller images, where the conversions
//   weigh more than the bytes, the backward 0.78 (16 x 16) to 1.45 (8 x 8) and the forward
//   1.25-1.6. The bf16 ResNet-18 step gains: the casts around its convolutions go too.
template <typename T>
constexpr bool kChunked = std::is_same_v<T, BFloat16>;
constexpr int64_t kChunk = 256;  // a multiple of LaneSum's lanes

inline void widen_run(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
inline void round_run(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16(src[i]);
}

// f(at, n) for the chunks [at, at + n) of a row of s values.
template <typename F>
void for_chunks(int64_t s, F&& f) {
  for (int64_t at = 0; at < s; at += kChunk) f(at, std::min(kChunk, s - at));
}

// The sums of f(value) and g(value) over one channel of [N, C, S], in one pass over it (each
// lane adds what LaneSum::add would give it).
template <typename T, typename F, typename G>
std::pair<double, double> channel_sums(const T* data, const ChannelLayout& l, int64_t c, F&& f,
                                       G&& g) {
  LaneSum sum_f, sum_g;
  const int64_t ahead = rows_ahead<T>(l);
  for (int64_t b = 0; b < l.n; ++b) {
    if (ahead && b + ahead < l.n) fetch_row(data + l.row(b + ahead, c), l.s);
    auto add_run = [&](const auto* run, int64_t n) {
      LaneSum::add_pairs(
          sum_f, sum_g, n, [&](int64_t i) { return f(static_cast<double>(run[i])); },
          [&](int64_t i) { return g(static_cast<double>(run[i])); });
    };
    const T* row = data + l.row(b, c);
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.s, [&](int64_t at, int64_t n) {
        float wide[kChunk];
        widen_run(row + at, wide, n);
        add_run(wide, n);
      });
    } else {
      add_run(row, l.s);
    }
  }
  return {sum_f.total(), sum_g.total()};
}

// Note [Batch norm's moments in one pass]
//   A channel's mean and variance come from one read of its values: the sums of d = x - k and
//   of d^2 in double, k the channel's first value, then mean = k + E[d] and var = E[d^2] -
//   E[d]^2. The subtraction loses about log2(1 + (mean - k)^2 / var) of double's 53 bits, and k,
//   one of the values, lies within a few standard deviations of the mean: a few bits, where the
//   result is rounded to float32's 24. Two passes (the mean, then the squares of x - mean) read
//   the channel twice, the second time from L2; one pass took 0.70-0.80 of the forward's time
//   at batch 128 on [128, 16-64, 32-8, 32-8] and half on [128, 128, 4, 4] (2 threads, paired
//   medians; docs/cpu_speed.md). A variance that rounds below zero is zero; NaN stays NaN.
template <typename T>
std::pair<double, double> channel_moments(const T* x, const ChannelLayout& l, int64_t c) {
  const double count = static_cast<double>(l.count());
  const double k = l.count() > 0 ? static_cast<double>(x[l.row(0, c)]) : 0.0;  // none: NaN
  const auto [sum, sum_sq] = channel_sums(
      x, l, c, [k](double v) { return v - k; }, [k](double v) { return (v - k) * (v - k); });
  const double shift = sum / count;
  double var = sum_sq / count - shift * shift;
  if (var < 0) var = 0;
  return {k + shift, var};
}

// The epilogue of a batch norm forward as the loops see it (Note [Batch norm with ReLU]).
template <typename T>
struct Epilogue {
  const T* residual;  // null: none; laid out as x
  bool relu;
};

// y[i] = x[i] scale(i) + shift(i), plus residual[i], then the ReLU, for i < n; the pointers
// start at the run. One loop per form, so each vectorises; scale and shift are constants
// (a channel's row) or per value (an interleaved row).
template <typename T, typename Scale, typename Shift>
void affine_run(const T* x, const T* residual, bool relu, T* y, int64_t n, Scale scale,
                Shift shift) {
  auto positive = [](T v) { return v > 0 ? v : T(0); };  // relu's test, tensor/cpu/elementwise.cpp
  if (residual && relu)
    for (int64_t i = 0; i < n; ++i) y[i] = positive(x[i] * scale(i) + shift(i) + residual[i]);
  else if (residual)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale(i) + shift(i) + residual[i];
  else if (relu)
    for (int64_t i = 0; i < n; ++i) y[i] = positive(x[i] * scale(i) + shift(i));
  else
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale(i) + shift(i);
}

// y = x scale + shift, then the epilogue, over one channel.
template <typename T>
void channel_affine(const T* x, T* y, const ChannelLayout& l, int64_t c, math_t<T> scale,
                    math_t<T> shift, Epilogue<T> e) {
  auto constant = [](math_t<T> v) { return [v](int64_t) { return v; }; };
  for (int64_t b = 0; b < l.n; ++b) {
    const int64_t row = l.row(b, c);
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.s, [&](int64_t at, int64_t n) {
        float in[kChunk], res[kChunk], out[kChunk];
        widen_run(x + row + at, in, n);
        if (e.residual) widen_run(e.residual + row + at, res, n);
        affine_run(in, e.residual ? res : nullptr, e.relu, out, n, constant(scale),
                   constant(shift));
        round_run(out, y + row + at, n);
      });
    } else {
      affine_run(x + row, e.residual ? e.residual + row : nullptr, e.relu, y + row, l.s,
                 constant(scale), constant(shift));
    }
  }
}

// The gradient a batch norm's backward reads: dy, or with a fused ReLU (kMasked) dy where its
// output y is positive and 0 elsewhere (relu_backward's test; Note [Batch norm with ReLU]).
// The mask is applied to dy's bits (all kept, or none: +0.0) rather than by a select, which
// GCC turns into a branch around the sums' adds. About half the mask is 0, so such a branch
// is mispredicted half the time: the sums ran 11 times slower with it.
template <typename T, bool kMasked>
struct Grad {
  using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  const T* dy;
  const T* relu_y;  // used when kMasked
  // Asks for the s values from i on (fetch_row).
  void fetch(int64_t i, int64_t s) const {
    fetch_row(dy + i, s);
    if constexpr (kMasked) fetch_row(relu_y + i, s);
  }
  T operator()(int64_t i) const {
    if constexpr (kMasked) {
      const Bits keep = Bits{0} - static_cast<Bits>(relu_y[i] > 0);
      return std::bit_cast<T>(std::bit_cast<Bits>(dy[i]) & keep);
    } else {
      return dy[i];
    }
  }
  // A bfloat16 Grad's values [at, at + n) widened into the buffers, as the float32 Grad that
  // reads them from index 0 (Note [Batch norm on bfloat16]).
  Grad<float, kMasked> widened(int64_t at, int64_t n, float* dy_buf, float* relu_y_buf) const {
    widen_run(dy + at, dy_buf, n);
    if constexpr (kMasked) widen_run(relu_y + at, relu_y_buf, n);
    return {dy_buf, kMasked ? relu_y_buf : nullptr};
  }
};

// f(grad) with the Grad of dy that relu_y asks for (null: none): each loop compiled for one.
template <typename T, typename F>
void with_grad(const T* dy, const T* relu_y, F&& f) {
  if (relu_y)
    f(Grad<T, true>{dy, relu_y});
  else
    f(Grad<T, false>{dy, nullptr});
}

// sum(dy) and sum(dy (x - mean)) over one channel.
template <typename T, typename G>
std::pair<double, double> channel_grad_sums(G dy, const T* x, const ChannelLayout& l, int64_t c,
                                            double mean) {
  LaneSum sum_dy, sum_dy_xmu;
  const int64_t ahead = rows_ahead<T>(l);
  for (int64_t b = 0; b < l.n; ++b) {
    if (ahead && b + ahead < l.n) {  // Note [Fetching a channel's rows ahead]
      const int64_t next = l.row(b + ahead, c);
      fetch_row(x + next, l.s);
      dy.fetch(next, l.s);
    }
    // Adds the n values of g from index at, with x's run in.
    auto add_run = [&](const auto& g, int64_t at, const auto* in, int64_t n) {
      LaneSum::add_pairs(
          sum_dy, sum_dy_xmu, n, [&](int64_t i) { return static_cast<double>(g(at + i)); },
          [&](int64_t i) {
            return static_cast<double>(g(at + i)) * (static_cast<double>(in[i]) - mean);
          });
    };
    const int64_t row = l.row(b, c);
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.s, [&](int64_t at, int64_t n) {
        float g[kChunk], y[kChunk], in[kChunk];
        const auto wide = dy.widened(row + at, n, g, y);
        widen_run(x + row + at, in, n);
        add_run(wide, 0, in, n);
      });
    } else {
      add_run(dy, row, x + row, l.s);
    }
  }
  return {sum_dy.total(), sum_dy_xmu.total()};
}

// dx = a dy + b x + k and dres = dy over a run of n values: g's from index at, x's, dx's and
// dres's from their pointers (dx or dres null: not written).
template <typename G, typename M>
void dx_run(const G& g, int64_t at, const M* in, M* dx, M* dres, int64_t n, M a, M b, M k) {
  if (dx && dres) {
    for (int64_t i = 0; i < n; ++i) {
      const M v = g(at + i);
      dx[i] = a * v + b * in[i] + k;
      dres[i] = v;
    }
  } else if (dx) {
    for (int64_t i = 0; i < n; ++i) dx[i] = a * g(at + i) + b * in[i] + k;
  } else if (dres) {
    for (int64_t i = 0; i < n; ++i) dres[i] = g(at + i);
  }
}

// dx = a dy + b x + k over one channel (every batch-norm dx is of that form); with dres, the
// (masked) dy it read too.
template <typename T, typename G>
void channel_dx(G dy, const T* x, T* dx, T* dres, const ChannelLayout& l, int64_t c, double a,
                double b, double k) {
  using M = math_t<T>;
  const M ta = static_cast<M>(a), tb = static_cast<M>(b), tk = static_cast<M>(k);
  for (int64_t n = 0; n < l.n; ++n) {
    const int64_t row = l.row(n, c);
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.s, [&](int64_t at, int64_t len) {
        float g[kChunk], y[kChunk], in[kChunk], out_dx[kChunk], out_dres[kChunk];
        const auto wide = dy.widened(row + at, len, g, y);
        widen_run(x + row + at, in, len);
        dx_run(wide, 0, in, dx ? out_dx : nullptr, dres ? out_dres : nullptr, len, ta, tb, tk);
        if (dx) round_run(out_dx, dx + row + at, len);
        if (dres) round_run(out_dres, dres + row + at, len);
      });
    } else {
      dx_run(dy, row, x + row, dx ? dx + row : nullptr, dres ? dres + row : nullptr, l.s, ta, tb,
             tk);
    }
  }
}

// ---------------------------------------------------------------- interleaved channels
// Note [Batch norm over interleaved channels]
// With S = 1 (a channels-last x, which the kernels see as [N H W, C, 1], or a 2-D [N, C]) the
// values of one channel lie C apart, and a thread per channel would read every cache line of x
// once per channel (35 times slower on a channels-last [128, 32, 32, 32]). These helpers treat
// such an x as the row-major [M, C] matrix it is. Sums: threads take fixed blocks of rows and add
// each row into the block's C sums (unit stride, every channel at once); the blocks' sums are
// then added in block order, so the result is the same for any number of threads. Maps (y, dx)
// run over rows with per-channel coefficients.

// K sums per channel of an interleaved x: add_row(offset of row m, acc) adds row m into
// acc[j C + c] for j < K. Returns the totals as [K][C].
// Blocks hold about kParallelGrain values, and there are at most kMaxColumnBlocks of them, so
// the partial sums take at most kMaxColumnBlocks K C doubles however large x is.
constexpr int64_t kMaxColumnBlocks = 64;

template <int K, typename AddRow>
std::vector<double> column_sums(const ChannelLayout& l, AddRow&& add_row) {
  const int64_t rows = l.n, width = K * l.c;
  const int64_t by_grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(l.c, 1));
  const int64_t block = std::max(by_grain, (rows + kMaxColumnBlocks - 1) / kMaxColumnBlocks);
  const int64_t blocks = (rows + block - 1) / block;
  std::vector<double> partial(static_cast<size_t>(blocks * width), 0.0);
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      double* acc = partial.data() + b * width;
      for (int64_t m = b * block; m < std::min(rows, (b + 1) * block); ++m) add_row(m * l.c, acc);
    }
  });
  // Each column adds its blocks in block order; columns split over threads.
  std::vector<double> total(static_cast<size_t>(width), 0.0);
  parallel_for(0, width, grain_for(blocks), [&](int64_t lo, int64_t hi) {
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = lo; j < hi; ++j) total[j] += partial[b * width + j];
  });
  return total;
}

// Mean and biased variance of every channel of an interleaved x.
template <typename T>
std::pair<std::vector<double>, std::vector<double>> interleaved_moments(const T* x,
                                                                        const ChannelLayout& l) {
  // One pass, shifted by the first row (Note [Batch norm's moments in one pass]).
  const double count = static_cast<double>(l.count());
  std::vector<double> k(static_cast<size_t>(l.c));
  if (l.count() > 0)  // none: the moments are NaN, as 0 / 0
    for (int64_t c = 0; c < l.c; ++c) k[c] = static_cast<double>(x[c]);
  // Adds n channels from channel `first`, their values from in.
  auto add_run = [&](const auto* in, int64_t first, int64_t n, double* acc) {
    for (int64_t c = first; c < first + n; ++c) {
      const double d = static_cast<double>(in[c - first]) - k[c];
      acc[c] += d;
      acc[l.c + c] += d * d;
    }
  };
  const std::vector<double> sums = column_sums<2>(l, [&](int64_t row, double* acc) {
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.c, [&](int64_t at, int64_t n) {
        float in[kChunk];
        widen_run(x + row + at, in, n);
        add_run(in, at, n, acc);
      });
    } else {
      add_run(x + row, 0, l.c, acc);
    }
  });
  std::vector<double> mean(static_cast<size_t>(l.c)), var(static_cast<size_t>(l.c));
  for (int64_t c = 0; c < l.c; ++c) {
    const double shift = sums[c] / count;
    mean[c] = k[c] + shift;
    var[c] = sums[l.c + c] / count - shift * shift;
    if (var[c] < 0) var[c] = 0;
  }
  return {mean, var};
}

// sum(dy) and sum(dy (x - mean)) of every channel of an interleaved x, as [2][C].
template <typename T, typename G>
std::vector<double> interleaved_grad_sums(G dy, const T* x, const ChannelLayout& l,
                                          const math_t<T>* mean) {
  // Adds n channels from channel `first`: g's values from index at, x's from in.
  auto add_run = [&](const auto& g, int64_t at, const auto* in, int64_t first, int64_t n,
                     double* acc) {
    for (int64_t c = first; c < first + n; ++c) {
      const double v = static_cast<double>(g(at + c - first));
      acc[c] += v;
      acc[l.c + c] += v * (static_cast<double>(in[c - first]) - static_cast<double>(mean[c]));
    }
  };
  return column_sums<2>(l, [&](int64_t row, double* acc) {
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.c, [&](int64_t at, int64_t n) {
        float g[kChunk], y[kChunk], in[kChunk];
        const auto wide = dy.widened(row + at, n, g, y);
        widen_run(x + row + at, in, n);
        add_run(wide, 0, in, at, n, acc);
      });
    } else {
      add_run(dy, row, x + row, 0, l.c, acc);
    }
  });
}

// map_row(offset of row m) for every row of an interleaved x, rows split over threads.
template <typename MapRow>
void for_rows(const ChannelLayout& l, MapRow&& map_row) {
  parallel_for(0, l.n, grain_for(l.c), [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) map_row(m * l.c);
  });
}

// y = x scale_c + shift_c, then the epilogue, over an interleaved x.
template <typename T>
void interleaved_affine(const T* x, T* y, const ChannelLayout& l, const math_t<T>* scale,
                        const math_t<T>* shift, Epilogue<T> e) {
  for_rows(l, [&](int64_t row) {
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.c, [&](int64_t at, int64_t n) {
        float in[kChunk], res[kChunk], out[kChunk];
        widen_run(x + row + at, in, n);
        if (e.residual) widen_run(e.residual + row + at, res, n);
        affine_run(
            in, e.residual ? res : nullptr, e.relu, out, n,
            [scale, at](int64_t c) { return scale[at + c]; },
            [shift, at](int64_t c) { return shift[at + c]; });
        round_run(out, y + row + at, n);
      });
    } else {
      affine_run(
          x + row, e.residual ? e.residual + row : nullptr, e.relu, y + row, l.c,
          [scale](int64_t c) { return scale[c]; }, [shift](int64_t c) { return shift[c]; });
    }
  });
}

// dx = a_c dy + b_c x + k_c over an interleaved x; coef is [3][C]: a, then b, then k. With dres,
// the (masked) dy it read too. dx may be null.
template <typename T, typename G>
void interleaved_dx(G dy, const T* x, T* dx, T* dres, const ChannelLayout& l,
                    const math_t<T>* coef) {
  using M = math_t<T>;
  const M *a = coef, *b = coef + l.c, *k = coef + 2 * l.c;
  // n channels from channel `first`: g's values from index at, x's from in, into out_dx and
  // out_dres (either null: not written).
  auto run = [&](const auto& g, int64_t at, const M* in, M* out_dx, M* out_dres, int64_t first,
                 int64_t n) {
    if (out_dx)
      for (int64_t c = 0; c < n; ++c)
        out_dx[c] = a[first + c] * g(at + c) + b[first + c] * in[c] + k[first + c];
    if (out_dres)
      for (int64_t c = 0; c < n; ++c) out_dres[c] = g(at + c);
  };
  for_rows(l, [&](int64_t row) {
    if constexpr (kChunked<T>) {  // Note [Batch norm on bfloat16]
      for_chunks(l.c, [&](int64_t at, int64_t n) {
        float g[kChunk], y[kChunk], in[kChunk], out_dx[kChunk], out_dres[kChunk];
        const auto wide = dy.widened(row + at, n, g, y);
        widen_run(x + row + at, in, n);
        run(wide, 0, in, dx ? out_dx : nullptr, dres ? out_dres : nullptr, at, n);
        if (dx) round_run(out_dx, dx + row + at, n);
        if (dres) round_run(out_dres, dres + row + at, n);
      });
    } else {
      run(dy, row, x + row, dx ? dx + row : nullptr, dres ? dres + row : nullptr, 0, l.c);
    }
  });
}

// The (a, b, k) of channel_dx. Training (sums given, over `count` values):
//   dx = w invstd (dy - sum_dy / M - (x - mean) invstd sum_dy_xhat / M)
// Eval (no sums): dx = w invstd dy.
struct DxCoefficients {
  double a, b, k;
};
DxCoefficients dx_coefficients(double weight, double mean, double invstd, bool training,
                               double sum_dy, double sum_dy_xhat, double count) {
  const double a = weight * invstd;
  if (!training) return {a, 0.0, 0.0};
  const double b = -a * invstd * sum_dy_xhat / count;
  return {a, b, -a * sum_dy / count - b * mean};
}

// The (a, b, k) of every channel, of(c), as the [3][C] table of interleaved_dx.
template <typename T, typename Of>
std::vector<T> dx_table(int64_t channels, Of&& of) {
  std::vector<T> table(static_cast<size_t>(3 * channels));
  for (int64_t c = 0; c < channels; ++c) {
    const DxCoefficients k = of(c);
    table[c] = static_cast<T>(k.a);
    table[channels + c] = static_cast<T>(k.b);
    table[2 * channels + c] = static_cast<T>(k.k);
  }
  return table;
}

// Calls f<T>() with T the type of x's elements: float, double, or BFloat16 read and written as
// it is and computed in float (Note [Batch norm on bfloat16]).
template <typename F>
void dispatch_batch_norm(DType dtype, const char* op, F&& f) {
  if (dtype == kBFloat16) return f.template operator()<BFloat16>();
  dispatch_floating(dtype, op, f);
}

// The dtype x's values are computed in, and that of the statistics, parameters and their
// gradients: float32 for a bfloat16 x, x's own otherwise.
DType math_dtype(DType x) { return x == kBFloat16 ? kFloat32 : x; }

// A checked epilogue's residual in x's memory format (read in the same order as x).
Tensor residual_like(const BatchNormEpilogue& e, MemoryFormat format) {
  return e.residual.defined() ? contiguous(e.residual, format) : Tensor();
}

}  // namespace

// ---------------------------------------------------------------- batch norm statistics

BatchNormSums batch_norm_sums(const Tensor& x) {
  const ChannelLayout l = kernels::channel_layout("batch_norm_sums", x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  BatchNormSums out{empty({l.c}, kFloat64), empty({l.c}, kFloat64), l.count()};
  dispatch_floating(x.dtype(), "batch_norm_sums", [&]<typename T>() {
    const T* xp = xc.data_ptr<T>();
    double* sum = out.sum.data_ptr<double>();
    double* sum_sq = out.sum_sq.data_ptr<double>();
    if (mem.s == 1) {  // Note [Batch norm over interleaved channels]
      const std::vector<double> t = column_sums<2>(mem, [&](int64_t row, double* acc) {
        for (int64_t c = 0; c < l.c; ++c) {
          const double v = static_cast<double>(xp[row + c]);
          acc[c] += v;
          acc[l.c + c] += v * v;
        }
      });
      std::copy_n(t.begin(), l.c, sum);
      std::copy_n(t.begin() + l.c, l.c, sum_sq);
      return;
    }
    parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        std::tie(sum[c], sum_sq[c]) = channel_sums(
            xp, mem, c, [](double v) { return v; }, [](double v) { return v * v; });
      }
    });
  });
  return out;
}

BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq, int64_t count,
                                          double eps, DType dtype) {
  const int64_t channels = sum.numel();
  const Tensor s = contiguous(to_dtype(sum, kFloat64)), sq = contiguous(to_dtype(sum_sq, kFloat64));
  BatchNormStats out{empty({channels}, dtype), empty({channels}, dtype), empty({channels}, dtype),
                     count};
  dispatch_floating(dtype, "batch_norm_stats_from_sums", [&]<typename T>() {
    const double* sp = s.data_ptr<double>();
    const double* sqp = sq.data_ptr<double>();
    T* mean = out.mean.data_ptr<T>();
    T* invstd = out.invstd.data_ptr<T>();
    T* var = out.var.data_ptr<T>();
    for (int64_t c = 0; c < channels; ++c) {
      const double m = sp[c] / count;
      const double v = std::max(sqp[c] / count - m * m, 0.0);
      mean[c] = static_cast<T>(m);
      var[c] = static_cast<T>(v);
      invstd[c] = static_cast<T>(1.0 / std::sqrt(v + eps));
    }
  });
  return out;
}

BatchNormStats batch_norm_stats(const Tensor& x, double eps, DType dtype) {
  const char* op = "batch_norm_stats";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  BatchNormStats out{empty({l.c}, dtype), empty({l.c}, dtype), empty({l.c}, dtype), l.count()};
  // T: x's dtype; S: the statistics' dtype. Each is computed in double and rounded once.
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    dispatch_floating(dtype, op, [&]<typename S>() {
      const T* xp = xc.data_ptr<T>();
      S* mean = out.mean.data_ptr<S>();
      S* invstd = out.invstd.data_ptr<S>();
      S* var = out.var.data_ptr<S>();
      if (mem.s == 1) {  // Note [Batch norm over interleaved channels]
        const auto [m, v] = interleaved_moments(xp, mem);
        for (int64_t c = 0; c < l.c; ++c) {
          mean[c] = static_cast<S>(m[c]);
          var[c] = static_cast<S>(v[c]);
          invstd[c] = static_cast<S>(1.0 / std::sqrt(v[c] + eps));
        }
        return;
      }
      parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          const auto [m, v] = channel_moments(xp, mem, c);
          mean[c] = static_cast<S>(m);
          var[c] = static_cast<S>(v);
          invstd[c] = static_cast<S>(1.0 / std::sqrt(v + eps));
        }
      });
    });
  });
  return out;
}

Tensor batch_norm_invstd(const Tensor& var, double eps) { return rsqrt(add_scalar(var, eps)); }

void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const BatchNormStats& stats, double momentum) {
  if (running_mean.defined()) {
    const Tensor batch = reshape(to_dtype(stats.mean, running_mean.dtype()), running_mean.sizes());
    copy_(running_mean, add(mul_scalar(running_mean, 1.0 - momentum), batch, momentum));
  }
  if (running_var.defined()) {
    const double bessel = static_cast<double>(stats.count) / static_cast<double>(stats.count - 1);
    const Tensor batch =
        reshape(to_dtype(mul_scalar(stats.var, bessel), running_var.dtype()), running_var.sizes());
    copy_(running_var, add(mul_scalar(running_var, 1.0 - momentum), batch, momentum));
  }
}

// ---------------------------------------------------------------- batch norm forward

Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm_elemt";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format);
  const Tensor rc = residual_like(epilogue, format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  // The statistics as given, in double (exact for x's dtype; a float64 one keeps its digits).
  const Tensor m = channel_vector(mean, kFloat64);
  const Tensor is = channel_vector(invstd, kFloat64);
  const Tensor w = channel_vector(weight, math_dtype(x.dtype()));
  const Tensor b = channel_vector(bias, math_dtype(x.dtype()));
  Tensor y = empty(x.sizes(), x.dtype(), x.device(), format);
  dispatch_batch_norm(x.dtype(), op, [&]<typename T>() {
    using M = math_t<T>;
    const T* xp = xc.data_ptr<T>();
    const double *mp = m.data_ptr<double>(), *ip = is.data_ptr<double>();
    const M *wp = ptr_or_null<M>(w), *bp = ptr_or_null<M>(b);
    T* yp = y.data_ptr<T>();
    const Epilogue<T> e{ptr_or_null<T>(rc), epilogue.relu};
    std::vector<M> scale(l.c), shift(l.c);
    for (int64_t c = 0; c < l.c; ++c) {
      const double sc = ip[c] * (wp ? double(wp[c]) : 1.0);
      scale[c] = static_cast<M>(sc);
      shift[c] = static_cast<M>((bp ? double(bp[c]) : 0.0) - mp[c] * sc);
    }
    if (mem.s == 1) return interleaved_affine(xp, yp, mem, scale.data(), shift.data(), e);
    parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) channel_affine(xp, yp, mem, c, scale[c], shift[c], e);
    });
  });
  return y;
}

// One thread per channel: mean and variance in two passes, then y, while the channel's values
// are still in cache.
std::pair<Tensor, BatchNormStats> batch_norm_forward_train(const Tensor& x, const Tensor& weight,
                                                           const Tensor& bias, double eps,
                                                           const BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format);
  const Tensor rc = residual_like(epilogue, format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  const DType math = math_dtype(x.dtype());
  const Tensor w = channel_vector(weight, math);
  const Tensor b = channel_vector(bias, math);
  Tensor y = empty(x.sizes(), x.dtype(), x.device(), format);
  BatchNormStats stats{empty({l.c}, math), empty({l.c}, math), empty({l.c}, math), l.count()};
  dispatch_batch_norm(x.dtype(), op, [&]<typename T>() {
    using M = math_t<T>;
    const T* xp = xc.data_ptr<T>();
    const M *wp = ptr_or_null<M>(w), *bp = ptr_or_null<M>(b);
    T* yp = y.data_ptr<T>();
    M *mean = stats.mean.data_ptr<M>(), *invstd = stats.invstd.data_ptr<M>();
    M* var = stats.var.data_ptr<M>();
    const Epilogue<T> e{ptr_or_null<T>(rc), epilogue.relu};
    if (mem.s == 1) {  // Note [Batch norm over interleaved channels]
      const auto [m, v] = interleaved_moments(xp, mem);
      std::vector<M> scale(l.c), shift(l.c);
      for (int64_t c = 0; c < l.c; ++c) {
        const double is = 1.0 / std::sqrt(v[c] + eps);
        mean[c] = static_cast<M>(m[c]);
        var[c] = static_cast<M>(v[c]);
        invstd[c] = static_cast<M>(is);
        const double sc = is * (wp ? double(wp[c]) : 1.0);
        scale[c] = static_cast<M>(sc);
        shift[c] = static_cast<M>((bp ? double(bp[c]) : 0.0) - m[c] * sc);
      }
      return interleaved_affine(xp, yp, mem, scale.data(), shift.data(), e);
    }
    parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const auto [m, v] = channel_moments(xp, mem, c);
        const double is = 1.0 / std::sqrt(v + eps);
        mean[c] = static_cast<M>(m);
        var[c] = static_cast<M>(v);
        invstd[c] = static_cast<M>(is);
        const double scale = is * (wp ? double(wp[c]) : 1.0);
        const double shift = (bp ? double(bp[c]) : 0.0) - m * scale;
        channel_affine(xp, yp, mem, c, static_cast<M>(scale), static_cast<M>(shift), e);
      }
    });
  });
  return {y, stats};
}

// ---------------------------------------------------------------- batch norm backward

std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd) {
  const char* op = "batch_norm_backward_reduce";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format), dyc = contiguous(to_dtype(dy, x.dtype()), format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  const Tensor m = channel_vector(mean, x.dtype());
  const Tensor is = channel_vector(invstd, x.dtype());
  // The double accumulators themselves, unrounded (the callers round dweight and dbias).
  Tensor sum_dy = empty({l.c}, kFloat64), sum_dy_xhat = empty({l.c}, kFloat64);
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const T *xp = xc.data_ptr<T>(), *gp = dyc.data_ptr<T>();
    const T *mp = m.data_ptr<T>(), *ip = is.data_ptr<T>();
    double *sd = sum_dy.data_ptr<double>(), *sdx = sum_dy_xhat.data_ptr<double>();
    if (mem.s == 1) {  // Note [Batch norm over interleaved channels]
      const std::vector<double> t = interleaved_grad_sums(Grad<T, false>{gp, nullptr}, xp, mem, mp);
      for (int64_t c = 0; c < l.c; ++c) {
        sd[c] = t[c];
        sdx[c] = t[l.c + c] * double(ip[c]);
      }
      return;
    }
    parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const auto [s_dy, s_dy_xmu] =
            channel_grad_sums(Grad<T, false>{gp, nullptr}, xp, mem, c, double(mp[c]));
        sd[c] = s_dy;
        sdx[c] = s_dy_xmu * double(ip[c]);
      }
    });
  });
  return {sum_dy, sum_dy_xhat};
}

Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count) {
  const char* op = "batch_norm_backward_elemt";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const bool training = sum_dy.defined();
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format), dyc = contiguous(to_dtype(dy, x.dtype()), format);
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  const Tensor m = channel_vector(mean, x.dtype());
  const Tensor is = channel_vector(invstd, x.dtype());
  const Tensor w = channel_vector(weight, x.dtype());
  const Tensor sd = channel_vector(sum_dy, kFloat64);
  const Tensor sdx = channel_vector(sum_dy_xhat, kFloat64);
  Tensor dx = empty(x.sizes(), x.dtype(), x.device(), format);
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const T *xp = xc.data_ptr<T>(), *gp = dyc.data_ptr<T>();
    const T *mp = m.data_ptr<T>(), *ip = is.data_ptr<T>(), *wp = ptr_or_null<T>(w);
    const double *sdp = ptr_or_null<double>(sd), *sdxp = ptr_or_null<double>(sdx);
    T* out = dx.data_ptr<T>();
    auto coefficients = [&](int64_t c) {
      return dx_coefficients(wp ? double(wp[c]) : 1.0, double(mp[c]), double(ip[c]), training,
                             training ? sdp[c] : 0.0, training ? sdxp[c] : 0.0,
                             static_cast<double>(count));
    };
    const Grad<T, false> g{gp, nullptr};
    if (mem.s == 1)  // Note [Batch norm over interleaved channels]
      return interleaved_dx(g, xp, out, static_cast<T*>(nullptr), mem,
                            dx_table<T>(l.c, coefficients).data());
    parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const DxCoefficients k = coefficients(c);
        channel_dx(g, xp, out, static_cast<T*>(nullptr), mem, c, k.a, k.b, k.k);
      }
    });
  });
  return dx;
}

// One thread per channel: the two sums, then dx, while the channel is in cache.
NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& invstd, const Tensor& weight, bool training,
                              std::array<bool, 3> need, const Tensor& relu_y, bool need_dresidual) {
  const char* op = "batch_norm_backward";
  const ChannelLayout l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const Tensor xc = contiguous(x, format), dyc = contiguous(to_dtype(dy, x.dtype()), format);
  const Tensor yc = relu_y.defined() ? contiguous(relu_y, format) : Tensor();
  const ChannelLayout mem = l.stored(format);  // the loops walk x's memory
  const DType math = math_dtype(x.dtype());
  const Tensor m = channel_vector(mean, math);
  const Tensor is = channel_vector(invstd, math);
  const Tensor w = channel_vector(weight, math);
  NormGrads g;
  if (need[0]) g.dx = empty(x.sizes(), x.dtype(), x.device(), format);
  if (need[1]) g.dweight = empty({l.c}, math, x.device());
  if (need[2]) g.dbias = empty({l.c}, math, x.device());
  if (need_dresidual) g.dresidual = empty(x.sizes(), x.dtype(), x.device(), format);
  const bool reduce = (need[0] && training) || need[1] || need[2];
  dispatch_batch_norm(x.dtype(), op, [&]<typename T>() {
    using M = math_t<T>;
    with_grad(dyc.data_ptr<T>(), ptr_or_null<T>(yc), [&](auto gp) {
      const T* xp = xc.data_ptr<T>();
      const M *mp = m.data_ptr<M>(), *ip = is.data_ptr<M>(), *wp = ptr_or_null<M>(w);
      T* dxp = ptr_or_null<T>(g.dx);
      M *dwp = ptr_or_null<M>(g.dweight), *dbp = ptr_or_null<M>(g.dbias);
      T* drp = ptr_or_null<T>(g.dresidual);
      if (mem.s == 1) {  // Note [Batch norm over interleaved channels]
        const std::vector<double> t =
            reduce ? interleaved_grad_sums(gp, xp, mem, mp) : std::vector<double>(2 * l.c, 0.0);
        auto sum_dy_xhat = [&](int64_t c) { return t[l.c + c] * double(ip[c]); };
        for (int64_t c = 0; c < l.c; ++c) {
          if (dwp) dwp[c] = static_cast<M>(sum_dy_xhat(c));
          if (dbp) dbp[c] = static_cast<M>(t[c]);
        }
        if (!dxp && !drp) return;
        const std::vector<M> table = dx_table<M>(l.c, [&](int64_t c) {
          return dx_coefficients(wp ? double(wp[c]) : 1.0, double(mp[c]), double(ip[c]), training,
                                 t[c], sum_dy_xhat(c), static_cast<double>(l.count()));
        });
        return interleaved_dx(gp, xp, dxp, drp, mem, table.data());
      }
      parallel_for(0, l.c, grain_for(l.count()), [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          const double mc = double(mp[c]), ic = double(ip[c]);
          double sum_dy = 0, sum_dy_xhat = 0;
          if (reduce) {
            const auto [s_dy, s_dy_xmu] = channel_grad_sums(gp, xp, mem, c, mc);
            sum_dy = s_dy;
            sum_dy_xhat = s_dy_xmu * ic;
          }
          if (dwp) dwp[c] = static_cast<M>(sum_dy_xhat);
          if (dbp) dbp[c] = static_cast<M>(sum_dy);
          if (dxp || drp) {
            const DxCoefficients k =
                dx_coefficients(wp ? double(wp[c]) : 1.0, mc, ic, training, sum_dy, sum_dy_xhat,
                                static_cast<double>(l.count()));
            channel_dx(gp, xp, dxp, drp, mem, c, k.a, k.b, k.k);
          }
        }
      });
    });
  });
  return g;
}

// ---------------------------------------------------------------- layer norm

LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel, const Tensor& weight,
                                    const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  const int64_t cols = normalized_numel;
  const int64_t rows = kernels::layer_norm_rows(op, x, cols);
  const Tensor xc = contiguous(x);
  const Tensor w = channel_vector(weight, x.dtype());
  const Tensor b = channel_vector(bias, x.dtype());
  LayerNormForward out{empty(x.sizes(), x.dtype(), x.device()), empty({rows}, x.dtype()),
                       empty({rows}, x.dtype())};
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const T* xp = xc.data_ptr<T>();
    const T *wp = ptr_or_null<T>(w), *bp = ptr_or_null<T>(b);
    T *yp = out.out.data_ptr<T>(), *mean = out.mean.data_ptr<T>(), *rstd = out.rstd.data_ptr<T>();
    // Rows split across threads.
    parallel_for(0, rows, grain_for(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* in = xp + r * cols;
        T* o = yp + r * cols;
        const double m = accumulate(cols, [&](int64_t i) { return double(in[i]); }) / cols;
        // The squares of x - m in x's dtype, summed in double: m rounded to T moves the variance
        // by (m - T(m))^2, a part in 10^14 of m^2 for float.
        const T tm = static_cast<T>(m);
        const double v = accumulate(cols,
                                    [&](int64_t i) {
                                      const T d = in[i] - tm;
                                      return double(d * d);
                                    }) /
                         cols;
        const double rs = 1.0 / std::sqrt(v + eps);
        mean[r] = tm;
        rstd[r] = static_cast<T>(rs);
        const T trs = static_cast<T>(rs);
        if (wp && bp)
          for (int64_t i = 0; i < cols; ++i) o[i] = (in[i] - tm) * trs * wp[i] + bp[i];
        else if (wp)
          for (int64_t i = 0; i < cols; ++i) o[i] = (in[i] - tm) * trs * wp[i];
        else if (bp)
          for (int64_t i = 0; i < cols; ++i) o[i] = (in[i] - tm) * trs + bp[i];
        else
          for (int64_t i = 0; i < cols; ++i) o[i] = (in[i] - tm) * trs;
      }
    });
  });
  return out;
}

NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight, int64_t normalized_numel,
                              std::array<bool, 3> need) {
  const char* op = "layer_norm_backward";
  const int64_t cols = normalized_numel;
  const int64_t rows = kernels::layer_norm_rows(op, x, cols);
  const Tensor xc = contiguous(x), dyc = contiguous(to_dtype(dy, x.dtype()));
  const Tensor m = channel_vector(mean, x.dtype());
  const Tensor rs = channel_vector(rstd, x.dtype());
  const Tensor w = channel_vector(weight, x.dtype());
  NormGrads g;
  if (need[0]) g.dx = empty(x.sizes(), x.dtype(), x.device());
  if (need[1]) g.dweight = empty({cols}, x.dtype(), x.device());
  if (need[2]) g.dbias = empty({cols}, x.dtype(), x.device());
  // Note [Layer norm backward in one pass]
  // dx needs two sums over each row, dweight and dbias sums over each column. Rows go in the
  // fixed blocks of column_sums (Note [Batch norm over interleaved channels]): a block's rows
  // give their dx and add into the block's column sums while the row is in L1, so x and dy are
  // read from memory once (a second pass over the columns for dweight and dbias had made the
  // backward 2.5-3x PyTorch's time on GPT-2's rows; bench/norm_bench). The blocks' sums are
  // added in block order: the same result for any number of threads. dx is a dy w + b x + k
  // per row, in x's dtype, as batch norm's dx.
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const T *xp = xc.data_ptr<T>(), *gp = dyc.data_ptr<T>();
    const T *mp = m.data_ptr<T>(), *rp = rs.data_ptr<T>(), *wp = ptr_or_null<T>(w);
    T *dxp = ptr_or_null<T>(g.dx), *dwp = ptr_or_null<T>(g.dweight), *dbp = ptr_or_null<T>(g.dbias);
    const bool column_grads = dwp || dbp;
    auto add_row = [&](int64_t offset, double* acc) {
      const int64_t r = offset / cols;
      const T *in = xp + offset, *d = gp + offset;
      const T mr = mp[r], rr = rp[r];
      auto xhat = [&](int64_t i) { return (in[i] - mr) * rr; };
      if (dxp) {
        // dx = rr (dxhat - sum(dxhat) / D - xhat sum(dxhat xhat) / D), dxhat = dy w
        auto dxhat = [&](int64_t i) { return wp ? d[i] * wp[i] : d[i]; };
        const double c1 = accumulate(cols, [&](int64_t i) { return double(dxhat(i)); }) / cols;
        const double c2 =
            accumulate(cols, [&](int64_t i) { return double(dxhat(i) * xhat(i)); }) / cols;
        const double rd = double(rr), md = double(mr);
        const T a = static_cast<T>(rd), b = static_cast<T>(-rd * rd * c2),
                k = static_cast<T>(rd * (md * rd * c2 - c1));
        T* out = dxp + offset;
        if (wp)
          for (int64_t i = 0; i < cols; ++i) out[i] = a * d[i] * wp[i] + b * in[i] + k;
        else
          for (int64_t i = 0; i < cols; ++i) out[i] = a * d[i] + b * in[i] + k;
      }
      if (column_grads) {
        double *acc_w = acc, *acc_b = acc + cols;
        for (int64_t i = 0; i < cols; ++i) {
          acc_w[i] += double(d[i] * xhat(i));
          acc_b[i] += double(d[i]);
        }
      }
    };
    const ChannelLayout l{rows, cols, 1};
    if (!column_grads) return for_rows(l, [&](int64_t offset) { add_row(offset, nullptr); });
    const std::vector<double> t = column_sums<2>(l, add_row);
    for (int64_t i = 0; i < cols; ++i) {
      if (dwp) dwp[i] = static_cast<T>(t[i]);
      if (dbp) dbp[i] = static_cast<T>(t[cols + i]);
    }
  });
  return g;
}

}  // namespace loom::cpu
