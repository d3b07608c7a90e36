// tensor/cuda/runtime.cu — device count, allocation and copies through the CUDA runtime. Every
// call is checked; a failure becomes DeviceError naming the call, the error string and device.
// (The caching, stream-aware allocator of the CUDA issue replaces the plain cudaMalloc here.)

#include <cuda_runtime.h>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace loom::cuda {

namespace {
void check(cudaError_t status, const char* call, int device) {
  if (status != cudaSuccess)
    throw DeviceError(detail::str(call, " failed on cuda:", device, ": ",
                                  cudaGetErrorString(status)));
}
}  // namespace

bool is_built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;  // no driver or no device: zero GPUs
  return n;
}

void* allocate(size_t nbytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice", device);
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, nbytes), "cudaMalloc", device);
  return ptr;
}

void deallocate(void* ptr, int device) {
  // Called from destructors: report nothing, never throw.
  if (cudaSetDevice(device) == cudaSuccess) cudaFree(ptr);
}

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  check(cudaSetDevice(device), "cudaSetDevice", device);
  cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, nbytes, k), "cudaMemcpy", device);
}

}  // namespace loom::cuda
