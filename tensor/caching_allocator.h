// tensor/caching_allocator.h — the bookkeeping of loom's caching, stream-aware device
// allocator, written as plain C++ over two raw callbacks (allocate, free) so that it runs, and is
// tested, on the CPU with a fake backend. runtime.cu plugs cudaMalloc/cudaFree into it.
//
// Note [Caching allocator]
// cudaMalloc and cudaFree are slow and cudaFree synchronises the whole device, so loom keeps
// freed device memory and hands it out again:
// - Sizes are rounded up to kMinBlockSize (512 B). Requests up to kSmallSize (1 MiB) are carved
//   from 2 MiB segments (kSmallSegment); larger ones get a segment rounded up to 2 MiB
//   (kLargeRounding), so that a slightly different size still fits a cached segment.
// - A segment belongs to the stream that was current when it was reserved. A freed block goes
//   back to the free list of its (device, stream) and is reused only by that stream: work on one
//   stream runs in order, so the next kernel that gets the block runs after every kernel that
//   used it — no event, no host synchronisation. (A block used by a second stream must be
//   ordered by the caller, e.g. with an Event, before it is freed.)
// - A free block larger than the request is split; the remainder stays cached. Adjacent free
//   blocks of one segment merge again when freed.
// - Memory goes back to the driver only under pressure (a raw allocation fails: every wholly
//   free segment of that device is released, then the allocation is retried once) or on
//   empty_cache(). A second failure raises DeviceError naming the call, the size and the device.
// - A device with a cap (RawAllocator::limit; Note [Device memory cap] in memory_limit.h) is
//   treated as a device that size: a segment that would take the reserved bytes above the cap
//   is a raw allocation that failed (the cache goes back, then the check is made again), and a
//   second refusal raises OutOfMemoryError. The cap is asked for only when a segment is about
//   to be reserved, never on a cache hit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::cuda {

// A stream as the allocator sees it: an opaque id (the cudaStream_t's value; 0 is the default
// stream).
using StreamId = uintptr_t;

// Per-device figures, in bytes unless named otherwise.
struct AllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  int64_t peak_allocated_bytes = 0;  // the most ever allocated since the last reset_peak
  int64_t requested_bytes = 0;       // what callers asked for (unrounded)
  int64_t reserved_bytes = 0;        // obtained from the driver: allocated + cached
  int64_t peak_reserved_bytes = 0;
  int64_t cached_bytes = 0;           // reserved but not allocated: free blocks kept for reuse
  int64_t num_allocs = 0;             // calls to allocate
  int64_t num_cache_hits = 0;         // allocations served without a raw allocation
  int64_t num_raw_allocs = 0;         // segments obtained from the driver
  int64_t num_raw_frees = 0;          // segments given back
  int64_t num_pressure_releases = 0;  // times a failed raw allocation emptied the cache
};

// The raw allocation interface. `allocate` returns nullptr when the device is out of memory
// (any other failure it raises itself); `free` must not throw. `call_name` names the raw call in
// the out-of-memory message ("cudaMalloc"). `limit`, where given, is the device's cap on the
// bytes reserved (0: none); it is called with the allocator's lock held, so it must not call
// back into the allocator.
struct RawAllocator {
  std::function<void*(size_t nbytes, int device)> allocate;
  std::function<void(void* ptr, int device)> free;
  std::string call_name = "raw allocate";
  std::function<int64_t(int device)> limit = {};
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlockSize = 512;       // every size is a multiple of this
  static constexpr size_t kSmallSize = 1 << 20;      // requests up to 1 MiB are "small"
  static constexpr size_t kSmallSegment = 2 << 20;   // small requests share 2 MiB segments
  static constexpr size_t kLargeRounding = 2 << 20;  // large segments: multiples of 2 MiB

  explicit CachingAllocator(RawAllocator raw);
  ~CachingAllocator();  // releases the cached segments; blocks still in use are leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes (nbytes == 0 gives nullptr) for use on `stream` of `device`.
  // Raises DeviceError when the device cannot provide it even after releasing the cache, and
  // OutOfMemoryError when the device's cap refuses it (then nothing changed but the cache).
  void* allocate(size_t nbytes, int device, StreamId stream);
  // Returns a block to its stream's free list. Unknown pointers raise InternalError.
  void free(void* ptr);
  // Gives every wholly free segment back to the driver (all devices).
  void empty_cache();

  AllocatorStats stats(int device) const;
  void reset_peak(int device);
  // The size of the block behind ptr (rounded), or 0 if ptr is not a live block.
  size_t block_size(const void* ptr) const;

  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeList = std::set<Block*, BlockOrder>;  // ordered by (stream, size, address)
  struct DeviceState {
    FreeList small_free, large_free;
    AllocatorStats stats;
  };

  DeviceState& state(int device);
  FreeList& pool_of(DeviceState& s, const Block* b);
  Block* find_free(DeviceState& s, size_t size, int device, StreamId stream, bool small);
  void release_free_segments(int device, DeviceState& s);  // lock held
  void merge_into(Block* dst, Block* src, FreeList& pool);

  RawAllocator raw_;
  mutable std::mutex mutex_;
  std::unordered_map<int, DeviceState> devices_;
  std::unordered_map<const void*, Block*> live_;  // allocated blocks by address
};

}  // namespace loom::cuda
