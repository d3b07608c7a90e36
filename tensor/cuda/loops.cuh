// tensor/cuda/loops.cuh — the elementwise machinery under every map-like CUDA kernel (arithmetic,
// comparisons, copies with conversion, fills): out[i] = f(in0[i], in1[i], ...) over out's shape,
// inputs broadcast to it, any strides. The CUDA twin of tensor/cpu/loops.h. CUDA sources only.
//
//   gpu_map<float, float>("add", out, AddOp{}, a, b);               // every input a float
//   gpu_map_mixed<float, bool, float, float>("where", out, f, c, a, b);  // one type per input
//
// f is a functor or an extended __device__ lambda (a generic one, `[] __device__(auto x)`, may be
// defined in a named host function, not inside a templated lambda such as dispatch_numeric's).
// Its result is converted to Tout with static_cast, as in cpu::map.
//
// Note [CUDA elementwise loops]
// How a map becomes threads:
//  1. On the host, every operand is viewed over out's shape (stride 0 in the dims an input
//     repeats), size-1 dims are dropped, the rest are taken in out's memory order, and adjacent
//     dims that are contiguous for every operand are merged (kernels::plan_loop, the same rule as
//     the CPU loop; all-channels-last operands thus take the flat kernel).
//  2. Flat kernel: when a single dim remains and every stride is 1 (every operand contiguous in
//     out's order), thread t of the grid takes elements 4t..4t+3, then 4(t+G).. (a grid-stride
//     loop, G threads in the grid), loaded and stored as one aligned 4-element vector per
//     operand (a float4 for float) when every pointer is aligned to 4 elements; the last n % 4
//     elements go one to a thread. Unaligned pointers: one element per thread, no index math.
//  3. Strided kernel otherwise: one element per thread per grid-stride step. Thread i turns its
//     linear index (row-major over the merged shape) into one element offset per operand with
//     an OffsetCalculator (up to kMaxDims dims): 32-bit index math, dividing by multiply-high
//     and shift, when the element count and every operand's largest offset fit in int32;
//     64-bit division otherwise.
//  4. More than kMaxDims dims after merging (rare: it takes 9 dims that no operand lets merge):
//     the host loops over the outer dims and launches the strided kernel once per inner block.
// Every launch goes to the current stream of out's device and is followed by check_launch. The
// caller holds a DeviceGuard for out's device.
#pragma once

#include <array>
#include <cstdint>
#include <cuda/std/tuple>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/error.h"
#include "tensor/loop_plan.h"

namespace loom::cuda {

constexpr int kMaxDims = 8;  // dims an OffsetCalculator holds (after merging)

// n / divisor for a fixed divisor in [1, 2^31) and n < 2^31, as a multiply-high and a shift:
// with s = ceil(log2(divisor)) and M = floor(2^(32+s) / divisor) + 1 (M - 2^32 is stored),
// n / divisor = floor(n * M / 2^(32+s)); the error of M is at most divisor, too small to move
// the quotient of any n < 2^32, and n < 2^31 keeps the 32-bit sum below from overflowing.
struct FastDivider {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivider() = default;
  explicit FastDivider(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    multiplier =
        static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __host__ __device__ uint32_t quotient(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(n, multiplier);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return (high + n) >> shift;
  }
};

// Element offsets of N operands (out first) from a linear index over a merged shape of up to
// kMaxDims dims. Index is uint32_t (FastDivider) or int64_t (plain division). Dims are stored
// innermost first; the outermost dim needs no division.
template <int N, typename Index>
struct OffsetCalculator {
  static_assert(std::is_same_v<Index, uint32_t> || std::is_same_v<Index, int64_t>);
  using Divider = std::conditional_t<std::is_same_v<Index, uint32_t>, FastDivider, int64_t>;

  int dims = 0;
  Divider sizes[kMaxDims];
  Index strides[kMaxDims][N];

  // From a plan's sizes and strides (outermost first), dims [first, first + count).
  OffsetCalculator(const Shape& plan_sizes, const std::array<Shape, N>& plan_strides, size_t first,
                   size_t count)
      : dims(static_cast<int>(count)) {
    LOOM_ASSERT(count >= 1 && count <= static_cast<size_t>(kMaxDims),
                "OffsetCalculator: bad dim count ", count);
    for (int d = 0; d < dims; ++d) {
      const size_t src = first + count - 1 - static_cast<size_t>(d);  // innermost first
      sizes[d] = Divider(static_cast<Index>(plan_sizes[src]));
      for (int k = 0; k < N; ++k) strides[d][k] = static_cast<Index>(plan_strides[k][src]);
    }
  }

  __device__ __forceinline__ void get(Index linear, Index (&offsets)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) offsets[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == dims) break;
      Index index = linear;
      if (d + 1 < dims) {
        Index next;
        if constexpr (std::is_same_v<Index, uint32_t>) {
          next = sizes[d].quotient(linear);
          index = linear - next * sizes[d].divisor;
        } else {
          next = linear / sizes[d];
          index = linear - next * sizes[d];
        }
        linear = next;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += index * strides[d][k];
    }
  }
};

namespace map_detail {

// Four consecutive elements as one aligned load or store (a float4 for float).
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// The operands' base pointers: out, then one per input (one spare slot when there is none).
template <typename Tout, typename... Tin>
struct Pointers {
  Tout* out;
  const void* in[sizeof...(Tin) + 1];
};

// The per-element work of a map with output type Tout and input types Tin...
template <typename Tout, typename... Tin>
struct Apply {
  static constexpr int N = 1 + static_cast<int>(sizeof...(Tin));
  using Ptrs = Pointers<Tout, Tin...>;
  using Seq = std::index_sequence_for<Tin...>;

  template <typename F, typename Index, size_t... K>
  __device__ __forceinline__ static void at(const F& f, const Ptrs& p, const Index (&off)[N],
                                            std::index_sequence<K...>) {
    p.out[off[0]] = static_cast<Tout>(f(static_cast<const Tin*>(p.in[K])[off[K + 1]]...));
  }

  template <typename F, size_t... K>
  __device__ __forceinline__ static void flat(const F& f, const Ptrs& p, int64_t i,
                                              std::index_sequence<K...>) {
    p.out[i] = static_cast<Tout>(f(static_cast<const Tin*>(p.in[K])[i]...));
  }

  // Elements 4v..4v+3: every input loaded as one vector before the output vector is stored.
  template <typename F, size_t... K>
  __device__ __forceinline__ static void vec4(const F& f, const Ptrs& p, int64_t v,
                                              std::index_sequence<K...>) {
    const ::cuda::std::tuple<Vec4<Tin>...> loaded{static_cast<const Vec4<Tin>*>(p.in[K])[v]...};
    Vec4<Tout> result;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      result.v[j] = static_cast<Tout>(f(::cuda::std::get<K>(loaded).v[j]...));
    reinterpret_cast<Vec4<Tout>*>(p.out)[v] = result;
  }
};

// Flat kernel (Note [CUDA elementwise loops], step 2).
template <typename A, typename F>
__global__ void flat_map_kernel(typename A::Ptrs p, int64_t n, bool vectorized, F f) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  if (vectorized) {
    const int64_t vectors = n / 4;
    for (int64_t v = first; v < vectors; v += step) A::vec4(f, p, v, typename A::Seq{});
    const int64_t tail = vectors * 4 + first;
    if (tail < n) A::flat(f, p, tail, typename A::Seq{});
  } else {
    for (int64_t i = first; i < n; i += step) A::flat(f, p, i, typename A::Seq{});
  }
}

// Strided kernel (step 3).
template <typename A, typename Index, typename F>
__global__ void strided_map_kernel(typename A::Ptrs p, OffsetCalculator<A::N, Index> calc, Index n,
                                   F f) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[A::N];
    calc.get(i, off);
    A::at(f, p, off, typename A::Seq{});
  }
}

template <typename T>
bool aligned4(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// True when offsets over these dims stay within [0, 2^31) for every operand.
template <size_t N>
bool fits_int32(const Shape& sizes, const std::array<Shape, N>& strides, size_t first,
                size_t count) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  int64_t numel = 1;
  for (size_t d = first; d < first + count; ++d) numel *= sizes[d];
  if (numel > kMax) return false;
  for (size_t k = 0; k < N; ++k) {
    int64_t reach = 0;
    for (size_t d = first; d < first + count; ++d) {
      if (strides[k][d] < 0) return false;
      // (size - 1) * stride <= kMax, without overflowing int64.
      if (sizes[d] > 1 && strides[k][d] > (kMax - reach) / (sizes[d] - 1)) return false;
      reach += (sizes[d] - 1) * strides[k][d];
    }
  }
  return true;
}

// Strided launches (steps 3 and 4): one launch over the inner `inner` dims of the plan for each
// position over the `outer` dims before them, the base pointers moved to that position.
template <typename A, typename Index, typename F>
void launch_strided(const char* name, const typename A::Ptrs& p, const Shape& sizes,
                    const std::array<Shape, A::N>& strides, size_t outer, size_t inner,
                    const size_t* in_bytes, const F& f, cudaStream_t stream, int device) {
  const OffsetCalculator<A::N, Index> calc(sizes, strides, outer, inner);
  int64_t inner_numel = 1;
  for (size_t d = outer; d < outer + inner; ++d) inner_numel *= sizes[d];
  Shape position(outer, 0);
  while (true) {
    typename A::Ptrs q = p;
    for (size_t d = 0; d < outer; ++d) {
      q.out += position[d] * strides[0][d];
      for (int k = 0; k + 1 < A::N; ++k)
        q.in[k] = static_cast<const char*>(q.in[k]) +
                  position[d] * strides[k + 1][d] * static_cast<int64_t>(in_bytes[k]);
    }
    strided_map_kernel<A, Index><<<blocks_for(inner_numel), kThreads, 0, stream>>>(
        q, calc, static_cast<Index>(inner_numel), f);
    check_launch(name, device);
    size_t d = outer;  // the next position over the outer dims, row-major
    while (d > 0 && ++position[d - 1] == sizes[d - 1]) position[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace map_detail

// out[i] = f(in[i]...), each input of its own element type (Tin..., one per input, in order),
// broadcast to out's shape. out may be strided (an in-place op writes into a view); inputs
// that alias out element for element (self in self = f(self, other)) are fine.
template <typename Tout, typename... Tin, typename F, typename... Ins>
void gpu_map_mixed(const char* name, const Tensor& out, const F& f, const Ins&... in) {
  static_assert(sizeof...(Tin) == sizeof...(Ins), "gpu_map_mixed: one element type per input");
  using A = map_detail::Apply<Tout, Tin...>;
  constexpr int N = A::N;
  LOOM_ASSERT(out.dtype() == dtype_of<Tout>::value, name, ": output dtype ", out.dtype());
  LOOM_ASSERT(((in.dtype() == dtype_of<Tin>::value) && ...), name, ": input dtype mismatch");
  LOOM_ASSERT(
      ((in.dim() <= out.dim() && broadcast_shapes(out.sizes(), in.sizes(), name) == out.sizes()) &&
       ...),
      name, ": an input does not broadcast to out=", out.sizes());
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const int device = out.device().index;
  const cudaStream_t stream = stream_of(out);

  typename A::Ptrs p{};
  p.out = static_cast<Tout*>(out.data());
  const void* in_data[] = {in.data()..., nullptr};
  for (int k = 0; k + 1 < N; ++k) p.in[k] = in_data[k];

  const kernels::LoopPlan<N> plan = kernels::plan_loop<N>(
      out.sizes(), {out.strides(), kernels::broadcast_strides(in, out.sizes())...});
  const size_t dims = plan.sizes.size();

  bool flat = dims == 1;
  for (int k = 0; k < N; ++k) flat = flat && (plan.strides[k][0] == 1 || numel == 1);
  if (flat) {
    bool vectorized = map_detail::aligned4<Tout>(p.out);
    const bool in_aligned[] = {map_detail::aligned4<Tin>(in.data())..., true};
    for (int k = 0; k + 1 < N; ++k) vectorized = vectorized && in_aligned[k];
    map_detail::flat_map_kernel<A>
        <<<blocks_for(vectorized ? numel / 4 : numel), kThreads, 0, stream>>>(p, numel, vectorized,
                                                                              f);
    check_launch(name, device);
    return;
  }

  const size_t inner = std::min<size_t>(dims, kMaxDims);
  const size_t outer = dims - inner;
  const size_t in_bytes[] = {sizeof(Tin)..., 0};
  if (map_detail::fits_int32<N>(plan.sizes, plan.strides, outer, inner))
    map_detail::launch_strided<A, uint32_t>(name, p, plan.sizes, plan.strides, outer, inner,
                                            in_bytes, f, stream, device);
  else
    map_detail::launch_strided<A, int64_t>(name, p, plan.sizes, plan.strides, outer, inner,
                                           in_bytes, f, stream, device);
}

// out[i] = f(in[i]...) with every input of element type Tin (as cpu::map).
template <typename Tout, typename Tin, typename F, typename... Ins>
void gpu_map(const char* name, const Tensor& out, const F& f, const Ins&... in) {
  gpu_map_mixed<Tout, std::conditional_t<true, Tin, Ins>...>(name, out, f, in...);
}

}  // namespace loom::cuda
