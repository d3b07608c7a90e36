// tensor/cpu/host_cache.h — where CPU tensors get their memory: 64-byte aligned blocks, the
// large ones kept when freed and handed out again.
//
// Note [Host block cache]
// glibc serves a request above its mmap threshold (128 KiB, rising to at most 32 MiB as mapped
// blocks are freed) with a fresh mapping and unmaps it on free, so the next tensor of that size
// faults in every 4 KiB page and has the kernel zero it. A 1024 x 1024 float32 matmul took 1024
// page faults per call for its output, 10% of its time; a training step, which allocates the
// same activations every time, pays the same on each of them. loom therefore keeps freed blocks
// of kMinCached (256 KiB) and more:
// - sizes are rounded up to a multiple of kGranule (64 KiB); a request takes a free block of
//   exactly its rounded size, else a new one;
// - at most the limit is kept (by default a quarter of physical memory, at least 1 GiB: a
//   training step's activations are freed in backward and allocated again in the next forward,
//   and all of them have to fit; the environment variable LOOM_CPU_CACHE_MB sets it, 0 turns
//   the cache off); a block freed beyond it goes back to the system;
// - a failed allocation empties the cache and tries once more; empty_host_cache() gives every
//   cached block back;
// - builds with AddressSanitizer do not cache, so a use after free stays visible.
// Smaller blocks go straight to malloc, which keeps them in its own arenas.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::cpu {

inline constexpr size_t kHostAlignment = 64;
inline constexpr size_t kMinCached = size_t{256} << 10;
inline constexpr size_t kGranule = size_t{64} << 10;

// nbytes (at least 1 byte's worth) of 64-byte aligned memory; nullptr when the system has none
// even after the cache was emptied. host_free must get the same nbytes.
void* host_allocate(size_t nbytes);
void host_free(void* ptr, size_t nbytes);

struct HostCacheStats {
  int64_t cached_bytes = 0;  // free blocks kept for reuse
  int64_t limit_bytes = 0;
  int64_t hits = 0;    // large allocations served from the cache
  int64_t misses = 0;  // large allocations that went to the system
};
HostCacheStats host_cache_stats();
void empty_host_cache();
// Changes the limit (and gives back what is over it).
void set_host_cache_limit(size_t bytes);

}  // namespace loom::cpu
