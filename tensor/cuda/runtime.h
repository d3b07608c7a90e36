// tensor/cuda/runtime.h — the few CUDA runtime services tensor/ needs: device count, memory,
// copies. A build without CUDA links tensor/cuda_stubs.cpp instead, whose functions raise
// DeviceError("loom was built without CUDA"), so CPU-only programs still link and fail clearly.
#pragma once

#include <cstddef>

namespace loom::cuda {

bool is_built();  // true when loom was compiled with LOOM_CUDA
int device_count();
void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, int device);
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);

}  // namespace loom::cuda
