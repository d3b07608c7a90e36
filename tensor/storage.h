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

// Note [Released storage]
// FullyShardedDataParallel frees a unit's gathered parameters between their uses while tensors
// still point at them (the parameters themselves, and the aliases autograd saved for backward):
// release_storage frees the memory and leaves the storage empty (data null, nbytes kept), and
// restore_storage gives it fresh memory of the same size (its contents undefined until
// written). Every tensor of the storage sees the change; none is bumped in version (the caller
// writes back the same values). Reading a released storage's data raises ValueError.
void release_storage(StorageImpl& storage);
void restore_storage(StorageImpl& storage);
inline bool is_released(const StorageImpl& storage) {
  return storage.data == nullptr && storage.nbytes > 0;
}

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
