// tensor/storage.h — the memory behind tensors, and the allocators that provide it.
// A Storage is one allocation; many tensors (views) may share it. It carries a version counter
// that every in-place write bumps, so autograd can tell when a tensor it saved was changed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "tensor/device.h"
#include "tensor/dtype.h"

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
// build without it, OutOfMemoryError over the device's cap (Note [Device memory cap] in
// tensor/memory_limit.h) or when the device has no more, with nothing allocated.
Storage allocate_storage(size_t nbytes, Device device);
// The same for a tensor of `dtype` and `shape`, which an OutOfMemoryError then names.
Storage allocate_storage(size_t nbytes, Device device, DType dtype, std::span<const int64_t> shape);

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

// The cap on current_bytes of a device (Note [Device memory cap] in tensor/memory_limit.h): an
// allocation that would take the count above it raises OutOfMemoryError. set_memory_limit
// overrides LOOM_MAX_MEMORY for the device; 0 removes the cap. `source` says in the error where
// the cap came from ("--max-memory"). ValueError for a negative size. memory_limit gives the cap
// in force: 0 for none.
void set_memory_limit(Device device, int64_t bytes, std::string source = "set_memory_limit");
int64_t memory_limit(Device device);

}  // namespace loom
