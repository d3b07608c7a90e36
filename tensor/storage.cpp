// tensor/storage.cpp — allocation with per-device accounting. CPU memory is 64-byte aligned
// (a cache line, and the widest vector load), so kernels may use aligned loads on fresh tensors;
// large CPU blocks are cached (Note [Host block cache] in tensor/cpu/host_cache.h). CUDA memory
// comes from the CUDA backend's caching allocator (tensor/caching_allocator.h), for the current
// stream of the device.

#include "tensor/storage.h"

#include <mutex>
#include <new>
#include <unordered_map>

#include "tensor/cpu/host_cache.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace loom {

namespace {

struct Accounting {
  std::mutex mutex;
  std::unordered_map<int, MemoryStats> per_device;  // key: -1 for the CPU, else the CUDA ordinal

  static int key(Device d) { return d.is_cpu() ? -1 : d.index; }
  void add(Device d, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    MemoryStats& s = per_device[key(d)];
    s.current_bytes += bytes;
    s.peak_bytes = std::max(s.peak_bytes, s.current_bytes);
  }
};

Accounting& accounting() {
  static Accounting* a = new Accounting();  // never destroyed: storages may outlive statics
  return *a;
}

}  // namespace

Storage allocate_storage(size_t nbytes, Device device) {
  const int64_t accounted = static_cast<int64_t>(nbytes);
  if (device.is_cpu()) {
    void* data = cpu::host_allocate(nbytes);
    LOOM_CHECK(data != nullptr, Error, "allocate: out of memory asking for ", nbytes,
               " bytes on the CPU");
    accounting().add(device, accounted);
    return std::make_shared<StorageImpl>(data, nbytes, device, [device, nbytes](void* p) {
      cpu::host_free(p, nbytes);
      accounting().add(device, -static_cast<int64_t>(nbytes));
    });
  }
  const CudaBackend* loaded = cuda_backend_if_available();
  LOOM_CHECK(loaded != nullptr, DeviceError, "allocate: ", device,
             " is not available: ", cuda_backend_unavailable_reason());
  const CudaBackend& backend = *loaded;
  const int visible = backend.device_count();
  LOOM_CHECK(device.index >= 0 && device.index < visible, DeviceError, "allocate: ", device,
             " is not available (", visible, " CUDA devices visible)");
  void* data = nbytes ? backend.allocate(nbytes, device.index) : nullptr;
  accounting().add(device, accounted);
  return std::make_shared<StorageImpl>(data, nbytes, device,
                                       [&backend, device, accounted](void* p) {
                                         if (p) backend.deallocate(p, device.index);
                                         accounting().add(device, -accounted);
                                       });
}

void release_storage(StorageImpl& storage) {
  LOOM_CHECK(static_cast<bool>(storage.deleter) || storage.data == nullptr, ValueError,
             "release_storage: the memory is not loom's (from_blob)");
  if (storage.data == nullptr) return;
  storage.deleter(storage.data);  // also takes the bytes out of the accounting
  storage.data = nullptr;
  storage.deleter = nullptr;
}

void restore_storage(StorageImpl& storage) {
  if (storage.data != nullptr || storage.nbytes == 0) return;
  Storage fresh = allocate_storage(storage.nbytes, storage.device);
  storage.data = fresh->data;
  storage.deleter = std::move(fresh->deleter);
  fresh->data = nullptr;
  fresh->deleter = nullptr;
}

MemoryStats memory_stats(Device device) {
  Accounting& a = accounting();
  MemoryStats s;
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    s = a.per_device[Accounting::key(device)];
  }
  if (device.is_cpu()) s.cached_bytes = cpu::host_cache_stats().cached_bytes;
  if (device.is_cuda()) {
    if (const CudaBackend* backend = cuda_backend_if_loaded())
      s.cached_bytes = backend->cached_bytes(device.index);
  }
  return s;
}

void reset_peak_memory(Device device) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mutex);
  MemoryStats& s = a.per_device[Accounting::key(device)];
  s.peak_bytes = s.current_bytes;
  if (device.is_cuda()) {
    if (const CudaBackend* backend = cuda_backend_if_loaded())
      backend->reset_peak_allocator_stats(device.index);
  }
}

}  // namespace loom
