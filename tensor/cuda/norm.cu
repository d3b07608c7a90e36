// tensor/cuda/norm.cu — batch norm and layer norm on CUDA. Every statistic is a set of sums per
// channel of x [N, C, S] (layer norm: its rows as channels of [1, M, D], its weight gradient
// over the columns of [M, D, 1]) taken by one kernel, Note [CUDA channel sums]; normalising and
// the input gradients are then one thread per element with per-channel coefficients. Sums in
// double, as tensor/cpu/norm.cpp, whose semantics these follow; a mean and variance take one
// pass over x (Note [One-pass moments]) where the CPU takes two. Batch norm takes float16 and
// bfloat16 x (Note [16-bit arithmetic], tensor/cuda/float16.h): elements are widened as they are
// read and rounded as they are written; statistics, parameters and coefficients are float
// (P = math_t<T> below).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/float16.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/cuda/norm.h"
#include "tensor/cuda/reduce.h"
#include "tensor/dispatch.h"

namespace loom::cuda {

// Note [CUDA channel sums]
// Channel c of x [N, C, S] holds the N S values at (b C + c) S + s, numbered k = b S + s. A
// channels-last x is [N S, C, 1] in these terms (ChannelLayout::stored), read in place. Blocks
// (tx, ty) take K sums per channel: tx channels side by side, ty threads per channel taking the
// values k = y, y + ty, ... of the block's chunk. With S >= 16 a block serves one channel
// (tx = 1, ty = 256: neighbouring threads read neighbouring s); with a smaller S it serves up to
// 32 neighbouring channels (ty = 256 / tx: neighbouring threads read neighbouring channels,
// which are the neighbours in memory when S = 1). When the channels make too few blocks, each
// channel's values are cut into G chunks (grid.y). A block combines its ty threads in a
// shared-memory tree and writes its chunk's sums; a second kernel adds each channel's G chunk
// sums in order and hands the totals to an epilogue (statistics, coefficients, small outputs).
// Fixed order throughout: the same bits every run, and no atomics.

namespace {

constexpr int kBlock = 256;
constexpr int64_t kTargetBlocks = 1024;  // fewer blocks than this: split each channel's values
constexpr int64_t kMinPerThread = 16;    // ... as long as each thread keeps this many
constexpr int64_t kMaxSplit = 1024;
constexpr int64_t kMaxGridX = 1 << 20;

__device__ __forceinline__ float dev_sqrt(float v) { return ::sqrtf(v); }
__device__ __forceinline__ double dev_sqrt(double v) { return ::sqrt(v); }

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

using ChannelShape = kernels::ChannelLayout;  // x [N, C, *] as [N, C, S], tensor/norm.h

// A vector of values (per channel, per row, ...; its size checked by the CPU entry) as a
// contiguous tensor of dtype; undefined stays undefined.
Tensor channel_vector(const Tensor& t, DType dtype) {
  return t.defined() ? contiguous_as(t, dtype) : t;
}

// ---------------------------------------------------------------- channel sums

template <int K>
struct Sums {
  double v[K];
};

// Note [CUDA channel sums], first pass: f(c, b, idx, acc) adds value idx (of channel c, batch
// b) to acc; block (x, y) writes its chunk's sums of its channel to partials[c][chunk].
template <int K, typename F>
__global__ void __launch_bounds__(kBlock)
    channel_sums_kernel(F f, ChannelShape cs, int64_t chunk, int64_t chunks, Sums<K>* partials) {
  __shared__ double smem[K][kBlock];
  const int x = threadIdx.x, y = threadIdx.y, tx = blockDim.x, ty = blockDim.y;
  const int slot = y * tx + x;
  const int64_t start = int64_t(blockIdx.y) * chunk, end = imin(cs.n * cs.s, start + chunk);
  for (int64_t first = int64_t(blockIdx.x) * tx; first < cs.c; first += int64_t(gridDim.x) * tx) {
    const int64_t c = first + x;
    Sums<K> acc = {};
    if (c < cs.c && start + y < end) {
      // k = b S + s, stepped by ty without a division per value. Unrolled so that a thread
      // has 4 loads in flight (the adds stay in order: the same bits).
      int64_t k = start + y, b = k / cs.s, s = k - b * cs.s;
      const int64_t step_b = ty / cs.s, step_s = ty - step_b * cs.s;
#pragma unroll 4
      for (; k < end; k += ty) {
        f(c, b, (b * cs.c + c) * cs.s + s, acc);
        s += step_s;
        b += step_b;
        if (s >= cs.s) {
          s -= cs.s;
          ++b;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < K; ++j) smem[j][slot] = acc.v[j];
    __syncthreads();
    for (int h = ty / 2; h > 0; h /= 2) {
      if (y < h)
#pragma unroll
        for (int j = 0; j < K; ++j) smem[j][slot] += smem[j][slot + h * tx];
      __syncthreads();
    }
    if (y == 0 && c < cs.c) {
      Sums<K> total;
#pragma unroll
      for (int j = 0; j < K; ++j) total.v[j] = smem[j][x];
      partials[c * chunks + blockIdx.y] = total;
    }
    __syncthreads();
  }
}

// Second pass, one thread per channel: its chunk sums in order, then epilogue(c, totals).
template <int K, typename E>
__global__ void channel_finish_kernel(E epilogue, const Sums<K>* partials, int64_t channels,
                                      int64_t chunks) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < channels;
       c += int64_t(gridDim.x) * blockDim.x) {
    Sums<K> total = partials[c * chunks];
    for (int64_t g = 1; g < chunks; ++g)
#pragma unroll
      for (int j = 0; j < K; ++j) total.v[j] += partials[c * chunks + g].v[j];
    epilogue(c, total);
  }
}

// epilogue(c, K sums over channel c of f) for every channel of cs (Note [CUDA channel sums]).
template <int K, typename F, typename E>
void channel_sums(const F& f, const E& epilogue, const ChannelShape& cs, const Tensor& like,
                  const char* name) {
  if (cs.c == 0) return;
  const int device = like.device().index;
  const cudaStream_t stream = stream_of(like);
  const int64_t count = cs.count();
  const int tx = cs.s >= 16 ? 1 : next_pow2(cs.c, 32), ty = kBlock / tx;
  const int64_t blocks_x = ceil_div(cs.c, tx);
  int64_t chunks = 1;
  if (blocks_x < kTargetBlocks)
    chunks = std::clamp<int64_t>(
        std::min(ceil_div(kTargetBlocks, blocks_x), count / (ty * kMinPerThread)), 1, kMaxSplit);
  const int64_t chunk = std::max<int64_t>(ceil_div(count, chunks), 1);
  chunks = std::max<int64_t>(ceil_div(count, chunk), 1);
  const Tensor scratch = empty({cs.c * chunks * K}, kFloat64, like.device());
  auto* partials = reinterpret_cast<Sums<K>*>(scratch.data_ptr<double>());
  const dim3 grid(static_cast<unsigned>(std::min(blocks_x, kMaxGridX)),
                  static_cast<unsigned>(chunks));
  channel_sums_kernel<K><<<grid, dim3(tx, ty), 0, stream>>>(f, cs, chunk, chunks, partials);
  check_launch(name, device);
  channel_finish_kernel<K>
      <<<blocks_for(cs.c), kThreads, 0, stream>>>(epilogue, partials, cs.c, chunks);
  check_launch(name, device);
}

// Note [CUDA channel maps]
// The element passes of batch norm (y from x, dx from dy and x) and of layer norm (its rows as
// the channels) run through channel_map. Each pass takes up to In operands shaped like x (null:
// absent, never read), reads element i of each as its math type, and hands them, with i and
// i's channel c = (i / S) % C, to op(c, i, in, out). Up to Out results are rounded back to T
// and stored (null: not written). When every pointer is aligned to 4 elements, a thread takes
// elements 4v..4v+3: one Vec4 load per operand (a float4 for float, 8 bytes for a 16-bit type)
// and one store per result, as the elementwise loops do (Note [CUDA elementwise loops]). With
// one 2- or 4-byte element per thread, an SM has only a few KB of loads in flight, and by
// Little's law an H200 needs tens of KB per SM to reach its bandwidth (reasoned, not yet
// measured). The four elements may straddle channels, so each finds its own channel by two
// multiply-high divisions (FastDivider, loops.cuh). The last total % 4 elements go one to a
// thread. Above 2^31 elements, or with an unaligned pointer, one element per thread.

template <typename T, int In, int Out>
struct ChannelOperands {
  const T* in[In];
  T* out[Out];
};

// Element i of every operand: op(c, in, out) on the math values, results stored.
template <typename T, int In, int Out, typename Op>
__device__ __forceinline__ void channel_element(const Op& op, const ChannelOperands<T, In, Out>& p,
                                                int64_t c, int64_t i) {
  math_t<T> in[In] = {}, out[Out] = {};
#pragma unroll
  for (int k = 0; k < In; ++k)
    if (p.in[k]) in[k] = to_math(p.in[k][i]);
  op(c, i, in, out);
#pragma unroll
  for (int k = 0; k < Out; ++k)
    if (p.out[k]) p.out[k][i] = from_math<T>(out[k]);
}

// Note [CUDA channel maps], below 2^31 elements: vectors of 4 when `vectorized`.
template <typename T, int In, int Out, typename Op>
__global__ void channel_map_kernel32(Op op, ChannelOperands<T, In, Out> p, uint32_t total,
                                     bool vectorized, FastDivider s, FastDivider c) {
  using map_detail::Vec4;
  auto channel = [&](uint32_t i) {  // (i / S) % C; i < 2^31: no wrap-around
    const uint32_t q = s.quotient(i);
    return static_cast<int64_t>(q - c.quotient(q) * c.divisor);
  };
  const uint32_t first = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  if (!vectorized) {
    for (uint32_t i = first; i < total; i += step) channel_element(op, p, channel(i), i);
    return;
  }
  const uint32_t vectors = total / 4;
  for (uint32_t v = first; v < vectors; v += step) {
    math_t<T> in[In][4] = {}, out[Out][4] = {};
#pragma unroll
    for (int k = 0; k < In; ++k) {
      if (!p.in[k]) continue;
      const Vec4<T> loaded = reinterpret_cast<const Vec4<T>*>(p.in[k])[v];
#pragma unroll
      for (int j = 0; j < 4; ++j) in[k][j] = to_math(loaded.v[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      math_t<T> a[In], b[Out] = {};
#pragma unroll
      for (int k = 0; k < In; ++k) a[k] = in[k][j];
      op(channel(4 * v + j), 4 * v + j, a, b);
#pragma unroll
      for (int k = 0; k < Out; ++k) out[k][j] = b[k];
    }
#pragma unroll
    for (int k = 0; k < Out; ++k) {
      if (!p.out[k]) continue;
      Vec4<T> result;
#pragma unroll
      for (int j = 0; j < 4; ++j) result.v[j] = from_math<T>(out[k][j]);
      reinterpret_cast<Vec4<T>*>(p.out[k])[v] = result;
    }
  }
  if (first < total - 4 * vectors) {
    const uint32_t i = 4 * vectors + first;
    channel_element(op, p, channel(i), i);
  }
}

template <typename T, int In, int Out, typename Op>
__global__ void channel_map_kernel(Op op, ChannelOperands<T, In, Out> p, int64_t total,
                                   ChannelShape cs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    channel_element(op, p, (i / cs.s) % cs.c, i);
}

template <typename T, int In, int Out, typename Op>
void channel_map(const Op& op, const ChannelOperands<T, In, Out>& p, const ChannelShape& cs,
                 const Tensor& like, const char* name) {
  const int64_t total = cs.n * cs.c * cs.s;
  if (total == 0) return;
  const cudaStream_t stream = stream_of(like);
  if (total <= std::numeric_limits<int32_t>::max()) {
    bool vectorized = true;
    for (const T* q : p.in) vectorized = vectorized && map_detail::aligned4<T>(q);
    for (const T* q : p.out) vectorized = vectorized && map_detail::aligned4<T>(q);
    channel_map_kernel32<<<blocks_for(vectorized ? std::max<int64_t>(total / 4, total % 4) : total),
                           kThreads, 0, stream>>>(op, p, static_cast<uint32_t>(total), vectorized,
                                                  FastDivider(static_cast<uint32_t>(cs.s)),
                                                  FastDivider(static_cast<uint32_t>(cs.c)));
  } else {
    channel_map_kernel<<<blocks_for(total), kThreads, 0, stream>>>(op, p, total, cs);
  }
  check_launch(name, like.device().index);
}

// One thread per index in [0, n): f(i) (per-channel work without sums).
template <typename F>
__global__ void each_kernel(F f, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

template <typename F>
void run_each(const F& f, int64_t n, const Tensor& like, const char* name) {
  if (n == 0) return;
  each_kernel<<<blocks_for(n), kThreads, 0, stream_of(like)>>>(f, n);
  check_launch(name, like.device().index);
}

// ---------------------------------------------------------------- what is summed

template <typename T>
struct SumAndSquares {  // sum x, sum x^2
  const T* x;
  __device__ void operator()(int64_t, int64_t, int64_t i, Sums<2>& acc) const {
    const double v = static_cast<double>(to_math(x[i]));
    acc.v[0] += v;
    acc.v[1] += v * v;
  }
};

// Note [One-pass moments]
// A channel's mean and variance come from one read of its values: the sums of d = x - K and
// d^2 in double, with K the channel's first value. Then mean = K + sum(d) / M and
// var = sum(d^2) / M - (sum(d) / M)^2.
// Shifting by one of the channel's own values keeps the subtraction from cancelling much. With
// K at z standard deviations from the mean, sum(d^2) / M is (1 + z^2) var, so about
// log2(1 + z^2) of double's 53 bits are lost: 5 bits at z = 5, 20 at z = 1000. Float
// statistics need 24. Float64 statistics fall short of the CPU's only when that first value is
// far out (33 bits left at z = 1000). An infinite first value makes the mean NaN where the CPU
// gives the infinity (the variance is NaN on both). The CPU (tensor/cpu/norm.cpp) takes two
// passes instead (the mean, then the squared deviations) while the channel is in its cache; on
// a GPU a second pass is a second read of x from memory.

template <typename T>
struct ShiftedSums {  // sum d, sum d^2 with d = x - x[c S], Note [One-pass moments]
  const T* x;
  int64_t s;  // the layout's S: channel c's first value is x[c S]
  __device__ void operator()(int64_t c, int64_t, int64_t i, Sums<2>& acc) const {
    const double d = static_cast<double>(to_math(x[i])) - static_cast<double>(to_math(x[c * s]));
    acc.v[0] += d;
    acc.v[1] += d * d;
  }
};

struct Moments {
  double mean, var;  // var biased
};

// The mean and variance of channel c from its ShiftedSums over `count` values (NaN for none).
template <typename T>
__device__ Moments shifted_moments(const T* x, int64_t s, int64_t c, double count,
                                   const Sums<2>& t) {
  const double shift = count > 0 ? static_cast<double>(to_math(x[c * s])) : 0.0;
  const double d = t.v[0] / count, e = t.v[1] / count - d * d;
  return {shift + d, e < 0.0 ? 0.0 : e};  // rounding can take e a hair below 0; NaN stays
}

// The gradient behind a fused ReLU (Note [Batch norm with ReLU] in tensor/norm.h): g where its
// output y is positive, 0 elsewhere (relu_backward's test). Both are read either way: a select,
// not a divergent branch.
template <typename P>
__device__ __forceinline__ P relu_masked(P g, P y) {
  return y > 0 ? g : P(0);
}

// dy, or with a fused ReLU dy masked by its output.
template <typename T>
struct Grad {
  const T* dy;
  const T* relu_y;  // null: no ReLU
  __device__ math_t<T> operator()(int64_t i) const {
    const math_t<T> g = to_math(dy[i]);
    return relu_y ? relu_masked(g, to_math(relu_y[i])) : g;
  }
};

template <typename T>
struct GradSums {  // sum dy, sum dy (x - mean_c)
  Grad<T> dy;
  const T* x;
  const math_t<T>* mean;
  __device__ void operator()(int64_t c, int64_t, int64_t i, Sums<2>& acc) const {
    const double g = static_cast<double>(dy(i));
    acc.v[0] += g;
    acc.v[1] += g * (static_cast<double>(to_math(x[i])) - static_cast<double>(mean[c]));
  }
};

// ---------------------------------------------------------------- epilogues

struct WriteSums {
  double *sum, *sum_sq;
  __device__ void operator()(int64_t c, const Sums<2>& t) const {
    sum[c] = t.v[0];
    sum_sq[c] = t.v[1];
  }
};

// Batch statistics from the shifted sums of x (laid out with S values per row); with
// scale/shift set, also the affine y = x scale + shift of the training forward:
//   scale = invstd weight, shift = bias - mean scale.
template <typename X, typename T>
struct WriteStats {
  const X* x;
  int64_t s;
  double count, eps;
  T *mean, *var, *invstd;
  const T *weight, *bias;  // may be null
  T *scale, *shift;        // null: statistics only
  __device__ void operator()(int64_t c, const Sums<2>& t) const {
    const Moments mo = shifted_moments(x, s, c, count, t);
    const double m = mo.mean, v = mo.var, is = 1.0 / ::sqrt(v + eps);
    mean[c] = static_cast<T>(m);
    var[c] = static_cast<T>(v);
    invstd[c] = static_cast<T>(is);
    if (!scale) return;
    const double sc = is * (weight ? static_cast<double>(weight[c]) : 1.0);
    scale[c] = static_cast<T>(sc);
    shift[c] = static_cast<T>((bias ? static_cast<double>(bias[c]) : 0.0) - m * sc);
  }
};

// The (a, b, k) of dx = a dy + b x + k for one channel. Training (sums over `count` values):
//   dx = w invstd (dy - sum_dy / M - (x - mean) invstd sum_dy_xhat / M)
// Eval (no sums): dx = w invstd dy.
struct DxCoefficients {
  double a, b, k;
};
__device__ DxCoefficients dx_coefficients(double weight, double mean, double invstd, bool training,
                                          double sum_dy, double sum_dy_xhat, double count) {
  const double a = weight * invstd;
  if (!training) return {a, 0.0, 0.0};
  const double b = -a * invstd * sum_dy_xhat / count;
  return {a, b, -a * sum_dy / count - b * mean};
}

// Backward epilogue per channel: from sum dy and sum dy (x - mean) to dbias, dweight
// (= sum dy x_hat) and the dx coefficients (a, b, k in T, 3 per channel).
template <typename T>
struct BackwardEpilogue {
  const T *mean, *invstd, *weight;
  T *dweight, *dbias, *coef;  // each may be null
  bool training;
  double count;
  __device__ void operator()(int64_t c, const Sums<2>& t) const {
    const double ic = static_cast<double>(invstd[c]);
    const double sum_dy = t.v[0], sum_dy_xhat = t.v[1] * ic;
    if (dweight) dweight[c] = static_cast<T>(sum_dy_xhat);
    if (dbias) dbias[c] = static_cast<T>(sum_dy);
    if (!coef) return;
    const DxCoefficients k =
        dx_coefficients(weight ? static_cast<double>(weight[c]) : 1.0, static_cast<double>(mean[c]),
                        ic, training, sum_dy, sum_dy_xhat, count);
    coef[3 * c] = static_cast<T>(k.a);
    coef[3 * c + 1] = static_cast<T>(k.b);
    coef[3 * c + 2] = static_cast<T>(k.k);
  }
};

// ---------------------------------------------------------------- element maps

// y = x scale_c + shift_c, plus a residual, then a ReLU (each optional). channel_map operands:
// in {x, residual}, out {y}.
template <typename P>
struct Affine {
  const P* scale;
  const P* shift;
  bool residual, relu;
  __device__ void operator()(int64_t c, int64_t, const P (&in)[2], P (&out)[1]) const {
    P v = in[0] * scale[c] + shift[c];
    if (residual) v += in[1];
    if (relu) v = v > 0 ? v : P(0);  // relu's test, elementwise_unary.cu
    out[0] = v;
  }
};

// scale = invstd weight, shift = bias - mean scale, from given statistics (one thread each).
template <typename T>
struct ScaleShift {
  const T *mean, *invstd, *weight, *bias;  // weight, bias may be null
  T *scale, *shift;
  __device__ void operator()(int64_t c) const {
    const double sc =
        static_cast<double>(invstd[c]) * (weight ? static_cast<double>(weight[c]) : 1.0);
    scale[c] = static_cast<T>(sc);
    shift[c] = static_cast<T>((bias ? static_cast<double>(bias[c]) : 0.0) -
                              static_cast<double>(mean[c]) * sc);
  }
};

// dx = a_c g + b_c x + k_c and dres = g, with g = dy, or with a fused ReLU dy masked by its
// output (as Grad). channel_map operands: in {dy, x, relu_y}, out {dx, dres};
// coef may be null when dx is not written.
template <typename P>
struct LinearDx {
  const P* coef;
  bool masked;
  __device__ void operator()(int64_t c, int64_t, const P (&in)[3], P (&out)[2]) const {
    const P g = masked ? relu_masked(in[0], in[2]) : in[0];
    if (coef) out[0] = coef[3 * c] * g + coef[3 * c + 1] * in[1] + coef[3 * c + 2];
    out[1] = g;
  }
};

// Coefficients of dx from given sums (backward_elemt) or none (eval), one thread per channel.
template <typename T>
struct ElemtCoefficients {
  const T *mean, *invstd, *weight;
  const double *sum_dy, *sum_dy_xhat;  // null in eval
  double count;
  T* coef;
  __device__ void operator()(int64_t c) const {
    const bool training = sum_dy != nullptr;
    const DxCoefficients k =
        dx_coefficients(weight ? static_cast<double>(weight[c]) : 1.0, static_cast<double>(mean[c]),
                        static_cast<double>(invstd[c]), training, training ? sum_dy[c] : 0.0,
                        training ? sum_dy_xhat[c] : 0.0, count);
    coef[3 * c] = static_cast<T>(k.a);
    coef[3 * c + 1] = static_cast<T>(k.b);
    coef[3 * c + 2] = static_cast<T>(k.k);
  }
};

// ---------------------------------------------------------------- small per-channel kernels

template <typename T>
struct StatsFromSums {
  const double *sum, *sum_sq;
  double count, eps;
  T *mean, *var, *invstd;
  __device__ void operator()(int64_t c) const {
    const double m = sum[c] / count;
    const double e = sum_sq[c] / count - m * m;
    const double v = e < 0.0 ? 0.0 : e;  // std::max(e, 0.0)
    mean[c] = static_cast<T>(m);
    var[c] = static_cast<T>(v);
    invstd[c] = static_cast<T>(1.0 / ::sqrt(v + eps));
  }
};

template <typename T>
struct InvStd {  // 1 / sqrt(var + eps) in T, as rsqrt(add_scalar(var, eps))
  const T* var;
  T eps;
  T* out;
  __device__ void operator()(int64_t i) const {
    out[i] = T(1) / dev_sqrt(static_cast<T>(var[i] + eps));
  }
};

// running = running (1 - momentum) + momentum stat in R, as mul_scalar then add with alpha;
// stat converted from S (scaled by Bessel's count / (count - 1) in S first, for the variance).
template <typename R, typename S>
struct RunningUpdate {
  R* running;
  int64_t stride;
  const S* stat;
  R keep, take;
  bool bessel_on;
  S bessel;
  __device__ void operator()(int64_t c) const {
    S v = stat[c];
    if (bessel_on) v = static_cast<S>(v * bessel);
    R& r = running[c * stride];
    r = static_cast<R>(r * keep) + take * static_cast<R>(v);
  }
};

// ---------------------------------------------------------------- layer norm pieces

template <typename T>
struct LayerNormStats {  // mean and rstd per row of x [M, D] from its shifted sums
  const T* x;
  int64_t cols;
  double eps;
  T *mean, *rstd;
  __device__ void operator()(int64_t r, const Sums<2>& t) const {
    const Moments mo = shifted_moments(x, cols, r, static_cast<double>(cols), t);
    mean[r] = static_cast<T>(mo.mean);
    rstd[r] = static_cast<T>(1.0 / ::sqrt(mo.var + eps));
  }
};

template <typename T>
struct LayerNormAffine {  // out = (x - mean_r) rstd_r weight + bias, in T; in {x}, out {out}
  const T *mean, *rstd, *weight, *bias;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t i, const T (&in)[1], T (&out)[1]) const {
    T v = (in[0] - mean[r]) * rstd[r];
    const int64_t col = i - r * cols;
    if (weight) v = v * weight[col];
    if (bias) v = v + bias[col];
    out[0] = v;
  }
};

template <typename T>
struct LayerNormGradSums {  // per row: sum dx_hat, sum dx_hat x_hat with dx_hat = dy weight
  const T *dy, *x, *weight, *mean, *rstd;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t, int64_t i, Sums<2>& acc) const {
    const int64_t col = i - r * cols;
    const double dxhat =
        static_cast<double>(dy[i]) * (weight ? static_cast<double>(weight[col]) : 1.0);
    acc.v[0] += dxhat;
    acc.v[1] += dxhat * (static_cast<double>(x[i]) - static_cast<double>(mean[r])) *
                static_cast<double>(rstd[r]);
  }
};

struct WriteRowMeans {  // c1 = sum dx_hat / D, c2 = sum dx_hat x_hat / D
  double* coef;
  double cols;
  __device__ void operator()(int64_t r, const Sums<2>& t) const {
    coef[2 * r] = t.v[0] / cols;
    coef[2 * r + 1] = t.v[1] / cols;
  }
};

// d layer_norm: dx = rstd (dx_hat - c1 - x_hat c2), x_hat = (x - mean) rstd, in double.
template <typename T>
struct LayerNormDx {  // in {dy, x}, out {dx}
  const T *weight, *mean, *rstd;
  const double* coef;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t i, const T (&in)[2], T (&out)[1]) const {
    const int64_t col = i - r * cols;
    const double mr = static_cast<double>(mean[r]), rr = static_cast<double>(rstd[r]);
    const double dxhat =
        static_cast<double>(in[0]) * (weight ? static_cast<double>(weight[col]) : 1.0);
    out[0] = static_cast<T>(
        rr * (dxhat - coef[2 * r] - (static_cast<double>(in[1]) - mr) * rr * coef[2 * r + 1]));
  }
};

template <typename T>
struct LayerNormParamSums {  // per column (channel of [M, D, 1]): sum dy x_hat, sum dy
  const T *dy, *x, *mean, *rstd;
  __device__ void operator()(int64_t, int64_t r, int64_t i, Sums<2>& acc) const {
    const double g = static_cast<double>(dy[i]);
    acc.v[0] += g * (static_cast<double>(x[i]) - static_cast<double>(mean[r])) *
                static_cast<double>(rstd[r]);
    acc.v[1] += g;
  }
};

template <typename T>
struct WriteParamGrads {
  T *dweight, *dbias;  // either may be null
  __device__ void operator()(int64_t c, const Sums<2>& t) const {
    if (dweight) dweight[c] = static_cast<T>(t.v[0]);
    if (dbias) dbias[c] = static_cast<T>(t.v[1]);
  }
};

// The batch statistics of xc (contiguous, T) in one pass, Note [One-pass moments]; with
// scale/shift, the affine too.
template <typename T>
void channel_moments(const Tensor& xc, const ChannelShape& l, double eps,
                     const kernels::BatchNormStats& stats, const math_t<T>* weight,
                     const math_t<T>* bias, math_t<T>* scale, math_t<T>* shift, const char* name) {
  using P = math_t<T>;
  const T* x = xc.data_ptr<T>();
  channel_sums<2>(ShiftedSums<T>{x, l.s},
                  WriteStats<T, P>{x, l.s, static_cast<double>(l.count()), eps,
                                   stats.mean.data_ptr<P>(), stats.var.data_ptr<P>(),
                                   stats.invstd.data_ptr<P>(), weight, bias, scale, shift},
                  l, xc, name);
}

// The one stride that walks a running-statistics tensor of `count` elements in order.
int64_t running_stride(const char* op, const Tensor& t) {
  if (t.is_contiguous()) return 1;
  int64_t stride = 1, dims = 0;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) {
      stride = t.stride(d);
      ++dims;
    }
  LOOM_CHECK(dims <= 1, NotImplementedError, op,
             ": running statistics must be contiguous or one-dimensional; got shape=", t.sizes(),
             " strides=", t.strides());
  return stride;
}

template <typename R>
void update_running(const char* op, const Tensor& running, const Tensor& stat, double momentum,
                    bool bessel_on, double bessel) {
  const Tensor sc = contiguous_as(stat, stat.dtype());
  const int64_t stride = running_stride(op, running);
  dispatch_floating(stat.dtype(), op, [&]<typename S>() {
    run_each(RunningUpdate<R, S>{running.data_ptr<R>(), stride, sc.data_ptr<S>(),
                                 static_cast<R>(1.0 - momentum), static_cast<R>(momentum),
                                 bessel_on, static_cast<S>(bessel)},
             running.numel(), running, "batch_norm_running_stats_kernel");
  });
  running.bump_version();
}

}  // namespace

// ---------------------------------------------------------------- batch norm statistics

kernels::BatchNormSums batch_norm_sums(const Tensor& x) {
  const char* op = "batch_norm_sums";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  kernels::BatchNormSums out{empty({l.c}, kFloat64, x.device()), empty({l.c}, kFloat64, x.device()),
                             l.count()};
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(x, x.dtype(), format);
    channel_sums<2>(SumAndSquares<T>{xc.data_ptr<T>()},
                    WriteSums{out.sum.data_ptr<double>(), out.sum_sq.data_ptr<double>()}, mem, x,
                    "batch_norm_sums_kernel");
  });
  return out;
}

kernels::BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq,
                                                   int64_t count, double eps, DType dtype) {
  const char* op = "batch_norm_stats_from_sums";
  DeviceGuard guard(sum.device().index);
  const int64_t channels = sum.numel();
  const Device device = sum.device();
  kernels::BatchNormStats out{empty({channels}, dtype, device), empty({channels}, dtype, device),
                              empty({channels}, dtype, device), count};
  dispatch_floating(dtype, op, [&]<typename T>() {
    const Tensor s = contiguous_as(sum, kFloat64), sq = contiguous_as(sum_sq, kFloat64);
    run_each(StatsFromSums<T>{s.data_ptr<double>(), sq.data_ptr<double>(),
                              static_cast<double>(count), eps, out.mean.data_ptr<T>(),
                              out.var.data_ptr<T>(), out.invstd.data_ptr<T>()},
             channels, sum, "batch_norm_stats_from_sums_kernel");
  });
  return out;
}

kernels::BatchNormStats batch_norm_stats(const Tensor& x, double eps) {
  const char* op = "batch_norm_stats";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  kernels::BatchNormStats out{empty({l.c}, pd, x.device()), empty({l.c}, pd, x.device()),
                              empty({l.c}, pd, x.device()), l.count()};
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(x, x.dtype(), format);
    channel_moments<T>(xc, mem, eps, out, nullptr, nullptr, nullptr, nullptr,
                       "batch_norm_stats_kernel");
  });
  return out;
}

Tensor batch_norm_invstd(const Tensor& var, double eps) {
  const char* op = "batch_norm_invstd";
  DeviceGuard guard(var.device().index);
  const DType dtype = is_floating(var.dtype()) ? var.dtype() : kFloat32;
  Tensor out = empty(var.sizes(), dtype, var.device());
  dispatch_floating(dtype, op, [&]<typename T>() {
    const Tensor vc = contiguous_as(var, dtype);
    run_each(InvStd<T>{vc.data_ptr<T>(), static_cast<T>(eps), out.data_ptr<T>()}, var.numel(), var,
             "batch_norm_invstd_kernel");
  });
  return out;
}

void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const kernels::BatchNormStats& stats, double momentum) {
  const char* op = "batch_norm_update_running_stats_";
  if (running_mean.defined()) {
    DeviceGuard guard(running_mean.device().index);
    dispatch_floating(running_mean.dtype(), op, [&]<typename R>() {
      update_running<R>(op, running_mean, stats.mean, momentum, false, 1.0);
    });
  }
  if (running_var.defined()) {
    const double bessel = static_cast<double>(stats.count) / static_cast<double>(stats.count - 1);
    DeviceGuard guard(running_var.device().index);
    dispatch_floating(running_var.dtype(), op, [&]<typename R>() {
      update_running<R>(op, running_var, stats.var, momentum, true, bessel);
    });
  }
}

// ---------------------------------------------------------------- batch norm forward

// A checked epilogue's residual in x's dtype and memory format (read in x's order).
Tensor residual_like(const kernels::BatchNormEpilogue& e, const Tensor& x, MemoryFormat format) {
  return e.residual.defined() ? contiguous_as(e.residual, x.dtype(), format) : Tensor();
}

Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const kernels::BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm_elemt";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  const Tensor m = channel_vector(mean, pd);
  const Tensor is = channel_vector(invstd, pd);
  const Tensor w = channel_vector(weight, pd);
  const Tensor b = channel_vector(bias, pd);
  Tensor y = empty(x.sizes(), x.dtype(), x.device(), format);
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    using P = math_t<T>;
    const Tensor xc = contiguous_as(x, x.dtype(), format);
    const Tensor rc = residual_like(epilogue, x, format);
    const Tensor coef = empty({2, l.c}, pd, x.device());
    P* scale = coef.data_ptr<P>();
    P* shift = scale + l.c;
    run_each(ScaleShift<P>{m.data_ptr<P>(), is.data_ptr<P>(), ptr_or_null<P>(w), ptr_or_null<P>(b),
                           scale, shift},
             l.c, x, "batch_norm_elemt_kernel");
    channel_map(Affine<P>{scale, shift, rc.defined(), epilogue.relu},
                ChannelOperands<T, 2, 1>{{xc.data_ptr<T>(), ptr_or_null<T>(rc)}, {y.data_ptr<T>()}},
                mem, x, "batch_norm_elemt_kernel");
  });
  return y;
}

std::pair<Tensor, kernels::BatchNormStats> batch_norm_forward_train(
    const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
    const kernels::BatchNormEpilogue& epilogue) {
  const char* op = "batch_norm";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  const Tensor w = channel_vector(weight, pd);
  const Tensor b = channel_vector(bias, pd);
  Tensor y = empty(x.sizes(), x.dtype(), x.device(), format);
  kernels::BatchNormStats stats{empty({l.c}, pd, x.device()), empty({l.c}, pd, x.device()),
                                empty({l.c}, pd, x.device()), l.count()};
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    using P = math_t<T>;
    const Tensor xc = contiguous_as(x, x.dtype(), format);
    const Tensor rc = residual_like(epilogue, x, format);
    const Tensor coef = empty({2, l.c}, pd, x.device());
    P* scale = coef.data_ptr<P>();
    P* shift = scale + l.c;
    channel_moments<T>(xc, mem, eps, stats, ptr_or_null<P>(w), ptr_or_null<P>(b), scale, shift,
                       "batch_norm_kernel");
    channel_map(Affine<P>{scale, shift, rc.defined(), epilogue.relu},
                ChannelOperands<T, 2, 1>{{xc.data_ptr<T>(), ptr_or_null<T>(rc)}, {y.data_ptr<T>()}},
                mem, x, "batch_norm_kernel");
  });
  return {y, stats};
}

// ---------------------------------------------------------------- batch norm backward

std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd) {
  const char* op = "batch_norm_backward_reduce";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  const Tensor m = channel_vector(mean, pd);
  const Tensor is = channel_vector(invstd, pd);
  Tensor sum_dy = empty({l.c}, pd, x.device());
  Tensor sum_dy_xhat = empty({l.c}, pd, x.device());
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    using P = math_t<T>;
    const Tensor xc = contiguous_as(x, x.dtype(), format),
                 dyc = contiguous_as(dy, x.dtype(), format);
    // sum_dy_xhat = invstd sum dy (x - mean): the dweight of BackwardEpilogue, dbias = sum_dy.
    channel_sums<2>(
        GradSums<T>{{dyc.data_ptr<T>(), nullptr}, xc.data_ptr<T>(), m.data_ptr<P>()},
        BackwardEpilogue<P>{m.data_ptr<P>(), is.data_ptr<P>(), nullptr, sum_dy_xhat.data_ptr<P>(),
                            sum_dy.data_ptr<P>(), nullptr, true, static_cast<double>(l.count())},
        mem, x, "batch_norm_backward_reduce_kernel");
  });
  // The interface's float64 (tensor/norm.h); the kernel writes pd, so the digits past pd's are
  // lost here, unlike on the CPU.
  return {contiguous_as(sum_dy, kFloat64), contiguous_as(sum_dy_xhat, kFloat64)};
}

Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count) {
  const char* op = "batch_norm_backward_elemt";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  const Tensor m = channel_vector(mean, pd);
  const Tensor is = channel_vector(invstd, pd);
  const Tensor w = channel_vector(weight, pd);
  const Tensor sd = channel_vector(sum_dy, kFloat64);
  const Tensor sdx = channel_vector(sum_dy_xhat, kFloat64);
  Tensor dx = empty(x.sizes(), x.dtype(), x.device(), format);
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    using P = math_t<T>;
    const Tensor xc = contiguous_as(x, x.dtype(), format),
                 dyc = contiguous_as(dy, x.dtype(), format);
    const Tensor coef = empty({l.c, 3}, pd, x.device());
    run_each(ElemtCoefficients<P>{m.data_ptr<P>(), is.data_ptr<P>(), ptr_or_null<P>(w),
                                  ptr_or_null<double>(sd), ptr_or_null<double>(sdx),
                                  static_cast<double>(count), coef.data_ptr<P>()},
             l.c, x, "batch_norm_backward_elemt_kernel");
    channel_map(LinearDx<P>{coef.data_ptr<P>(), false},
                ChannelOperands<T, 3, 2>{{dyc.data_ptr<T>(), xc.data_ptr<T>(), nullptr},
                                         {dx.data_ptr<T>(), nullptr}},
                mem, x, "batch_norm_backward_elemt_kernel");
  });
  return dx;
}

kernels::NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& invstd, const Tensor& weight, bool training,
                                       std::array<bool, 3> need, const Tensor& relu_y,
                                       bool need_dresidual) {
  const char* op = "batch_norm_backward";
  const ChannelShape l = kernels::channel_layout(op, x);
  const MemoryFormat format = suggest_memory_format(x);
  const ChannelShape mem = l.stored(format);  // the kernels walk x's memory
  DeviceGuard guard(x.device().index);
  const DType pd = kernels::batch_norm_param_dtype(x.dtype());
  const Tensor m = channel_vector(mean, pd);
  const Tensor is = channel_vector(invstd, pd);
  const Tensor w = channel_vector(weight, pd);
  kernels::NormGrads g;
  if (need[0]) g.dx = empty(x.sizes(), x.dtype(), x.device(), format);
  if (need[1]) g.dweight = empty({l.c}, pd, x.device());
  if (need[2]) g.dbias = empty({l.c}, pd, x.device());
  if (need_dresidual) g.dresidual = empty(x.sizes(), x.dtype(), x.device(), format);
  const bool reduce = (need[0] && training) || need[1] || need[2];
  dispatch_floating_and_16bit(x.dtype(), op, [&]<typename T>() {
    using P = math_t<T>;
    const Tensor xc = contiguous_as(x, x.dtype(), format),
                 dyc = contiguous_as(dy, x.dtype(), format);
    const Tensor yc = relu_y.defined() ? contiguous_as(relu_y, x.dtype(), format) : Tensor();
    const Grad<T> grad{dyc.data_ptr<T>(), ptr_or_null<T>(yc)};
    const Tensor coef = need[0] ? empty({l.c, 3}, pd, x.device()) : Tensor();
    const BackwardEpilogue<P> epilogue{m.data_ptr<P>(),
                                       is.data_ptr<P>(),
                                       ptr_or_null<P>(w),
                                       ptr_or_null<P>(g.dweight),
                                       ptr_or_null<P>(g.dbias),
                                       ptr_or_null<P>(coef),
                                       training,
                                       static_cast<double>(l.count())};
    if (reduce) {
      channel_sums<2>(GradSums<T>{grad, xc.data_ptr<T>(), m.data_ptr<P>()}, epilogue, mem, x,
                      "batch_norm_backward_kernel");
    } else if (need[0]) {  // eval: constant statistics, no sums
      run_each(ElemtCoefficients<P>{m.data_ptr<P>(), is.data_ptr<P>(), ptr_or_null<P>(w), nullptr,
                                    nullptr, static_cast<double>(l.count()), coef.data_ptr<P>()},
               l.c, x, "batch_norm_backward_kernel");
    }
    if (need[0] || need_dresidual)
      channel_map(LinearDx<P>{ptr_or_null<P>(coef), yc.defined()},
                  // x is read only for dx.
                  ChannelOperands<T, 3, 2>{
                      {dyc.data_ptr<T>(), need[0] ? xc.data_ptr<T>() : nullptr, ptr_or_null<T>(yc)},
                      {ptr_or_null<T>(g.dx), ptr_or_null<T>(g.dresidual)}},
                  mem, x, "batch_norm_backward_kernel");
  });
  return g;
}

// ---------------------------------------------------------------- layer norm

kernels::LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel,
                                             const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  const int64_t cols = normalized_numel;
  const int64_t rows = kernels::layer_norm_rows(op, x, cols);
  DeviceGuard guard(x.device().index);
  const Tensor w = channel_vector(weight, x.dtype());
  const Tensor b = channel_vector(bias, x.dtype());
  kernels::LayerNormForward out{empty(x.sizes(), x.dtype(), x.device()),
                                empty({rows}, x.dtype(), x.device()),
                                empty({rows}, x.dtype(), x.device())};
  const ChannelShape by_row{1, rows, cols};  // rows as the channels of [1, M, D]
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(x, x.dtype());
    const T* xp = xc.data_ptr<T>();
    // One pass in double per row, Note [One-pass moments].
    channel_sums<2>(
        ShiftedSums<T>{xp, cols},
        LayerNormStats<T>{xp, cols, eps, out.mean.data_ptr<T>(), out.rstd.data_ptr<T>()}, by_row, x,
        "layer_norm_kernel");
    channel_map(LayerNormAffine<T>{out.mean.data_ptr<T>(), out.rstd.data_ptr<T>(),
                                   ptr_or_null<T>(w), ptr_or_null<T>(b), cols},
                ChannelOperands<T, 1, 1>{{xp}, {out.out.data_ptr<T>()}}, by_row, x,
                "layer_norm_kernel");
  });
  return out;
}

kernels::NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                       const Tensor& rstd, const Tensor& weight,
                                       int64_t normalized_numel, std::array<bool, 3> need) {
  const char* op = "layer_norm_backward";
  const int64_t cols = normalized_numel;
  const int64_t rows = kernels::layer_norm_rows(op, x, cols);
  DeviceGuard guard(x.device().index);
  const Tensor m = channel_vector(mean, x.dtype());
  const Tensor rs = channel_vector(rstd, x.dtype());
  const Tensor w = channel_vector(weight, x.dtype());
  kernels::NormGrads g;
  if (need[0]) g.dx = empty(x.sizes(), x.dtype(), x.device());
  if (need[1]) g.dweight = empty({cols}, x.dtype(), x.device());
  if (need[2]) g.dbias = empty({cols}, x.dtype(), x.device());
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(x, x.dtype()), dyc = contiguous_as(dy, x.dtype());
    const T *xp = xc.data_ptr<T>(), *gp = dyc.data_ptr<T>();
    const T *mp = m.data_ptr<T>(), *rp = rs.data_ptr<T>(), *wp = ptr_or_null<T>(w);
    if (need[0]) {
      const ChannelShape by_row{1, rows, cols};
      const Tensor coef = empty({rows, 2}, kFloat64, x.device());
      channel_sums<2>(LayerNormGradSums<T>{gp, xp, wp, mp, rp, cols},
                      WriteRowMeans{coef.data_ptr<double>(), static_cast<double>(cols)}, by_row, x,
                      "layer_norm_backward_kernel");
      channel_map(LayerNormDx<T>{wp, mp, rp, coef.data_ptr<double>(), cols},
                  ChannelOperands<T, 2, 1>{{gp, xp}, {g.dx.data_ptr<T>()}}, by_row, x,
                  "layer_norm_backward_kernel");
    }
    if (need[1] || need[2]) {
      const ChannelShape by_col{rows, cols, 1};  // columns as the channels of [M, D, 1]
      channel_sums<2>(LayerNormParamSums<T>{gp, xp, mp, rp},
                      WriteParamGrads<T>{ptr_or_null<T>(g.dweight), ptr_or_null<T>(g.dbias)},
                      by_col, x, "layer_norm_backward_kernel");
    }
  });
  return g;
}

}  // namespace loom::cuda
