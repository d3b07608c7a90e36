// tests/tensor/caching_allocator_test.cpp — the caching device allocator's bookkeeping (Note
// [Caching allocator]) on the CPU: a fake raw allocator hands out addresses that are never
// touched, with a capacity, so reuse, streams, splitting, pressure and stats run without a GPU.

#include "tensor/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "test_util.h"

namespace loom::cuda {
namespace {

constexpr size_t kMiB = 1 << 20;

// A device of `capacity` bytes. Segments get addresses far apart, so no two are adjacent; as
// with CUDA's unified addressing, no two devices hand out the same address.
struct FakeDevice {
  size_t capacity = 0;
  size_t used = 0;
  uintptr_t next_address = 0;
  std::map<uintptr_t, size_t> live;  // address -> bytes
  int allocs = 0, frees = 0, refused = 0;
};

// The raw allocator over fake devices 0 and 1.
struct FakeBackend {
  std::map<int, FakeDevice> devices;

  explicit FakeBackend(size_t capacity) {
    for (int d : {0, 1}) {
      devices[d].capacity = capacity;
      devices[d].next_address = uintptr_t(d + 1) << 40;  // devices share one address space
    }
  }
  RawAllocator raw() {
    return RawAllocator{[this](size_t n, int d) { return allocate(n, d); },
                        [this](void* p, int d) { free(p, d); }, "fakeMalloc"};
  }
  void* allocate(size_t nbytes, int device) {
    FakeDevice& d = devices.at(device);
    if (d.used + nbytes > d.capacity) {
      ++d.refused;
      return nullptr;
    }
    uintptr_t address = d.next_address;
    d.next_address += nbytes + (1ull << 30);
    d.live[address] = nbytes;
    d.used += nbytes;
    ++d.allocs;
    return reinterpret_cast<void*>(address);
  }
  void free(void* ptr, int device) {
    FakeDevice& d = devices.at(device);
    auto it = d.live.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, d.live.end()) << "freed a pointer the fake device never gave out";
    d.used -= it->second;
    d.live.erase(it);
    ++d.frees;
  }
};

struct Fixture {
  FakeBackend backend;
  std::map<int, FakeDevice>& devices;
  CachingAllocator allocator;  // destroyed before the backend

  explicit Fixture(size_t capacity = 64 * kMiB)
      : backend(capacity), devices(backend.devices), allocator(backend.raw()) {}
};

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(CachingAllocator, RoundsSizesAndSegments) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB + 512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(4 * kMiB), 4 * kMiB);

  Fixture f;
  void* p = f.allocator.allocate(1000, 0, 0);
  EXPECT_EQ(f.allocator.block_size(p), 1024u);
  EXPECT_EQ(f.devices[0].live.begin()->second, 2 * kMiB);
  EXPECT_EQ(f.allocator.allocate(0, 0, 0), nullptr);
  f.allocator.free(p);
  f.allocator.free(nullptr);  // a no-op
}

TEST(CachingAllocator, FreedBlockIsReusedWithoutRawAllocation) {
  Fixture f;
  void* a = f.allocator.allocate(1000, 0, 0);
  f.allocator.free(a);
  void* b = f.allocator.allocate(900, 0, 0);
  EXPECT_EQ(a, b);
  EXPECT_EQ(f.devices[0].allocs, 1);
  EXPECT_EQ(f.devices[0].frees, 0);  // freeing keeps the memory
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_raw_allocs, 1);
  f.allocator.free(b);

  // Large blocks too: a 3 MiB segment-sized request comes back for a slightly smaller one.
  void* big = f.allocator.allocate(3 * kMiB + 100, 0, 0);
  f.allocator.free(big);
  EXPECT_EQ(f.allocator.allocate(3 * kMiB, 0, 0), big);
  EXPECT_EQ(f.devices[0].allocs, 2);
}

TEST(CachingAllocator, SmallBlocksShareASegment) {
  Fixture f;
  void* a = f.allocator.allocate(1000, 0, 0);
  void* b = f.allocator.allocate(1000, 0, 0);
  void* c = f.allocator.allocate(100, 0, 0);
  EXPECT_EQ(f.devices[0].allocs, 1);
  EXPECT_EQ(addr(b), addr(a) + 1024);
  EXPECT_EQ(addr(c), addr(b) + 1024);
  EXPECT_EQ(f.allocator.block_size(c), 512u);
  for (void* p : {a, b, c}) f.allocator.free(p);
}

TEST(CachingAllocator, StreamsKeepSeparateFreeLists) {
  Fixture f;
  const StreamId s1 = 0x1000, s2 = 0x2000;
  void* a = f.allocator.allocate(4096, 0, s1);
  f.allocator.free(a);
  void* b = f.allocator.allocate(4096, 0, s2);  // must not take s1's block
  EXPECT_NE(a, b);
  EXPECT_EQ(f.devices[0].allocs, 2);
  void* c = f.allocator.allocate(4096, 0, s1);  // s1 gets its own block back
  EXPECT_EQ(a, c);
  EXPECT_EQ(f.devices[0].allocs, 2);
  // Devices too: the same stream id on another device is another list.
  void* d = f.allocator.allocate(4096, 1, s1);
  EXPECT_EQ(f.devices[1].allocs, 1);
  for (void* p : {b, c, d}) f.allocator.free(p);
}

TEST(CachingAllocator, SplitsLargeBlocksAndMergesThemBack) {
  Fixture f;
  void* whole = f.allocator.allocate(8 * kMiB, 0, 0);
  f.allocator.free(whole);
  void* a = f.allocator.allocate(2 * kMiB, 0, 0);  // split off the cached 8 MiB
  void* b = f.allocator.allocate(2 * kMiB, 0, 0);
  EXPECT_EQ(a, whole);
  EXPECT_EQ(addr(b), addr(a) + 2 * kMiB);
  EXPECT_EQ(f.allocator.block_size(a), 2 * kMiB);
  EXPECT_EQ(f.devices[0].allocs, 1);
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.allocated_bytes, int64_t(4 * kMiB));
  EXPECT_EQ(s.cached_bytes, int64_t(4 * kMiB));
  f.allocator.free(a);
  f.allocator.free(b);  // merges with a before it and the 4 MiB after it
  EXPECT_EQ(f.allocator.allocate(8 * kMiB, 0, 0), whole);
  EXPECT_EQ(f.devices[0].allocs, 1);
  f.allocator.free(whole);

  // A remainder of at most 1 MiB is not split off a large block: it stays with the block.
  f.allocator.empty_cache();
  void* c = f.allocator.allocate(3 * kMiB, 0, 0);  // 4 MiB segment, 1 MiB spare
  EXPECT_EQ(f.allocator.block_size(c), 4 * kMiB);
  f.allocator.free(c);
}

TEST(CachingAllocator, FreedNeighboursMergeInAnyOrder) {
  Fixture f;
  void* a = f.allocator.allocate(1000, 0, 0);
  void* b = f.allocator.allocate(1000, 0, 0);
  void* c = f.allocator.allocate(1000, 0, 0);
  f.allocator.free(a);
  f.allocator.free(c);
  f.allocator.empty_cache();  // the segment is still in use by b: nothing goes back
  EXPECT_EQ(f.devices[0].frees, 0);
  f.allocator.free(b);  // merges with both neighbours: the segment is one free block again
  f.allocator.empty_cache();
  EXPECT_EQ(f.devices[0].frees, 1);
  EXPECT_TRUE(f.devices[0].live.empty());
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.num_raw_frees, 1);
}

TEST(CachingAllocator, ReleasesTheCacheUnderPressureAndRetries) {
  Fixture f(/*capacity=*/8 * kMiB);
  void* a = f.allocator.allocate(6 * kMiB, 0, /*stream=*/1);
  f.allocator.free(a);  // 6 MiB cached for stream 1
  // Stream 2 cannot reuse it, and the device has only 2 MiB left: the cache is released.
  void* b = f.allocator.allocate(4 * kMiB, 0, /*stream=*/2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(f.devices[0].refused, 1);
  EXPECT_EQ(f.devices[0].frees, 1);
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.num_pressure_releases, 1);
  EXPECT_EQ(s.reserved_bytes, int64_t(4 * kMiB));
  EXPECT_EQ(s.cached_bytes, 0);
  f.allocator.free(b);
}

TEST(CachingAllocator, OutOfMemoryNamesCallSizeAndDevice) {
  Fixture f(/*capacity=*/8 * kMiB);
  void* held = f.allocator.allocate(4 * kMiB, 0, 0);
  EXPECT_LOOM_ERROR(
      f.allocator.allocate(16 * kMiB, 0, 0), DeviceError,
      {"fakeMalloc(16777216 bytes) failed on cuda:0: out of memory", "4194304 bytes allocated"});
  EXPECT_EQ(f.devices[0].refused, 2);  // tried, released the (empty) cache, tried again
  EXPECT_LOOM_ERROR(f.allocator.allocate(std::numeric_limits<size_t>::max(), 1, 0), DeviceError,
                    {"failed on cuda:1: out of memory"});
  EXPECT_EQ(f.allocator.stats(0).allocated_bytes, int64_t(4 * kMiB));  // nothing leaked
  f.allocator.free(held);
}

TEST(CachingAllocator, StatsCurrentPeakCachedPerDevice) {
  Fixture f;
  void* a = f.allocator.allocate(1000, 0, 0);
  void* b = f.allocator.allocate(3 * kMiB, 0, 0);
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.requested_bytes, int64_t(1000 + 3 * kMiB));
  EXPECT_EQ(s.allocated_bytes, int64_t(1024 + 4 * kMiB));
  EXPECT_EQ(s.reserved_bytes, int64_t(2 * kMiB + 4 * kMiB));
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.allocated_bytes);
  f.allocator.free(b);
  s = f.allocator.stats(0);
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.peak_allocated_bytes, int64_t(1024 + 4 * kMiB));
  EXPECT_EQ(s.cached_bytes, int64_t(6 * kMiB - 1024));
  f.allocator.reset_peak(0);
  s = f.allocator.stats(0);
  EXPECT_EQ(s.peak_allocated_bytes, 1024);
  EXPECT_EQ(s.peak_reserved_bytes, int64_t(6 * kMiB));
  EXPECT_EQ(f.allocator.stats(1).allocated_bytes, 0);  // device 1 untouched
  EXPECT_EQ(f.allocator.stats(7).reserved_bytes, 0);   // a device never used
  f.allocator.free(a);
}

TEST(CachingAllocator, UnknownPointerIsAnInternalError) {
  Fixture f;
  int x = 0;
  EXPECT_THROW(f.allocator.free(&x), InternalError);
}

TEST(CachingAllocator, DestructorReturnsCachedSegments) {
  FakeBackend backend(64 * kMiB);
  {
    CachingAllocator allocator(backend.raw());
    for (int i = 0; i < 3; ++i)
      allocator.free(allocator.allocate(size_t(i + 1) * 3 * kMiB, 0, StreamId(i)));
    EXPECT_EQ(backend.devices[0].live.size(), 3u);
  }
  EXPECT_TRUE(backend.devices[0].live.empty());
  EXPECT_EQ(backend.devices[0].frees, 3);
}

TEST(CachingAllocator, ThreadsOnSeparateStreams) {
  Fixture f(/*capacity=*/1ull << 40);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, t] {
      std::vector<void*> held;
      for (int i = 0; i < 200; ++i) {
        held.push_back(f.allocator.allocate(size_t(1 + (i * 7919) % 3000000), 0, StreamId(t)));
        if (i % 3 == 2) {
          f.allocator.free(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) f.allocator.free(p);
    });
  }
  for (auto& th : threads) th.join();
  AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.requested_bytes, 0);
  EXPECT_EQ(s.num_allocs, 800);
  EXPECT_GT(s.num_cache_hits, 0);
  f.allocator.empty_cache();
  EXPECT_EQ(f.allocator.stats(0).reserved_bytes, 0);
  EXPECT_TRUE(f.devices[0].live.empty());
}

}  // namespace
}  // namespace loom::cuda
