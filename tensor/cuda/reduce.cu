// tensor/cuda/reduce.cu — reductions on CUDA: sum, mean, max/min (values and indices), var,
// std, logsumexp, and contiguous_as, through which the loss and norm kernels read their inputs.
// Each reduction sees x as [M outputs, N reduced elements] without copying it; see
// Note [CUDA reduction]. Results match tensor/cpu/reduce.cpp: same dtypes, NaN rules, ties.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/copy.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/reduce.h"
#include "tensor/dispatch.h"
#include "tensor/view.h"

namespace loom::cuda {

// Note [CUDA reduction]
// x is seen as [M, N]: output o and its reduced element i sit at
//   outer.offset(o) + inner.offset(i)
// where `outer` walks the kept dims and `inner` the reduced ones, both in row-major order, so i
// is the flat index over the reduced dims (what argmax returns). One of two kernels runs:
//  - rows, when the reduced elements lie closer together in memory than the outputs (a sum
//    over the last dim): tx threads per output, ty outputs per block. Thread x takes groups of
//    kVec consecutive elements x, x + tx, x + 2 tx, ... (one vector load per group when the
//    data is aligned, else kVec scalar loads in the same order), then the tx threads of the
//    output combine with warp shuffles, and across warps through shared memory.
//  - cols, when the outputs lie closer (a bias gradient summing the leading dims): tx outputs
//    side by side per block, so a warp reads neighbouring addresses; ty threads per output take
//    elements y, y + ty, ...; their ty results combine in a shared-memory tree.
// When the outputs alone make too few blocks, the N elements are cut into G chunks (grid.y):
// each block writes a partial result to an [M, G] buffer and a second kernel combines each
// output's G partials in a fixed tree. Every choice depends only on the shape and strides, so a
// reduction gives the same bits every time: no floating-point atomics anywhere.

namespace {

constexpr int kBlock = 256;              // threads per block
constexpr int kMaxDims = 16;             // dims an index map holds after merging
constexpr int64_t kTargetBlocks = 1024;  // fewer blocks than this: split the reduced elements
constexpr int64_t kMinPerThread = 16;    // ... as long as each thread keeps this many
constexpr int64_t kMaxSplit = 1024;      // chunks per output at most
constexpr int64_t kMaxGridX = 1 << 20;   // larger problems loop over their outputs

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v != v;
  else
    return false;
}
template <typename T>
__device__ __forceinline__ bool is_finite(T v) {
  return v > -std::numeric_limits<T>::infinity() && v < std::numeric_limits<T>::infinity();
}
__device__ __forceinline__ float dev_sqrt(float v) { return ::sqrtf(v); }
__device__ __forceinline__ double dev_sqrt(double v) { return ::sqrt(v); }

// ---------------------------------------------------------------- index maps

// A row-major walk over some dims of a tensor: the memory offset (in elements) of flat index i.
struct IndexMap {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];

  __device__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = ndim - 1; d > 0; --d) {
      const int64_t q = i / sizes[d];
      off += (i - q * sizes[d]) * strides[d];
      i = q;
    }
    return ndim > 0 ? off + i * strides[0] : 0;
  }
};

// The map of `dims` (in order) of x: size-1 dims dropped, a dim merged into the one before it
// when the two walk memory as one (stride[prev] == stride * size).
IndexMap make_map(const Tensor& x, const Shape& dims, const char* op) {
  IndexMap m{};
  m.ndim = 0;
  for (int64_t d : dims) {
    const int64_t size = x.sizes()[d], stride = x.strides()[d];
    if (size == 1) continue;
    if (m.ndim > 0 && m.strides[m.ndim - 1] == stride * size) {
      m.sizes[m.ndim - 1] *= size;
      m.strides[m.ndim - 1] = stride;
      continue;
    }
    LOOM_CHECK(m.ndim < kMaxDims, NotImplementedError, op, ": more than ", kMaxDims,
               " dims that do not merge; got shape=", x.sizes(), " strides=", x.strides());
    m.sizes[m.ndim] = size;
    m.strides[m.ndim] = stride;
    ++m.ndim;
  }
  return m;
}

// x as [M, N] (Note [CUDA reduction]).
struct Layout {
  IndexMap outer, inner;
  int64_t m = 1, n = 1;
  Shape out_shape;
};

Layout make_layout(const Tensor& x, const Shape& sorted_dims, bool keepdim, const char* op) {
  Layout l;
  Shape kept;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::binary_search(sorted_dims.begin(), sorted_dims.end(), d))
      l.n *= x.sizes()[d];
    else {
      kept.push_back(d);
      l.m *= x.sizes()[d];
    }
  }
  l.outer = make_map(x, kept, op);
  l.inner = make_map(x, sorted_dims, op);
  l.out_shape = kernels::reduced_shape(x.sizes(), sorted_dims, keepdim);
  return l;
}

// ---------------------------------------------------------------- kernel building blocks

template <typename T>
constexpr int vec_width() {
  return sizeof(T) >= 8 ? 2 : 4;  // 16 bytes for 4- and 8-byte types
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T>
struct Input {
  const T* data;
  IndexMap outer, inner;
  bool inner_linear;  // inner.ndim <= 1: element i at i * inner_stride
  int64_t inner_stride;
  bool vectorized;  // inner stride 1 and every output's row aligned to a Pack

  __device__ T load(int64_t base, int64_t i) const {
    return data[base + (inner_linear ? i * inner_stride : inner.offset(i))];
  }
};

// __shfl_down_sync for any trivially copyable accumulator, 32 bits at a time.
template <typename A>
__device__ __forceinline__ A shfl_down(const A& v, unsigned delta, int width) {
  constexpr int kWords = (sizeof(A) + 3) / 4;
  unsigned words[kWords] = {};
  memcpy(words, &v, sizeof(A));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_down_sync(0xffffffffu, words[w], delta, width);
  A out;
  memcpy(&out, words, sizeof(A));
  return out;
}

// Combines the accumulators of the blockDim.x threads of each row threadIdx.y (a power of two);
// the row's result is in its thread x == 0. Every thread of the block calls it; smem holds
// blockDim.x * blockDim.y / 32 accumulators.
template <typename Op, typename Acc>
__device__ Acc combine_row(const Op& op, Acc v, Acc* smem) {
  const int tx = blockDim.x, x = threadIdx.x;
  const int width = tx < 32 ? tx : 32;
  for (int d = width / 2; d > 0; d /= 2) v = op.combine(v, shfl_down(v, d, width));
  if (tx <= 32) return v;
  const int warps = tx / 32;
  if (x % 32 == 0) smem[threadIdx.y * warps + x / 32] = v;
  __syncthreads();
  if (x < 32) {  // the row's first warp combines the warps' results
    v = x < warps ? smem[threadIdx.y * warps + x] : op.identity();
    for (int d = 16; d > 0; d /= 2) v = op.combine(v, shfl_down(v, d, 32));
  }
  __syncthreads();
  return v;
}

// Where a block's result goes: the [M, G] partials, or the op's own output.
template <typename Acc>
struct ToPartials {
  Acc* partials;
  int64_t chunks;
  template <typename Op>
  __device__ void operator()(const Op&, int64_t o, int64_t chunk, const Acc& a) const {
    partials[o * chunks + chunk] = a;
  }
};
struct ToOutput {
  template <typename Op, typename Acc>
  __device__ void operator()(const Op& op, int64_t o, int64_t, const Acc& a) const {
    op.finish(o, a);
  }
};

// Rows kernel (Note [CUDA reduction]): block (tx, ty), ty outputs of tx threads each; grid.y
// chunks of `chunk` elements (a multiple of kVec).
template <typename Op, typename T, int kVec, typename Sink>
__global__ void __launch_bounds__(kBlock)
    reduce_rows_kernel(Op op, Input<T> in, Sink sink, int64_t m, int64_t n, int64_t chunk) {
  using Acc = typename Op::Acc;
  __shared__ Acc smem[kBlock / 32];
  const int x = threadIdx.x, tx = blockDim.x;
  const int64_t start = int64_t(blockIdx.y) * chunk, end = imin(n, start + chunk);
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < m;
       first += int64_t(gridDim.x) * blockDim.y) {
    const int64_t o = first + threadIdx.y;
    Acc acc = op.identity();
    if (o < m) {
      const int64_t base = in.outer.offset(o);
      const auto ctx = op.context(o);
      for (int64_t i0 = start + int64_t(x) * kVec; i0 < end; i0 += int64_t(tx) * kVec) {
        if (in.vectorized && i0 + kVec <= end) {
          const Pack<T, kVec> p = *reinterpret_cast<const Pack<T, kVec>*>(in.data + base + i0);
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc = op.combine(acc, op.transform(ctx, p.v[k], i0 + k));
        } else {
          for (int k = 0; k < kVec && i0 + k < end; ++k)
            acc = op.combine(acc, op.transform(ctx, in.load(base, i0 + k), i0 + k));
        }
      }
    }
    acc = combine_row(op, acc, smem);
    if (x == 0 && o < m) sink(op, o, blockIdx.y, acc);
  }
}

// Cols kernel (Note [CUDA reduction]): block (tx, ty), tx neighbouring outputs, ty threads each.
template <typename Op, typename T, typename Sink>
__global__ void __launch_bounds__(kBlock)
    reduce_cols_kernel(Op op, Input<T> in, Sink sink, int64_t m, int64_t n, int64_t chunk) {
  using Acc = typename Op::Acc;
  __shared__ Acc smem[kBlock];
  const int x = threadIdx.x, y = threadIdx.y, tx = blockDim.x, ty = blockDim.y;
  const int slot = y * tx + x;
  const int64_t start = int64_t(blockIdx.y) * chunk, end = imin(n, start + chunk);
  for (int64_t first = int64_t(blockIdx.x) * tx; first < m; first += int64_t(gridDim.x) * tx) {
    const int64_t o = first + x;
    Acc acc = op.identity();
    if (o < m) {
      const int64_t base = in.outer.offset(o);
      const auto ctx = op.context(o);
      for (int64_t i = start + y; i < end; i += ty)
        acc = op.combine(acc, op.transform(ctx, in.load(base, i), i));
    }
    smem[slot] = acc;
    __syncthreads();
    for (int s = ty / 2; s > 0; s /= 2) {
      if (y < s) smem[slot] = op.combine(smem[slot], smem[slot + s * tx]);
      __syncthreads();
    }
    if (y == 0 && o < m) sink(op, o, blockIdx.y, smem[x]);
    __syncthreads();
  }
}

// Second pass: each output's `chunks` partials, tx threads per output as in the rows kernel.
template <typename Op>
__global__ void __launch_bounds__(kBlock)
    combine_partials_kernel(Op op, const typename Op::Acc* partials, int64_t m, int64_t chunks) {
  using Acc = typename Op::Acc;
  __shared__ Acc smem[kBlock / 32];
  const int x = threadIdx.x, tx = blockDim.x;
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < m;
       first += int64_t(gridDim.x) * blockDim.y) {
    const int64_t o = first + threadIdx.y;
    Acc acc = op.identity();
    if (o < m)
      for (int64_t i = x; i < chunks; i += tx) acc = op.combine(acc, partials[o * chunks + i]);
    acc = combine_row(op, acc, smem);
    if (x == 0 && o < m) op.finish(o, acc);
  }
}

// How many chunks to cut each output's n elements into, with `lanes` threads per output.
int64_t split_count(int64_t blocks_x, int64_t n, int64_t lanes) {
  if (blocks_x >= kTargetBlocks) return 1;
  const int64_t by_blocks = ceil_div(kTargetBlocks, blocks_x);
  const int64_t by_work = n / (lanes * kMinPerThread);
  return std::clamp<int64_t>(std::min(by_blocks, by_work), 1, kMaxSplit);
}

// Runs `op` over x seen through layout l (Note [CUDA reduction]); op.finish writes the results.
template <typename T, typename Op>
void run_reduce(const Op& op, const Tensor& x, const Layout& l, const char* name) {
  using Acc = typename Op::Acc;
  if (l.m == 0) return;
  const int device = x.device().index;
  const cudaStream_t stream = stream_of(x);
  constexpr int kVec = vec_width<T>();

  Input<T> in;
  in.data = x.data_ptr<T>();
  in.outer = l.outer;
  in.inner = l.inner;
  in.inner_linear = l.inner.ndim <= 1;
  in.inner_stride = l.inner.ndim == 1 ? l.inner.strides[0] : 0;
  in.vectorized = false;
  const int64_t inner_step = l.inner.ndim > 0 ? std::abs(l.inner.strides[l.inner.ndim - 1]) : 0;
  const int64_t outer_step = l.outer.ndim > 0 ? std::abs(l.outer.strides[l.outer.ndim - 1]) : 0;
  const bool cols = l.outer.ndim > 0 && l.inner.ndim > 0 && outer_step < inner_step;

  int tx, ty;
  int64_t chunks, chunk;
  if (cols) {
    tx = next_pow2(l.m, 32);
    ty = kBlock / tx;
    chunks = split_count(ceil_div(l.m, tx), l.n, ty);
    chunk = std::max<int64_t>(ceil_div(l.n, chunks), 1);
  } else {
    tx = next_pow2(ceil_div(l.n, kVec), kBlock);
    ty = kBlock / tx;
    chunks = split_count(ceil_div(l.m, ty), l.n, tx);
    chunk = std::max<int64_t>(ceil_div(ceil_div(l.n, chunks), kVec) * kVec, kVec);
    bool aligned = in.inner_linear && in.inner_stride == 1 &&
                   reinterpret_cast<uintptr_t>(in.data) % sizeof(Pack<T, kVec>) == 0;
    for (int d = 0; d < l.outer.ndim && aligned; ++d) aligned = l.outer.strides[d] % kVec == 0;
    in.vectorized = aligned;
  }
  chunks = std::max<int64_t>(ceil_div(l.n, chunk), 1);
  const dim3 block(tx, ty);
  const int64_t per_block = cols ? tx : ty;
  const dim3 grid(static_cast<unsigned>(std::min(ceil_div(l.m, per_block), kMaxGridX)),
                  static_cast<unsigned>(chunks));

  if (chunks == 1) {
    if (cols)
      reduce_cols_kernel<<<grid, block, 0, stream>>>(op, in, ToOutput{}, l.m, l.n, chunk);
    else
      reduce_rows_kernel<Op, T, kVec>
          <<<grid, block, 0, stream>>>(op, in, ToOutput{}, l.m, l.n, chunk);
    check_launch(name, device);
    return;
  }
  // Partials: a scratch tensor from the caching allocator, freed (for this stream) on return.
  const Tensor scratch =
      empty({l.m * chunks * static_cast<int64_t>(sizeof(Acc))}, kUInt8, x.device());
  Acc* partials = reinterpret_cast<Acc*>(scratch.data_ptr<uint8_t>());
  const ToPartials<Acc> sink{partials, chunks};
  if (cols)
    reduce_cols_kernel<<<grid, block, 0, stream>>>(op, in, sink, l.m, l.n, chunk);
  else
    reduce_rows_kernel<Op, T, kVec><<<grid, block, 0, stream>>>(op, in, sink, l.m, l.n, chunk);
  check_launch(name, device);
  const int ptx = next_pow2(chunks, kBlock), pty = kBlock / ptx;
  const dim3 pgrid(static_cast<unsigned>(std::min(ceil_div(l.m, pty), kMaxGridX)));
  combine_partials_kernel<<<pgrid, dim3(ptx, pty), 0, stream>>>(op, partials, l.m, chunks);
  check_launch(name, device);
}

// ---------------------------------------------------------------- the reduction ops
// Each op: Acc (trivially copyable), identity(), context(o) (what an output's elements need),
// transform(ctx, value, index) -> Acc, combine(a, b), finish(o, acc) (writes the output).

struct NoContext {};

// Sums in double for floats and in int64 for integers and bool, as the CPU; mean scales.
template <typename T, typename Out>
struct SumOp {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  Out* out;
  Out scale;  // applied in Out when `scaled` (mean): Out(Out(sum) * scale), as mul_scalar_
  bool scaled;
  __device__ Acc identity() const { return Acc(0); }
  __device__ NoContext context(int64_t) const { return {}; }
  __device__ Acc transform(NoContext, T v, int64_t) const { return static_cast<Acc>(v); }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void finish(int64_t o, Acc a) const {
    Out r = static_cast<Out>(a);
    if (scaled) r = static_cast<Out>(r * scale);
    out[o] = r;
  }
};

// amax / amin: NaN wins.
template <typename T, bool kMax>
struct ExtremumOp {
  using Acc = T;
  T* out;
  __device__ T identity() const {
    if constexpr (std::is_floating_point_v<T>)
      return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    else
      return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
  __device__ NoContext context(int64_t) const { return {}; }
  __device__ T transform(NoContext, T v, int64_t) const { return v; }
  __device__ T combine(T a, T b) const {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
    return (kMax ? b > a : b < a) ? b : a;
  }
  __device__ void finish(int64_t o, T a) const { out[o] = a; }
};

// max_dim / min_dim / argmax / argmin: value and index; the first NaN wins, else the best value,
// ties to the smaller index (so the result does not depend on the combining order).
template <typename T>
struct ArgAcc {
  T value;
  int64_t index;  // -1: no element yet
};
template <typename T, bool kMax>
struct ArgOp {
  using Acc = ArgAcc<T>;
  T* values;  // null for argmax / argmin
  int64_t* indices;
  __device__ Acc identity() const { return {T(0), -1}; }
  __device__ NoContext context(int64_t) const { return {}; }
  __device__ Acc transform(NoContext, T v, int64_t i) const { return {v, i}; }
  __device__ Acc combine(const Acc& a, const Acc& b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool nan_a = is_nan(a.value), nan_b = is_nan(b.value);
    if (nan_a || nan_b) {
      if (nan_a && nan_b) return a.index < b.index ? a : b;
      return nan_a ? a : b;
    }
    if (kMax ? a.value > b.value : a.value < b.value) return a;
    if (kMax ? b.value > a.value : b.value < a.value) return b;
    return a.index < b.index ? a : b;
  }
  __device__ void finish(int64_t o, const Acc& a) const {
    if (values) values[o] = a.value;
    indices[o] = a.index;
  }
};

// logsumexp, pass 1: the max as std::max(m, v) computes it (a NaN element never enters m).
template <typename T>
struct LseMaxOp {
  using Acc = T;
  T* max_out;
  __device__ T identity() const { return -std::numeric_limits<T>::infinity(); }
  __device__ NoContext context(int64_t) const { return {}; }
  __device__ T transform(NoContext, T v, int64_t) const { return v; }
  __device__ T combine(T a, T b) const { return a < b ? b : a; }
  __device__ void finish(int64_t o, T a) const { max_out[o] = a; }
};

// logsumexp, pass 2: m + log(sum exp(x - m)) in double; the plain formula when m is not finite.
template <typename T>
struct LseContext {
  T m;
  bool finite;
};
template <typename T>
struct LseSumOp {
  using Acc = double;
  const T* max_in;
  T* out;
  __device__ double identity() const { return 0.0; }
  __device__ LseContext<T> context(int64_t o) const { return {max_in[o], is_finite(max_in[o])}; }
  __device__ double transform(LseContext<T> c, T v, int64_t) const {
    return c.finite ? ::exp(static_cast<double>(static_cast<T>(v - c.m)))
                    : ::exp(static_cast<double>(v));
  }
  __device__ double combine(double a, double b) const { return a + b; }
  __device__ void finish(int64_t o, double s) const {
    const T m = max_in[o];
    out[o] = static_cast<T>(is_finite(m) ? static_cast<double>(m) + ::log(s) : ::log(s));
  }
};

// var, pass 1: the mean in double.
template <typename T>
struct MeanOp {
  using Acc = double;
  double* mean_out;
  double count;
  __device__ double identity() const { return 0.0; }
  __device__ NoContext context(int64_t) const { return {}; }
  __device__ double transform(NoContext, T v, int64_t) const { return static_cast<double>(v); }
  __device__ double combine(double a, double b) const { return a + b; }
  __device__ void finish(int64_t o, double s) const { mean_out[o] = s / count; }
};

// var, pass 2: the sum of squared deviations over (N - correction); std takes the root in T.
template <typename T>
struct SquaredDeviationOp {
  using Acc = double;
  const double* mean_in;
  T* out;
  int64_t denom;
  bool root;
  __device__ double identity() const { return 0.0; }
  __device__ double context(int64_t o) const { return mean_in[o]; }
  __device__ double transform(double mean, T v, int64_t) const {
    const double d = static_cast<double>(v) - mean;
    return d * d;
  }
  __device__ double combine(double a, double b) const { return a + b; }
  __device__ void finish(int64_t o, double m2) const {
    T r = static_cast<T>(denom > 0 ? m2 / static_cast<double>(denom)
                                   : std::numeric_limits<double>::quiet_NaN());
    if (root) r = dev_sqrt(r);
    out[o] = r;
  }
};

// ---------------------------------------------------------------- entry-point helpers

Tensor sum_impl(const Tensor& x, const Shape& dims, bool keepdim, const char* op, bool mean) {
  DeviceGuard guard(x.device().index);
  const Shape rdims = kernels::reduce_dims(x, dims, op);
  const Layout l = make_layout(x, rdims, keepdim, op);
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : kInt64;
  Tensor out = empty(l.out_shape, out_dtype, x.device());
  if (x.dtype() == kBool) {  // counts, as PyTorch
    run_reduce<bool>(SumOp<bool, int64_t>{out.data_ptr<int64_t>(), 0, false}, x, l, "sum_kernel");
    return out;
  }
  dispatch_numeric(x.dtype(), "sum", [&]<typename T>() {
    using Out = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
    Out scale = Out(1);  // mean: 1 / count in T, NaN for an empty reduction (as the CPU)
    if constexpr (std::is_floating_point_v<T>)
      scale = static_cast<Out>(l.n == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / l.n);
    run_reduce<T>(SumOp<T, Out>{out.data_ptr<Out>(), scale, mean}, x, l,
                  mean ? "mean_kernel" : "sum_kernel");
  });
  return out;
}

template <bool kMax>
Tensor extremum(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  DeviceGuard guard(x.device().index);
  const Layout l = make_layout(x, kernels::reduce_dims(x, dims, op), keepdim, op);
  Tensor out = empty(l.out_shape, x.dtype(), x.device());
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    run_reduce<T>(ExtremumOp<T, kMax>{out.data_ptr<T>()}, x, l,
                  kMax ? "amax_kernel" : "amin_kernel");
  });
  return out;
}

// Values and indices over `dims` (one dim, or all of them for a flat argmax).
template <bool kMax>
std::pair<Tensor, Tensor> extremum_index(const Tensor& x, const Shape& rdims, bool keepdim,
                                         bool want_values, const char* op) {
  DeviceGuard guard(x.device().index);
  const Layout l = make_layout(x, rdims, keepdim, op);
  Tensor values = want_values ? empty(l.out_shape, x.dtype(), x.device()) : Tensor();
  Tensor indices = empty(l.out_shape, kInt64, x.device());
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    run_reduce<T>(
        ArgOp<T, kMax>{want_values ? values.data_ptr<T>() : nullptr, indices.data_ptr<int64_t>()},
        x, l, kMax ? "argmax_kernel" : "argmin_kernel");
  });
  return {values, indices};
}

template <bool kMax>
Tensor arg_extremum(const Tensor& x, std::optional<int64_t> dim, bool keepdim, const char* op) {
  if (dim)
    return extremum_index<kMax>(x, kernels::reduce_dims(x, {*dim}, op), keepdim, false, op).second;
  // The flattened tensor, as the CPU's reshape(x, {-1}): every dim, a 0-d result.
  return extremum_index<kMax>(x, kernels::reduce_dims(x, {}, op), false, false, op).second;
}

Tensor var_impl(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim, bool root) {
  DeviceGuard guard(x.device().index);
  const Layout l = make_layout(x, kernels::reduce_dims(x, dims, "var"), keepdim, "var");
  Tensor out = empty(l.out_shape, x.dtype(), x.device());
  const int64_t correction = unbiased ? 1 : 0;
  dispatch_floating(x.dtype(), "var", [&]<typename T>() {
    // Two passes in double, as the CPU: the mean, then the sum of squared deviations.
    const Tensor mean = empty({l.m}, kFloat64, x.device());
    run_reduce<T>(MeanOp<T>{mean.data_ptr<double>(), static_cast<double>(l.n)}, x, l,
                  "var_mean_kernel");
    run_reduce<T>(
        SquaredDeviationOp<T>{mean.data_ptr<double>(), out.data_ptr<T>(), l.n - correction, root},
        x, l, "var_kernel");
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------- entry points

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, "sum", false);
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, "mean", true);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const Shape dims = kernels::sum_to_dims(x, shape);
  if (dims.empty()) return kernels::reshape(x, shape);
  return kernels::reshape(sum(x, dims, /*keepdim=*/true), shape);  // contiguous: a view
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return extremum<true>(x, dims, keepdim, "amax");
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  return extremum<false>(x, dims, keepdim, "amin");
}

std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_index<true>(x, kernels::reduce_dims(x, {dim}, "max"), keepdim, true, "max");
}
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_index<false>(x, kernels::reduce_dims(x, {dim}, "min"), keepdim, true, "min");
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum<true>(x, dim, keepdim, "argmax");
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum<false>(x, dim, keepdim, "argmin");
}

Tensor var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  return var_impl(x, dims, unbiased, keepdim, false);
}
Tensor std(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  return var_impl(x, dims, unbiased, keepdim, true);
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  DeviceGuard guard(x.device().index);
  const Layout l = make_layout(x, kernels::reduce_dims(x, dims, "logsumexp"), keepdim, "logsumexp");
  Tensor out = empty(l.out_shape, x.dtype(), x.device());
  dispatch_floating(x.dtype(), "logsumexp", [&]<typename T>() {
    const Tensor row_max = empty({l.m}, x.dtype(), x.device());
    run_reduce<T>(LseMaxOp<T>{row_max.data_ptr<T>()}, x, l, "logsumexp_max_kernel");
    run_reduce<T>(LseSumOp<T>{row_max.data_ptr<T>(), out.data_ptr<T>()}, x, l, "logsumexp_kernel");
  });
  return out;
}

Tensor contiguous_as(const Tensor& x, DType dtype, MemoryFormat format) {
  if (x.dtype() == dtype) return kernels::contiguous(x, format);
  Tensor out = empty(x.sizes(), dtype, x.device(), format);  // one copy: converted, made dense
  kernels::copy_(out, x);
  return out;
}

}  // namespace loom::cuda
