// tensor/storage.h — the memory behind tensors, and the allocators that provide it.
// A Storage is one allocation; many tensors (views) may share it. It carries a version counter
// that every in-place write bumps, so autograd can tell when a tensor it saved was changed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tensor/device.h"

namespace loom {

struct StorageImpl {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::function<void(void*)> deleter;  // empty for memory loom does not own (from_blob)
  std::atomic<uint64_t> version{0};

  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
      : data(data), nbytes(nbytes), device(device), deleter(std::move(deleter)) {}
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (deleter) deleter(data);
  }
};

using Storage = std::shared_ptr<StorageImpl>;

// Allocates nbytes on a device: 64-byte aligned on the CPU. Raises DeviceError for CUDA in a
// build without it.
Storage allocate_storage(size_t nbytes, Device device);

// Bytes currently held by loom's tensors on a device, and the most ever held since the last
// reset; estimates of memory use are checked against these.
// cached_bytes is what the allocator keeps for reuse beyond what tensors hold: freed large CPU
// blocks (cpu::host_cache_stats), or the CUDA caching allocator's free blocks
// (cuda::allocator_stats has the full picture).
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t cached_bytes = 0;
};
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);

}  // namespace loom
