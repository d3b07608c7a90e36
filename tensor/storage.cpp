// tensor/storage.cpp — allocation with per-device accounting. CPU memory is 64-byte aligned
// (a cache line, and the widest vector load), so kernels may use aligned loads on fresh tensors;
// large CPU blocks are cached (Note [Host block cache] in tensor/cpu/host_cache.h). CUDA memory
// comes from the CUDA backend's caching allocator (tensor/caching_allocator.h), for the current
// stream of the device. A device's cap is checked here, where its bytes are counted (Note
// [Device memory cap] in tensor/memory_limit.h).

#include "tensor/storage.h"

#include <mutex>
#include <new>
#include <unordered_map>

#include "tensor/cpu/host_cache.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/memory_limit.h"

namespace loom {

namespace {

// A device's count and its cap (Note [Device memory cap] in memory_limit.h).
struct DeviceAccount {
  MemoryStats stats;  // cached_bytes is the allocator's: memory_stats asks it
  int64_t cap = 0;    // 0: none
  std::string cap_source;
};

struct Accounting {
  std::mutex mutex;
  std::unordered_map<int, DeviceAccount> per_device;  // key: -1 for the CPU, else the CUDA ordinal

  static int key(Device d) { return d.is_cpu() ? -1 : d.index; }
  // The device's account, made at its first use with LOOM_MAX_MEMORY's cap (ValueError for a
  // bad value, each time until it is fixed). Lock held.
  DeviceAccount& account(Device d) {
    auto it = per_device.find(key(d));
    if (it == per_device.end()) {
      DeviceAccount fresh;
      fresh.cap = environment_cap();
      fresh.cap_source = kMaxMemoryVariable;
      it = per_device.emplace(key(d), std::move(fresh)).first;
    }
    return it->second;
  }
  static int64_t environment_cap() {
    static const int64_t cap = memory_limit_from_environment();  // read once per process
    return cap;
  }

  // Takes `bytes` into the device's count, unless that would pass its cap: then the count is
  // left as it was, `refused` says why and the answer is false.
  bool take(Device d, int64_t bytes, detail::OutOfMemoryFacts* refused) {
    std::lock_guard<std::mutex> lock(mutex);
    DeviceAccount& a = account(d);
    MemoryStats& s = a.stats;
    if (a.cap > 0 && bytes > 0 && s.current_bytes + bytes > a.cap) {
      refused->held = s.current_bytes;
      refused->peak = s.peak_bytes;
      refused->cap = a.cap;
      refused->cap_source = a.cap_source;
      return false;
    }
    s.current_bytes += bytes;
    s.peak_bytes = std::max(s.peak_bytes, s.current_bytes);
    return true;
  }
  void give_back(Device d, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    per_device[key(d)].stats.current_bytes -= bytes;
  }
  // The facts of a refusal that was not the count's (the device ran out, or the CUDA
  // allocator's own cap).
  void fill(Device d, detail::OutOfMemoryFacts* facts) {
    std::lock_guard<std::mutex> lock(mutex);
    const DeviceAccount& a = account(d);
    facts->held = a.stats.current_bytes;
    facts->peak = a.stats.peak_bytes;
    facts->cap = a.cap;
    facts->cap_source = a.cap_source;
  }
};

Accounting& accounting() {
  static Accounting* a = new Accounting();  // never destroyed: storages may outlive statics
  return *a;
}

// The dtype and shape of the tensor an allocation is for, where known.
struct TensorRequest {
  DType dtype;
  std::span<const int64_t> shape;
};

[[noreturn]] void throw_out_of_memory(detail::OutOfMemoryFacts facts, Device device, size_t nbytes,
                                      const TensorRequest* tensor) {
  facts.device = device;
  facts.requested = static_cast<int64_t>(nbytes);
  if (tensor) {
    facts.dtype = tensor->dtype;
    facts.shape.assign(tensor->shape.begin(), tensor->shape.end());
  }
  throw OutOfMemoryError(detail::out_of_memory_message(facts));
}

Storage allocate(size_t nbytes, Device device, const TensorRequest* tensor) {
  const int64_t accounted = static_cast<int64_t>(nbytes);
  const CudaBackend* backend = nullptr;
  if (device.is_cuda()) {
    backend = cuda_backend_if_available();
    LOOM_CHECK(backend != nullptr, DeviceError, "allocate: ", device,
               " is not available: ", cuda_backend_unavailable_reason());
    const int visible = backend->device_count();
    LOOM_CHECK(device.index >= 0 && device.index < visible, DeviceError, "allocate: ", device,
               " is not available (", visible, " CUDA devices visible)");
  }
  // The bytes enter the count first, so that the cap holds for threads allocating at once.
  detail::OutOfMemoryFacts refused;
  if (!accounting().take(device, accounted, &refused))
    throw_out_of_memory(std::move(refused), device, nbytes, tensor);

  if (device.is_cpu()) {
    void* data = cpu::host_allocate(nbytes);
    if (data == nullptr) {
      accounting().give_back(device, accounted);
      detail::OutOfMemoryFacts facts;
      accounting().fill(device, &facts);
      facts.cap = 0;  // not the cap's refusal
      throw_out_of_memory(std::move(facts), device, nbytes, tensor);
    }
    return std::make_shared<StorageImpl>(data, nbytes, device, [device, nbytes](void* p) {
      cpu::host_free(p, nbytes);
      accounting().give_back(device, static_cast<int64_t>(nbytes));
    });
  }
  void* data = nullptr;
  try {
    data = nbytes ? backend->allocate(nbytes, device.index) : nullptr;
  } catch (const OutOfMemoryError& e) {  // the caching allocator's cap
    accounting().give_back(device, accounted);
    detail::OutOfMemoryFacts facts;
    accounting().fill(device, &facts);
    facts.allocator_reason = e.what();
    throw_out_of_memory(std::move(facts), device, nbytes, tensor);
  } catch (...) {
    accounting().give_back(device, accounted);
    throw;
  }
  return std::make_shared<StorageImpl>(data, nbytes, device, [backend, device, accounted](void* p) {
    if (p) backend->deallocate(p, device.index);
    accounting().give_back(device, accounted);
  });
}

}  // namespace

Storage allocate_storage(size_t nbytes, Device device) { return allocate(nbytes, device, nullptr); }

Storage allocate_storage(size_t nbytes, Device device, DType dtype,
                         std::span<const int64_t> shape) {
  const TensorRequest tensor{dtype, shape};
  return allocate(nbytes, device, &tensor);
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
    const auto it = a.per_device.find(Accounting::key(device));
    if (it != a.per_device.end()) s = it->second.stats;
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
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    const auto it = a.per_device.find(Accounting::key(device));
    if (it != a.per_device.end()) it->second.stats.peak_bytes = it->second.stats.current_bytes;
  }
  // Outside the lock: the caching allocator, holding its own, asks memory_limit for the cap.
  if (device.is_cuda()) {
    if (const CudaBackend* backend = cuda_backend_if_loaded())
      backend->reset_peak_allocator_stats(device.index);
  }
}

void set_memory_limit(Device device, int64_t bytes, std::string source) {
  LOOM_CHECK(bytes >= 0, ValueError, "set_memory_limit: the cap of ", device,
             " cannot be negative; got ", bytes, " bytes (0 removes the cap)");
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mutex);
  auto [it, fresh] = a.per_device.try_emplace(Accounting::key(device));
  it->second.cap = bytes;
  it->second.cap_source = std::move(source);
}

int64_t memory_limit(Device device) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.account(device).cap;
}

}  // namespace loom
