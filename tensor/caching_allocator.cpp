// tensor/caching_allocator.cpp — the caching allocator's bookkeeping (Note [Caching
// allocator] in caching_allocator.h). Plain C++ with no CUDA in it: it is compiled into every
// build, so its tests run on machines without a GPU through a fake raw allocator.

#include "tensor/caching_allocator.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "tensor/error.h"
#include "tensor/memory_limit.h"

namespace loom::cuda {

// One contiguous range of a segment. The blocks of a segment form a doubly linked list in
// address order; a segment wholly free is one block with no neighbours.
struct CachingAllocator::Block {
  int device = 0;
  StreamId stream = 0;
  size_t size = 0;       // rounded size of this block
  size_t requested = 0;  // what the caller asked for, while allocated
  char* ptr = nullptr;
  bool small = false;  // from the small pool (2 MiB segments) or the large one
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

CachingAllocator::CachingAllocator(RawAllocator raw) : raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [device, s] : devices_) release_free_segments(device, s);
  // What is left belongs to segments with live blocks: the memory is leaked with them, the
  // bookkeeping is not.
  std::vector<Block*> rest;
  for (auto& [device, s] : devices_) {
    rest.insert(rest.end(), s.small_free.begin(), s.small_free.end());
    rest.insert(rest.end(), s.large_free.begin(), s.large_free.end());
  }
  for (auto& [ptr, b] : live_) rest.push_back(b);
  for (Block* b : rest) delete b;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

CachingAllocator::DeviceState& CachingAllocator::state(int device) { return devices_[device]; }

CachingAllocator::FreeList& CachingAllocator::pool_of(DeviceState& s, const Block* b) {
  return b->small ? s.small_free : s.large_free;
}

// The smallest free block of this stream's pool that holds `size` bytes, taken off its list.
CachingAllocator::Block* CachingAllocator::find_free(DeviceState& s, size_t size, int device,
                                                     StreamId stream, bool small) {
  FreeList& pool = small ? s.small_free : s.large_free;
  Block key;
  key.device = device;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

void CachingAllocator::release_free_segments(int device, DeviceState& s) {
  for (FreeList* pool : {&s.small_free, &s.large_free}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment still in use
        ++it;
        continue;
      }
      raw_.free(b->ptr, device);
      s.stats.reserved_bytes -= static_cast<int64_t>(b->size);
      ++s.stats.num_raw_frees;
      it = pool->erase(it);
      delete b;
    }
  }
}

void* CachingAllocator::allocate(size_t nbytes, int device, StreamId stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceState& s = state(device);
  auto out_of_memory = [&](size_t raw_bytes) {
    return DeviceError(
        detail::str(raw_.call_name, "(", raw_bytes, " bytes) failed on cuda:", device,
                    ": out of memory (asked for ", nbytes, " bytes; ", s.stats.allocated_bytes,
                    " bytes allocated and ", s.stats.reserved_bytes - s.stats.allocated_bytes,
                    " bytes cached on the device)"));
  };
  // Sizes this large would overflow the rounding; no device has that much memory anyway.
  if (nbytes > std::numeric_limits<size_t>::max() / 4) throw out_of_memory(nbytes);

  ++s.stats.num_allocs;
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  Block* b = find_free(s, size, device, stream, small);
  if (b) {
    ++s.stats.num_cache_hits;
  } else {
    const size_t seg = segment_size(size);
    const int64_t cap = raw_.limit ? raw_.limit(device) : 0;
    const auto within_cap = [&] {
      return cap <= 0 || s.stats.reserved_bytes + static_cast<int64_t>(seg) <= cap;
    };
    void* ptr = within_cap() ? raw_.allocate(seg, device) : nullptr;
    if (!ptr) {  // under pressure: give the cache back to the driver and try once more
      release_free_segments(device, s);
      ++s.stats.num_pressure_releases;
      if (!within_cap()) {
        throw OutOfMemoryError(
            detail::str("the caching allocator of cuda:", device, " would reserve a segment of ",
                        format_bytes(static_cast<int64_t>(seg)), " beside the ",
                        format_bytes(s.stats.reserved_bytes), " it holds (",
                        format_bytes(s.stats.allocated_bytes),
                        " of them allocated; its cache given back), over the cap of ",
                        format_bytes(cap), " (", cap, " bytes)"));
      }
      ptr = raw_.allocate(seg, device);
      if (!ptr) throw out_of_memory(seg);
    }
    b = new Block;
    b->device = device;
    b->stream = stream;
    b->size = seg;
    b->ptr = static_cast<char*>(ptr);
    b->small = small;
    s.stats.reserved_bytes += static_cast<int64_t>(seg);
    s.stats.peak_reserved_bytes = std::max(s.stats.peak_reserved_bytes, s.stats.reserved_bytes);
    ++s.stats.num_raw_allocs;
  }

  // Split off what the request does not need, when the remainder is worth keeping: any
  // remainder of a small segment, only more than kSmallSize of a large one (the rest would
  // fragment the large pool into pieces no large request fits).
  const size_t remaining = b->size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    Block* rest = new Block;
    rest->device = device;
    rest->stream = stream;
    rest->size = remaining;
    rest->ptr = b->ptr + size;
    rest->small = small;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool_of(s, rest).insert(rest);
  }

  b->allocated = true;
  b->requested = nbytes;
  live_[b->ptr] = b;
  s.stats.allocated_bytes += static_cast<int64_t>(b->size);
  s.stats.requested_bytes += static_cast<int64_t>(nbytes);
  s.stats.peak_allocated_bytes = std::max(s.stats.peak_allocated_bytes, s.stats.allocated_bytes);
  return b->ptr;
}

// src (free, off its list) is folded into its neighbour dst; dst leaves its list to be
// re-inserted with its new size.
void CachingAllocator::merge_into(Block* dst, Block* src, FreeList& pool) {
  pool.erase(dst);
  if (src == dst->next) {
    dst->next = src->next;
    if (src->next) src->next->prev = dst;
  } else {  // src precedes dst
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (src->prev) src->prev->next = dst;
  }
  dst->size += src->size;
  delete src;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  LOOM_ASSERT(it != live_.end(), "CachingAllocator::free: pointer not allocated by it");
  Block* b = it->second;
  live_.erase(it);
  DeviceState& s = state(b->device);
  s.stats.allocated_bytes -= static_cast<int64_t>(b->size);
  s.stats.requested_bytes -= static_cast<int64_t>(b->requested);
  b->allocated = false;
  b->requested = 0;

  FreeList& pool = pool_of(s, b);
  if (b->prev && !b->prev->allocated) {
    Block* prev = b->prev;
    merge_into(prev, b, pool);  // prev leaves the list; b is deleted
    b = prev;
  }
  if (b->next && !b->next->allocated) {
    Block* next = b->next;
    pool.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  pool.insert(b);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [device, s] : devices_) release_free_segments(device, s);
}

AllocatorStats CachingAllocator::stats(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = devices_.find(device);
  if (it == devices_.end()) return {};
  AllocatorStats out = it->second.stats;
  out.cached_bytes = out.reserved_bytes - out.allocated_bytes;
  return out;
}

void CachingAllocator::reset_peak(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats& st = state(device).stats;
  st.peak_allocated_bytes = st.allocated_bytes;
  st.peak_reserved_bytes = st.reserved_bytes;
}

size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  return it == live_.end() ? 0 : it->second->size;
}

}  // namespace loom::cuda
