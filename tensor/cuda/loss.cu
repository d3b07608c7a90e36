// tensor/cuda/loss.cu — the softmax family and the losses on CUDA. Softmax and cross entropy
// reduce "lines" of x [outer, n, inner] (Note [CUDA softmax lines]); the other kernels are one
// thread per element. Loss reductions sum per-position values in fixed chunks, then the chunk
// sums in a fixed tree, so results are bit-for-bit repeatable. Semantics: tensor/cpu/loss.cpp.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/loss.h"
#include "tensor/cuda/reduce.h"
#include "tensor/dispatch.h"
#include "tensor/view.h"

namespace loom::cuda {

// Note [CUDA softmax lines]
// x is contiguous [outer, n, inner] around the softmax dim (for the class losses: [N, C, S]).
// Each of the outer * inner lines of n elements (stride inner) is reduced (max, sums) and, for
// the softmax family, rewritten. Block (tx, ty):
//  - rows (inner == 1): a line is a contiguous row; tx threads per row, ty rows per block;
//    thread x reads elements x, x + tx, ... (neighbouring threads, neighbouring addresses).
//  - lanes (inner > 1): tx neighbouring lines side by side (their elements are neighbours in
//    memory), ty threads per line reading elements y, y + ty, ...
// A line's threads combine each statistic through a shared-memory tree (a fixed order) that
// hands the result to all of them; then each thread writes its own elements.

namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxGrid = 1 << 20;  // larger problems loop over their work items

unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>(items, 1, kMaxGrid));
}

__device__ __forceinline__ float dev_exp(float v) { return ::expf(v); }
__device__ __forceinline__ double dev_exp(double v) { return ::exp(v); }

struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct Max {  // std::max(a, b): a NaN b leaves a
  __device__ double operator()(double a, double b) const { return a < b ? b : a; }
};

// ---------------------------------------------------------------- lines

using LineShape = kernels::DimLayout;  // [outer, n, inner], tensor/loss.h

// This thread's line for work item `item`: element j at base + j * step; `lane` of `lanes`
// threads; `index` the line's number (outer index * inner + inner index).
struct Line {
  int64_t base, step, index;
  int lane, lanes;
  bool valid;
};

template <bool kRows>
__device__ Line line_of(int64_t item, const LineShape& s) {
  Line l;
  if constexpr (kRows) {
    l.index = item * blockDim.y + threadIdx.y;
    l.valid = l.index < s.outer;
    l.base = l.index * s.n;
    l.step = 1;
    l.lane = threadIdx.x;
    l.lanes = blockDim.x;
  } else {
    const int64_t per_outer = (s.inner + blockDim.x - 1) / blockDim.x;
    const int64_t o = item / per_outer;
    const int64_t i = (item - o * per_outer) * blockDim.x + threadIdx.x;
    l.index = o * s.inner + i;
    l.valid = i < s.inner;
    l.base = o * s.n * s.inner + i;
    l.step = s.inner;
    l.lane = threadIdx.y;
    l.lanes = blockDim.y;
  }
  return l;
}

// Combines v over the threads of each line; every thread gets its line's result. Every thread
// of the block calls it (lanes a power of two).
template <bool kRows, typename F>
__device__ double line_reduce(double v, double* smem, const Line& l, F combine) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int stride = kRows ? 1 : blockDim.x;  // smem distance between a line's neighbour lanes
  smem[tid] = v;
  __syncthreads();
  for (int s = l.lanes / 2; s > 0; s /= 2) {
    if (l.lane < s) smem[tid] = combine(smem[tid], smem[tid + s * stride]);
    __syncthreads();
  }
  const double r = smem[tid - l.lane * stride];
  __syncthreads();
  return r;
}

struct LineLaunch {
  dim3 grid, block;
  int64_t items;
  bool rows;
};

LineLaunch plan_lines(const LineShape& s) {
  LineLaunch p;
  p.rows = s.inner == 1;
  int tx, ty;
  if (p.rows) {
    tx = next_pow2(ceil_div(s.n, 4), kBlock);  // about four elements per thread, at least
    ty = kBlock / tx;
    p.items = ceil_div(s.outer, ty);
  } else {
    tx = next_pow2(s.inner, 32);
    ty = std::min(kBlock / tx, next_pow2(s.n, kBlock));
    p.items = s.outer * ceil_div(s.inner, tx);
  }
  p.block = dim3(tx, ty);
  p.grid = dim3(grid_for(p.items));
  return p;
}

// ---------------------------------------------------------------- softmax family

enum class Kind { Softmax, LogSoftmax, SoftmaxBackward, LogSoftmaxBackward };

// a = x (forward) or y (backward), b = dy (backward only). Per line, as tensor/cpu/loss.cpp:
//   softmax      out = exp(x - max) * (1 / sum exp(x - max))
//   log_softmax  out = (x - max) - log(sum exp(x - max))
//   d softmax:     dx = y (dy - sum(dy y))
//   d log_softmax: dx = dy - exp(y) sum(dy)
// Sums in double, the rest in T.
template <typename T, Kind kind, bool kRows>
__global__ void __launch_bounds__(kBlock)
    softmax_kernel(const T* a, const T* b, T* out, LineShape s, int64_t items) {
  __shared__ double smem[kBlock];
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const Line l = line_of<kRows>(item, s);
    if constexpr (kind == Kind::Softmax || kind == Kind::LogSoftmax) {
      T mx = -std::numeric_limits<T>::infinity();
      if (l.valid)
        for (int64_t j = l.lane; j < s.n; j += l.lanes) {
          const T v = a[l.base + j * l.step];
          mx = mx < v ? v : mx;
        }
      mx = static_cast<T>(line_reduce<kRows>(static_cast<double>(mx), smem, l, Max{}));
      double sum = 0;
      if (l.valid)
        for (int64_t j = l.lane; j < s.n; j += l.lanes)
          sum += static_cast<double>(dev_exp(static_cast<T>(a[l.base + j * l.step] - mx)));
      sum = line_reduce<kRows>(sum, smem, l, Plus{});
      if (!l.valid) continue;
      if constexpr (kind == Kind::Softmax) {
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t j = l.lane; j < s.n; j += l.lanes) {
          const int64_t k = l.base + j * l.step;
          out[k] = dev_exp(static_cast<T>(a[k] - mx)) * inv;
        }
      } else {
        const T log_sum = static_cast<T>(::log(sum));
        for (int64_t j = l.lane; j < s.n; j += l.lanes) {
          const int64_t k = l.base + j * l.step;
          out[k] = static_cast<T>(a[k] - mx) - log_sum;
        }
      }
    } else {
      double sum = 0;
      if (l.valid)
        for (int64_t j = l.lane; j < s.n; j += l.lanes) {
          const int64_t k = l.base + j * l.step;
          if constexpr (kind == Kind::SoftmaxBackward)
            sum += static_cast<double>(static_cast<T>(b[k] * a[k]));
          else
            sum += static_cast<double>(b[k]);
        }
      const T total = static_cast<T>(line_reduce<kRows>(sum, smem, l, Plus{}));
      if (!l.valid) continue;
      for (int64_t j = l.lane; j < s.n; j += l.lanes) {
        const int64_t k = l.base + j * l.step;
        if constexpr (kind == Kind::SoftmaxBackward)
          out[k] = a[k] * static_cast<T>(b[k] - total);
        else
          out[k] = b[k] - dev_exp(a[k]) * total;
      }
    }
  }
}

template <Kind kind>
Tensor softmax_family(const char* op, const Tensor& a, const Tensor& b, int64_t dim) {
  DeviceGuard guard(a.device().index);
  const LineShape s = kernels::dim_layout(a, dim, op);
  Tensor out = empty(a.sizes(), a.dtype(), a.device());
  dispatch_floating(a.dtype(), op, [&]<typename T>() {
    const Tensor ac = contiguous_as(a, a.dtype());
    const Tensor bc = b.defined() ? contiguous_as(b, a.dtype()) : Tensor();
    if (a.numel() == 0) return;
    const T* bp = bc.defined() ? bc.data_ptr<T>() : nullptr;
    const LineLaunch p = plan_lines(s);
    const cudaStream_t stream = stream_of(a);
    if (p.rows)
      softmax_kernel<T, kind, true>
          <<<p.grid, p.block, 0, stream>>>(ac.data_ptr<T>(), bp, out.data_ptr<T>(), s, p.items);
    else
      softmax_kernel<T, kind, false>
          <<<p.grid, p.block, 0, stream>>>(ac.data_ptr<T>(), bp, out.data_ptr<T>(), s, p.items);
    check_launch("softmax_kernel", a.device().index);
  });
  return out;
}

// ---------------------------------------------------------------- element maps, blocked sums

// One thread per element, grid-stride: f(i) for i in [0, n).
template <typename F>
__global__ void map_kernel(F f, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

template <typename F>
void run_map(const F& f, int64_t n, const Tensor& like, const char* name) {
  if (n == 0) return;
  map_kernel<<<blocks_for(n), kThreads, 0, stream_of(like)>>>(f, n);
  check_launch(name, like.device().index);
}

// Two sums carried together (nll's loss and weight; the others leave `b` at 0).
struct Sum2 {
  double a, b;
};

// Block k sums f(i) over chunk k (thread t takes i = start + t, t + 256, ...), then a tree.
template <typename F>
__global__ void __launch_bounds__(kBlock)
    chunk_sums_kernel(F f, int64_t count, int64_t chunk, Sum2* partials) {
  __shared__ double sa[kBlock], sb[kBlock];
  const int t = threadIdx.x;
  const int64_t start = int64_t(blockIdx.x) * chunk, end = imin(count, start + chunk);
  Sum2 acc{0.0, 0.0};
  for (int64_t i = start + t; i < end; i += kBlock) {
    const Sum2 v = f(i);
    acc.a += v.a;
    acc.b += v.b;
  }
  sa[t] = acc.a;
  sb[t] = acc.b;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s /= 2) {
    if (t < s) {
      sa[t] += sa[t + s];
      sb[t] += sb[t + s];
    }
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = Sum2{sa[0], sb[0]};
}

// One block: the chunk sums in a tree, then fin(total) on thread 0.
template <typename Fin>
__global__ void __launch_bounds__(kBlock)
    finish_sums_kernel(const Sum2* partials, int64_t chunks, Fin fin) {
  __shared__ double sa[kBlock], sb[kBlock];
  const int t = threadIdx.x;
  Sum2 acc{0.0, 0.0};
  for (int64_t i = t; i < chunks; i += kBlock) {
    acc.a += partials[i].a;
    acc.b += partials[i].b;
  }
  sa[t] = acc.a;
  sb[t] = acc.b;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s /= 2) {
    if (t < s) {
      sa[t] += sa[t + s];
      sb[t] += sb[t + s];
    }
    __syncthreads();
  }
  if (t == 0) fin(Sum2{sa[0], sb[0]});
}

// fin(sum of f(i) for i in [0, count)). Chunks depend on count only: the same bits every run.
template <typename F, typename Fin>
void blocked_sum(const F& f, const Fin& fin, int64_t count, const Tensor& like, const char* name) {
  const int64_t chunk = std::max<int64_t>(int64_t{kBlock} * 16, ceil_div(count, 1024));
  const int64_t chunks = std::max<int64_t>(ceil_div(count, chunk), 1);
  const Tensor scratch = empty({chunks * 2}, kFloat64, like.device());
  Sum2* partials = reinterpret_cast<Sum2*>(scratch.data_ptr<double>());
  const cudaStream_t stream = stream_of(like);
  chunk_sums_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, stream>>>(f, count, chunk,
                                                                          partials);
  check_launch(name, like.device().index);
  finish_sums_kernel<<<1, kBlock, 0, stream>>>(partials, chunks, fin);
  check_launch(name, like.device().index);
}

// The gradient scale of a reduced loss, on the device: dloss[0] (Sum) or dloss[0] / divisor.
__device__ __forceinline__ double reduced_scale(const double* dloss, bool mean, double divisor) {
  return mean ? dloss[0] / divisor : dloss[0];
}

// dloss as the kernels read it (its size checked by the CPU entry): per position in T (None), or
// its one value in double.
struct GradInput {
  Tensor per_position;
  Tensor value;
};
GradInput grad_input(const Tensor& dloss, Reduction reduction, DType dtype) {
  if (reduction == Reduction::None) return {contiguous_as(dloss, dtype), Tensor()};
  return {Tensor(), contiguous_as(dloss, kFloat64)};
}

// ---------------------------------------------------------------- class losses

// x [N, C, *] as the lines of [N, C, S].
LineShape class_shape(const Shape& input) {
  const kernels::ClassLayout l = kernels::class_layout(input);
  return {l.n, l.c, l.s};
}

// Counts targets != ignore_index and finds the first one outside [0, classes). Integer
// atomics only: counts[0] += per-thread counts, counts[1] = min(bad position).
template <typename I>
__global__ void check_targets_kernel(const I* target, int64_t n, int64_t classes,
                                     int64_t ignore_index, unsigned long long* counts) {
  unsigned long long count = 0, first_bad = ~0ull;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(target[p]);
    if (t == ignore_index) continue;
    if (t < 0 || t >= classes) {
      if (first_bad == ~0ull) first_bad = static_cast<unsigned long long>(p);
      continue;
    }
    ++count;
  }
  if (count) atomicAdd(&counts[0], count);
  if (first_bad != ~0ull) atomicMin(&counts[1], first_bad);
}

// Cross entropy of each line (a position's C logits), per tensor/loss.h:
//   loss = (1 - ls) (lse - x_t) + ls (C lse - sum_c x_c) / C, 0 and lse = 0 where ignored.
// Writes lse[p] and either loss_out[p] (None) or loss_sum[p] (double, to be reduced).
template <typename T, typename I, bool kRows>
__global__ void __launch_bounds__(kBlock)
    cross_entropy_kernel(const T* x, const I* target, LineShape s, int64_t items,
                         int64_t ignore_index, double ls, double* lse, T* loss_out,
                         double* loss_sum) {
  __shared__ double smem[kBlock];
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const Line l = line_of<kRows>(item, s);
    T mx = -std::numeric_limits<T>::infinity();
    if (l.valid)
      for (int64_t j = l.lane; j < s.n; j += l.lanes) {
        const T v = x[l.base + j * l.step];
        mx = mx < v ? v : mx;
      }
    mx = static_cast<T>(line_reduce<kRows>(static_cast<double>(mx), smem, l, Max{}));
    double sum_exp = 0, sum_x = 0;
    if (l.valid)
      for (int64_t j = l.lane; j < s.n; j += l.lanes) {
        const T v = x[l.base + j * l.step];
        sum_exp += static_cast<double>(dev_exp(static_cast<T>(v - mx)));
        sum_x += static_cast<double>(v);
      }
    sum_exp = line_reduce<kRows>(sum_exp, smem, l, Plus{});
    if (ls > 0) sum_x = line_reduce<kRows>(sum_x, smem, l, Plus{});
    if (!l.valid || l.lane != 0) continue;
    const int64_t p = l.index, t = static_cast<int64_t>(target[p]);
    double loss = 0, log_z = 0;
    if (t != ignore_index) {
      if (t < 0 || t >= s.n) {  // check_class_target has ruled this out; never read outside
        log_z = loss = std::numeric_limits<double>::quiet_NaN();
      } else {
        log_z = static_cast<double>(mx) + ::log(sum_exp);
        loss = log_z - static_cast<double>(x[l.base + t * l.step]);
        if (ls > 0) {
          const double classes = static_cast<double>(s.n);
          loss = (1.0 - ls) * loss + ls * (classes * log_z - sum_x) / classes;
        }
      }
    }
    lse[p] = log_z;
    if (loss_out)
      loss_out[p] = static_cast<T>(loss);
    else
      loss_sum[p] = loss;
  }
}

// Reads back the per-position double losses for blocked_sum.
struct ReadLoss {
  const double* loss;
  __device__ Sum2 operator()(int64_t i) const { return {loss[i], 0.0}; }
};

// Writes a reduced loss: total (Sum) or total / divisor (Mean; NaN when the divisor is 0).
template <typename T>
struct WriteReduced {
  T* out;
  bool mean;
  double divisor;
  const int64_t* count = nullptr;  // set: the divisor, counted on the device
  __device__ void operator()(Sum2 total) const {
    const double d = count ? static_cast<double>(*count) : divisor;
    out[0] = static_cast<T>(!mean      ? total.a
                            : d == 0.0 ? std::numeric_limits<double>::quiet_NaN()
                                       : total.a / d);
  }
};

// d cross_entropy, one thread per logit of [N, C, S]:
//   dx = g (exp(x - lse) - ls / C) - g (1 - ls) [c == t], 0 where ignored.
// lse is split into hi + lo in T so that x - hi is exact near the top logits.
template <typename T, typename I>
struct CrossEntropyGrad {
  const T* x;
  const I* target;
  const double* lse;
  const T* g_per_position;  // None
  const double* g_value;    // Mean / Sum
  T* dx;
  LineShape s;
  int64_t ignore_index;
  bool mean;
  const int64_t* count;  // Mean's divisor, on the device
  T uniform, on_target;
  __device__ void operator()(int64_t idx) const {
    const int64_t q = idx / s.inner, si = idx - q * s.inner;
    const int64_t b = q / s.n, c = q - b * s.n;
    const int64_t p = b * s.inner + si;
    const int64_t t = static_cast<int64_t>(target[p]);
    if (t == ignore_index) {
      dx[idx] = T(0);
      return;
    }
    const T scale = g_per_position
                        ? g_per_position[p]
                        : static_cast<T>(reduced_scale(g_value, mean, static_cast<double>(*count)));
    const T hi = static_cast<T>(lse[p]), lo = static_cast<T>(lse[p] - static_cast<double>(hi));
    T d = scale * (dev_exp(static_cast<T>(static_cast<T>(x[idx] - hi) - lo)) - uniform);
    if (c == t) d -= scale * on_target;
    dx[idx] = d;
  }
};

// nll per position p = (b, s): its weight (0 when ignored) and loss -w x[b, t, s].
template <typename T, typename I>
struct NllTerms {
  const T* x;
  const I* target;
  const T* weight;  // null: every class weighs 1
  LineShape s;
  int64_t ignore_index;
  __device__ Sum2 operator()(int64_t p) const {
    const int64_t t = static_cast<int64_t>(target[p]);
    if (t == ignore_index) return {0.0, 0.0};
    if (t < 0 || t >= s.n)  // ruled out by check_class_target; never read outside
      return {std::numeric_limits<double>::quiet_NaN(), 0.0};
    const double w = weight ? static_cast<double>(weight[t]) : 1.0;
    const int64_t b = p / s.inner, si = p - b * s.inner;
    return {-w * static_cast<double>(x[(b * s.n + t) * s.inner + si]), w};
  }
};

template <typename T, typename I>
struct NllPerPosition {
  NllTerms<T, I> terms;
  T* out;
  __device__ void operator()(int64_t p) const { out[p] = static_cast<T>(terms(p).a); }
};

// Writes the reduced nll (Mean: total / total_weight, NaN when every target is ignored) and
// the total weight for the host.
template <typename T>
struct WriteNll {
  T* out;
  double* total_weight;
  bool mean;
  __device__ void operator()(Sum2 total) const {
    out[0] = static_cast<T>(mean ? total.a / total.b : total.a);
    total_weight[0] = total.b;
  }
};

// d nll_loss, one thread per element of [N, C, S]: -g w[t] at the target class, 0 elsewhere.
template <typename T, typename I>
struct NllGrad {
  const I* target;
  const T* weight;
  const T* g_per_position;
  const double* g_value;
  T* dx;
  LineShape s;
  int64_t ignore_index;
  bool mean;
  double total_weight;
  __device__ void operator()(int64_t idx) const {
    const int64_t q = idx / s.inner, si = idx - q * s.inner;
    const int64_t b = q / s.n, c = q - b * s.n;
    const int64_t p = b * s.inner + si;
    const int64_t t = static_cast<int64_t>(target[p]);
    T v = T(0);
    if (t != ignore_index && c == t) {
      const T scale = g_per_position ? g_per_position[p]
                                     : static_cast<T>(reduced_scale(g_value, mean, total_weight));
      v = -(weight ? weight[t] : T(1)) * scale;
    }
    dx[idx] = v;
  }
};

// ---------------------------------------------------------------- mse

template <typename T>
struct SquaredError {
  const T *x, *t;
  T* out;
  __device__ void operator()(int64_t i) const { out[i] = (x[i] - t[i]) * (x[i] - t[i]); }
};
template <typename T>
struct SquaredErrorSum {
  const T *x, *t;
  __device__ Sum2 operator()(int64_t i) const {
    const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
    return {d * d, 0.0};
  }
};
// d mse: dx = 2 (x - t) g.
template <typename T>
struct SquaredErrorGrad {
  const T *x, *t;
  const T* g_per_element;
  const double* g_value;
  bool mean;
  double count;
  T* dx;
  __device__ void operator()(int64_t i) const {
    if (g_per_element) {
      dx[i] = T(2) * (x[i] - t[i]) * g_per_element[i];
    } else {
      const T scale = static_cast<T>(2.0 * reduced_scale(g_value, mean, count));
      dx[i] = scale * (x[i] - t[i]);
    }
  }
};

}  // namespace

// ---------------------------------------------------------------- entry points

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_family<Kind::Softmax>("softmax", x, Tensor(), dim);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_family<Kind::LogSoftmax>("log_softmax", x, Tensor(), dim);
}
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim) {
  return softmax_family<Kind::SoftmaxBackward>("softmax_backward", y, dy, dim);
}
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim) {
  return softmax_family<Kind::LogSoftmaxBackward>("log_softmax_backward", y, dy, dim);
}

namespace {

// counts[2] = the first bad target's value, next to its position counts[1] (none: ~0).
template <typename I>
__global__ void bad_target_kernel(const I* target, unsigned long long* counts) {
  if (counts[1] != ~0ull)
    counts[2] = static_cast<unsigned long long>(static_cast<int64_t>(target[counts[1]]));
}

// Queues the target check of a class loss on the target's stream: an int64 [3] tensor that will
// hold the targets != ignore_index, the first bad position (~0 when none) and that target.
Tensor queue_target_check(const char* op, const Tensor& input, const Tensor& target,
                          int64_t ignore_index) {
  const int device = target.device().index;
  const int64_t classes = input.size(1), n = target.numel();
  const Tensor counts = empty({3}, kInt64, target.device());
  auto* cp = reinterpret_cast<unsigned long long*>(counts.data_ptr<int64_t>());
  const cudaStream_t stream = stream_of(target);
  LOOM_CUDA_CHECK(cudaMemsetAsync(cp, 0, sizeof(unsigned long long), stream), device);
  LOOM_CUDA_CHECK(cudaMemsetAsync(cp + 1, 0xff, sizeof(unsigned long long), stream), device);
  if (n == 0) return counts;
  const Tensor tc = contiguous_as(target, target.dtype());
  dispatch_index(target.dtype(), op, [&]<typename I>() {
    check_targets_kernel<<<blocks_for(n), kThreads, 0, stream>>>(tc.data_ptr<I>(), n, classes,
                                                                 ignore_index, cp);
    check_launch("check_targets_kernel", device);
    bad_target_kernel<<<1, 1, 0, stream>>>(tc.data_ptr<I>(), cp);
    check_launch("bad_target_kernel", device);
  });
  return counts;
}

// Throws the IndexError of a bad target when `found` (the first bad position, then its value)
// names one.
void raise_bad_target(const unsigned long long* found, const char* op, int64_t classes,
                      int64_t ignore_index, const Shape& input, const Shape& target,
                      const char* when) {
  if (found[0] == ~0ull) return;
  throw IndexError(detail::str(op, ": target ", static_cast<int64_t>(found[1]),
                               " is out of range [0, ", classes, ") (ignore_index=", ignore_index,
                               "); got input=", input, " target=", target, when));
}

// The targets != ignore_index of `target` as a [] int64 tensor on its device, counted there; the
// check that every other target is in [0, classes) is deferred (Note [Deferred device checks]):
// its IndexError comes at this thread's next wait for the device.
Tensor count_class_targets(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index) {
  const int device = target.device().index;
  DeviceGuard guard(device);
  const Tensor counts = queue_target_check(op, input, target, ignore_index);
  if (target.numel() > 0)
    defer_check(counts.data_ptr<int64_t>() + 1, 2 * sizeof(int64_t), Stream::current(device),
                [op, classes = input.size(1), ignore_index, in = input.sizes(),
                 t = target.sizes()](const void* bytes) {
                  raise_bad_target(static_cast<const unsigned long long*>(bytes), op, classes,
                                   ignore_index, in, t,
                                   " (found on the device after the op returned)");
                });
  return kernels::reshape(kernels::narrow(counts, 0, 0, 1), {});
}

}  // namespace

int64_t check_class_target(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index) {
  const int device = target.device().index;
  DeviceGuard guard(device);
  if (target.numel() == 0) return 0;
  const Tensor counts = queue_target_check(op, input, target, ignore_index);
  unsigned long long host[3] = {0, 0, 0};
  copy_bytes(host, counts.data_ptr<int64_t>(), sizeof(host), CopyKind::DeviceToHost, device);
  raise_bad_target(host + 1, op, input.size(1), ignore_index, input.sizes(), target.sizes(), "");
  return static_cast<int64_t>(host[0]);
}

kernels::CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                                   Reduction reduction, int64_t ignore_index,
                                                   double label_smoothing) {
  const char* op = "cross_entropy";
  DeviceGuard guard(logits.device().index);
  const Tensor count = count_class_targets(op, logits, target, ignore_index);
  const LineShape s = class_shape(logits.sizes());
  const int64_t positions = s.outer * s.inner;
  kernels::CrossEntropyForward out;
  out.count = count;
  out.lse = empty({s.outer, s.inner}, kFloat64, logits.device());
  const bool per_position = reduction == Reduction::None;
  out.loss = per_position ? empty(target.sizes(), logits.dtype(), logits.device())
                          : empty({}, logits.dtype(), logits.device());
  dispatch_floating(logits.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const Tensor xc = contiguous_as(logits, logits.dtype());
      const Tensor tc = contiguous_as(target, target.dtype());
      const Tensor losses = per_position ? Tensor() : empty({positions}, kFloat64, logits.device());
      T* loss_out = per_position ? out.loss.data_ptr<T>() : nullptr;
      double* loss_sum = per_position ? nullptr : losses.data_ptr<double>();
      if (positions > 0) {
        const LineLaunch p = plan_lines(s);
        const cudaStream_t stream = stream_of(logits);
        double* lse = out.lse.data_ptr<double>();
        if (p.rows)
          cross_entropy_kernel<T, I, true><<<p.grid, p.block, 0, stream>>>(
              xc.data_ptr<T>(), tc.data_ptr<I>(), s, p.items, ignore_index, label_smoothing, lse,
              loss_out, loss_sum);
        else
          cross_entropy_kernel<T, I, false><<<p.grid, p.block, 0, stream>>>(
              xc.data_ptr<T>(), tc.data_ptr<I>(), s, p.items, ignore_index, label_smoothing, lse,
              loss_out, loss_sum);
        check_launch("cross_entropy_kernel", logits.device().index);
      }
      if (per_position) return;
      blocked_sum(ReadLoss{loss_sum},
                  WriteReduced<T>{out.loss.data_ptr<T>(), reduction == Reduction::Mean, 0.0,
                                  count.data_ptr<int64_t>()},
                  positions, logits, "cross_entropy_sum_kernel");
    });
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count) {
  const char* op = "cross_entropy_backward";
  LOOM_CHECK(count.device() == logits.device() && count.numel() == 1, DeviceError, op,
             ": expected the forward's count, one value on ", logits.device(),
             "; got count=", count.sizes(), " on ", count.device());
  const LineShape s = class_shape(logits.sizes());
  DeviceGuard guard(logits.device().index);
  Tensor dx = empty(logits.sizes(), logits.dtype(), logits.device());
  dispatch_floating(logits.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const Tensor xc = contiguous_as(logits, logits.dtype());
      const Tensor tc = contiguous_as(target, target.dtype());
      const Tensor lsec = contiguous_as(lse, kFloat64);
      const Tensor cc = contiguous_as(count, kInt64);
      const GradInput g = grad_input(dloss, reduction, logits.dtype());
      const double ls = label_smoothing;
      const CrossEntropyGrad<T, I> f{
          xc.data_ptr<T>(),
          tc.data_ptr<I>(),
          lsec.data_ptr<double>(),
          g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr,
          g.value.defined() ? g.value.data_ptr<double>() : nullptr,
          dx.data_ptr<T>(),
          s,
          ignore_index,
          reduction == Reduction::Mean,
          cc.data_ptr<int64_t>(),
          static_cast<T>(ls / static_cast<double>(s.n)),
          static_cast<T>(1.0 - ls)};
      run_map(f, logits.numel(), logits, "cross_entropy_backward_kernel");
    });
  });
  return dx;
}

kernels::NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target,
                                         const Tensor& weight, Reduction reduction,
                                         int64_t ignore_index) {
  const char* op = "nll_loss";
  DeviceGuard guard(log_probs.device().index);
  check_class_target(op, log_probs, target, ignore_index);
  const LineShape s = class_shape(log_probs.sizes());
  const int64_t positions = s.outer * s.inner;
  kernels::NllLossForward out;
  const bool per_position = reduction == Reduction::None;
  out.loss = per_position ? empty(target.sizes(), log_probs.dtype(), log_probs.device())
                          : empty({}, log_probs.dtype(), log_probs.device());
  dispatch_floating(log_probs.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const Tensor xc = contiguous_as(log_probs, log_probs.dtype());
      const Tensor tc = contiguous_as(target, target.dtype());
      const Tensor wc = weight.defined() ? contiguous_as(weight, log_probs.dtype()) : Tensor();
      const NllTerms<T, I> terms{xc.data_ptr<T>(), tc.data_ptr<I>(),
                                 wc.defined() ? wc.data_ptr<T>() : nullptr, s, ignore_index};
      if (per_position) {
        run_map(NllPerPosition<T, I>{terms, out.loss.data_ptr<T>()}, positions, log_probs,
                "nll_loss_kernel");
        return;
      }
      const Tensor total_weight = empty({1}, kFloat64, log_probs.device());
      blocked_sum(terms,
                  WriteNll<T>{out.loss.data_ptr<T>(), total_weight.data_ptr<double>(),
                              reduction == Reduction::Mean},
                  positions, log_probs, "nll_loss_sum_kernel");
      copy_bytes(&out.total_weight, total_weight.data_ptr<double>(), sizeof(double),
                 CopyKind::DeviceToHost, log_probs.device().index);
    });
  });
  return out;
}

Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight) {
  const char* op = "nll_loss_backward";
  const LineShape s = class_shape(input_shape);
  DeviceGuard guard(dloss.device().index);
  const DType dtype = dloss.dtype();
  Tensor dx = empty(input_shape, dtype, dloss.device());
  dispatch_floating(dtype, op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const Tensor tc = contiguous_as(target, target.dtype());
      const Tensor wc = weight.defined() ? contiguous_as(weight, dtype) : Tensor();
      const GradInput g = grad_input(dloss, reduction, dtype);
      const NllGrad<T, I> f{tc.data_ptr<I>(),
                            wc.defined() ? wc.data_ptr<T>() : nullptr,
                            g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr,
                            g.value.defined() ? g.value.data_ptr<double>() : nullptr,
                            dx.data_ptr<T>(),
                            s,
                            ignore_index,
                            reduction == Reduction::Mean,
                            total_weight};
      run_map(f, dx.numel(), dloss, "nll_loss_backward_kernel");
    });
  });
  return dx;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  DeviceGuard guard(input.device().index);
  const int64_t n = input.numel();
  const bool per_element = reduction == Reduction::None;
  Tensor out = per_element ? empty(input.sizes(), input.dtype(), input.device())
                           : empty({}, input.dtype(), input.device());
  dispatch_floating(input.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(input, input.dtype()),
                 tc = contiguous_as(target, input.dtype());
    if (per_element) {
      run_map(SquaredError<T>{xc.data_ptr<T>(), tc.data_ptr<T>(), out.data_ptr<T>()}, n, input,
              "mse_loss_kernel");
      return;
    }
    blocked_sum(
        SquaredErrorSum<T>{xc.data_ptr<T>(), tc.data_ptr<T>()},
        WriteReduced<T>{out.data_ptr<T>(), reduction == Reduction::Mean, static_cast<double>(n)}, n,
        input, "mse_loss_sum_kernel");
  });
  return out;
}

Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction) {
  const char* op = "mse_loss_backward";
  DeviceGuard guard(input.device().index);
  const int64_t n = input.numel();
  Tensor dx = empty(input.sizes(), input.dtype(), input.device());
  dispatch_floating(input.dtype(), op, [&]<typename T>() {
    const Tensor xc = contiguous_as(input, input.dtype()),
                 tc = contiguous_as(target, input.dtype());
    const GradInput g = grad_input(dloss, reduction, input.dtype());
    const SquaredErrorGrad<T> f{xc.data_ptr<T>(),
                                tc.data_ptr<T>(),
                                g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr,
                                g.value.defined() ? g.value.data_ptr<double>() : nullptr,
                                reduction == Reduction::Mean,
                                static_cast<double>(n),
                                dx.data_ptr<T>()};
    run_map(f, n, input, "mse_loss_backward_kernel");
  });
  return dx;
}

}  // namespace loom::cuda
