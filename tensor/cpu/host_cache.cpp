// tensor/cpu/host_cache.cpp — Note [Host block cache] in tensor/cpu/host_cache.h.

#include "tensor/cpu/host_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::cpu {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

size_t default_limit() {
  if (kSanitized) return 0;
  if (const char* mb = std::getenv("LOOM_CPU_CACHE_MB"); mb != nullptr && *mb != '\0') {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(mb, &end, 10);
    if (end != nullptr && *end == '\0') return static_cast<size_t>(value) << 20;
  }
  // A quarter of the machine's memory, and at least 1 GiB: a GPT-2 small training step (batch
  // 2, block 256) frees more than 1 GiB of activations and logits, and with a 1 GiB limit a
  // quarter of its time went to faulting the rest back in.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t quarter = pages > 0 && page > 0 ? static_cast<size_t>(pages) / 4 * page : 0;
  return std::max(size_t{1} << 30, quarter);
}

size_t rounded(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  const size_t granule = nbytes >= kMinCached ? kGranule : kHostAlignment;
  return (nbytes + granule - 1) / granule * granule;
}

class HostCache {
 public:
  void* allocate(size_t nbytes) {
    const size_t size = rounded(nbytes);
    if (size >= kMinCached) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++stats_.hits;
        return p;
      }
      ++stats_.misses;
    }
    void* p = std::aligned_alloc(kHostAlignment, size);
    if (p == nullptr) {
      release(0);
      p = std::aligned_alloc(kHostAlignment, size);
    }
    return p;
  }

  void free(void* ptr, size_t nbytes) {
    if (ptr == nullptr) return;
    const size_t size = rounded(nbytes);
    if (size >= kMinCached) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + size <= limit_) {
        free_[size].push_back(ptr);
        cached_ += size;
        return;
      }
    }
    std::free(ptr);
  }

  // Frees cached blocks until at most `keep` bytes remain.
  void release(size_t keep) {
    std::vector<void*> doomed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, blocks] : free_) {
        while (cached_ > keep && !blocks.empty()) {
          doomed.push_back(blocks.back());
          blocks.pop_back();
          cached_ -= size;
        }
      }
    }
    for (void* p : doomed) std::free(p);
  }

  void set_limit(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
    }
    release(bytes);
  }

  HostCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    HostCacheStats s = stats_;
    s.cached_bytes = static_cast<int64_t>(cached_);
    s.limit_bytes = static_cast<int64_t>(limit_);
    return s;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by rounded size
  size_t cached_ = 0;
  size_t limit_ = default_limit();
  HostCacheStats stats_;
};

HostCache& cache() {
  static HostCache* c = new HostCache();  // never destroyed: storages may outlive statics
  return *c;
}

}  // namespace

void* host_allocate(size_t nbytes) { return cache().allocate(nbytes); }
void host_free(void* ptr, size_t nbytes) { cache().free(ptr, nbytes); }
HostCacheStats host_cache_stats() { return cache().stats(); }
void empty_host_cache() { cache().release(0); }
void set_host_cache_limit(size_t bytes) { cache().set_limit(bytes); }

}  // namespace loom::cpu
