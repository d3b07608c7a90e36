// tensor/cuda/common.cuh — what every CUDA kernel file shares: the stream a kernel runs on,
// launch sizes, and the check after each launch. CUDA sources only.
//
// Every kernel runs on the current stream of its tensors' device (Stream::current), so work
// queued by one thread stays in order and the caching allocator's per-stream reuse is safe.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace loom::cuda {

inline cudaStream_t current_stream(int device) {
  return static_cast<cudaStream_t>(Stream::current(device).handle());
}
inline cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index); }

constexpr int kThreads = 256;  // threads per block for the simple one-element kernels

// Blocks for n elements, `per_thread` each, capped so a grid-stride loop covers the rest.
inline unsigned blocks_for(int64_t n, int threads = kThreads, int per_thread = 1) {
  const int64_t per_block = int64_t{threads} * per_thread;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// The smallest power of two >= n, within [1, cap]: block shapes of the tree reductions.
inline int next_pow2(int64_t n, int cap) {
  int p = 1;
  while (p < n && p < cap) p *= 2;
  return p;
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// After a launch: a bad configuration or an earlier asynchronous fault surfaces here as
// DeviceError naming the kernel and the device.
inline void check_launch(const char* kernel, int device) {
  check_cuda(cudaGetLastError(), device, kernel, " launch");
}

}  // namespace loom::cuda
