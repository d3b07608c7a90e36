// tensor/cuda/check.h — how every CUDA runtime call in loom is checked (CUDA sources only: it
// includes cuda_runtime.h). A failure becomes DeviceError naming the call, CUDA's error string
// and the device: "cudaMalloc(1073741824 bytes) failed on cuda:0: out of memory".
#pragma once

#include <cuda_runtime.h>

#include "tensor/error.h"

namespace loom::cuda {

// check_cuda(cudaMalloc(&p, n), device, "cudaMalloc(", n, " bytes)"): the trailing arguments
// describe the call; device < 0 for calls that belong to no device (pinned host memory).
template <typename... Call>
void check_cuda(cudaError_t status, int device, const Call&... call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear the error so that later calls do not report it again
  if (device >= 0)
    throw DeviceError(
        ::loom::detail::str(call..., " failed on cuda:", device, ": ", cudaGetErrorString(status)));
  throw DeviceError(::loom::detail::str(call..., " failed: ", cudaGetErrorString(status)));
}

}  // namespace loom::cuda

// LOOM_CUDA_CHECK(cudaStreamSynchronize(s), device): names the call by its source text.
#define LOOM_CUDA_CHECK(call, device) ::loom::cuda::check_cuda((call), (device), #call)
