// tensor/cuda/random.cu — rand, randn and randint fills on the GPU from the shared Philox of
// tensor/philox.h: one thread per Philox counter, so each evaluation serves the 4 (uniform) or
// 2 (normal, integer) elements that tensor/factory.cpp draws from it, in the same lanes.

#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/random.h"
#include "tensor/dispatch.h"
#include "tensor/philox.h"

namespace loom::cuda {

namespace {

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// low + span * u with no FMA contraction: the host computes the same two rounded operations.
__device__ inline double affine(double low, double span, double u) {
  return __dadd_rn(low, __dmul_rn(span, u));
}

// Thread c (grid-stride) evaluates counter first + c and writes elements 4c .. 4c+3 below n,
// with one 16-byte store when the group is whole and `out` is 16-byte aligned (float32).
template <typename T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t first, double low,
                               double span, bool aligned) {
  const int64_t counters = (n + 3) / 4;
  for (int64_t c = thread_index(); c < counters; c += thread_count()) {
    const philox::Lanes r = philox::philox4x32(seed, first + static_cast<uint64_t>(c));
    T v[4];
    for (int k = 0; k < 4; ++k)
      v[k] = static_cast<T>(affine(low, span, static_cast<double>(philox::uniform_float(r[k]))));
    if constexpr (sizeof(T) == 4) {
      if (aligned && c * 4 + 3 < n) {
        *reinterpret_cast<float4*>(out + c * 4) = make_float4(v[0], v[1], v[2], v[3]);
        continue;
      }
    }
    for (int k = 0; k < 4 && c * 4 + k < n; ++k) out[c * 4 + k] = v[k];
  }
}

// Thread c evaluates counter first + c and writes elements 2c (lanes 0, 1) and 2c+1 (lanes 2, 3).
template <typename T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t first, double mean,
                              double std) {
  const int64_t counters = (n + 1) / 2;
  for (int64_t c = thread_index(); c < counters; c += thread_count()) {
    const philox::Lanes r = philox::philox4x32(seed, first + static_cast<uint64_t>(c));
    out[c * 2] = static_cast<T>(affine(mean, std, philox::box_muller(r[0], r[1])));
    if (c * 2 + 1 < n)
      out[c * 2 + 1] = static_cast<T>(affine(mean, std, philox::box_muller(r[2], r[3])));
  }
}

// Thread c evaluates counter first + c and writes elements 2c (lanes 0, 1) and 2c+1 (lanes 2, 3).
template <typename T>
__global__ void randint_kernel(T* out, int64_t n, uint64_t seed, uint64_t first, int64_t low,
                               uint64_t range) {
  const int64_t counters = (n + 1) / 2;
  for (int64_t c = thread_index(); c < counters; c += thread_count()) {
    const philox::Lanes r = philox::philox4x32(seed, first + static_cast<uint64_t>(c));
    out[c * 2] = static_cast<T>(philox::uniform_int(r[0], r[1], low, range));
    if (c * 2 + 1 < n) out[c * 2 + 1] = static_cast<T>(philox::uniform_int(r[2], r[3], low, range));
  }
}

void check_target(const Tensor& t, const char* op) {
  LOOM_CHECK(t.defined() && t.is_cuda(), DeviceError, op, ": expected a CUDA tensor");
  LOOM_CHECK(t.is_contiguous(), ValueError, op,
             ": expected a contiguous tensor; got shape=", t.sizes());
}

}  // namespace

void fill_uniform_(const Tensor& t, uint64_t seed, uint64_t first_counter, double low,
                   double high) {
  check_target(t, "rand");
  DeviceGuard guard(t.device().index);
  const int64_t n = t.numel();
  dispatch_floating(t.dtype(), "rand", [&]<typename T>() {
    t.bump_version();
    if (n == 0) return;
    T* out = t.data_ptr<T>();
    const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
    uniform_kernel<T><<<blocks_for((n + 3) / 4), kThreads, 0, stream_of(t)>>>(
        out, n, seed, first_counter, low, high - low, aligned);
    check_launch("uniform_kernel", t.device().index);
  });
}

void fill_normal_(const Tensor& t, uint64_t seed, uint64_t first_counter, double mean, double std) {
  check_target(t, "randn");
  DeviceGuard guard(t.device().index);
  const int64_t n = t.numel();
  dispatch_floating(t.dtype(), "randn", [&]<typename T>() {
    t.bump_version();
    if (n == 0) return;
    normal_kernel<T><<<blocks_for((n + 1) / 2), kThreads, 0, stream_of(t)>>>(
        t.data_ptr<T>(), n, seed, first_counter, mean, std);
    check_launch("normal_kernel", t.device().index);
  });
}

void fill_randint_(const Tensor& t, uint64_t seed, uint64_t first_counter, int64_t low,
                   int64_t high) {
  LOOM_CHECK(low < high, ValueError, "randint: expected low < high; got low=", low, " high=", high);
  check_target(t, "randint");
  DeviceGuard guard(t.device().index);
  const int64_t n = t.numel();
  const uint64_t range = static_cast<uint64_t>(high - low);
  dispatch_numeric(t.dtype(), "randint", [&]<typename T>() {
    t.bump_version();
    if (n == 0) return;
    randint_kernel<T><<<blocks_for((n + 1) / 2), kThreads, 0, stream_of(t)>>>(
        t.data_ptr<T>(), n, seed, first_counter, low, range);
    check_launch("randint_kernel", t.device().index);
  });
}

}  // namespace loom::cuda
