// Tests of the CPU block cache (Note [Host block cache] in tensor/cpu/host_cache.h).

#include "tensor/cpu/host_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "loom.h"

namespace loom {
namespace {

using cpu::host_allocate;
using cpu::host_cache_stats;
using cpu::host_free;

// Each test starts from an empty cache with a known limit (sanitizer builds start with the
// cache off), and leaves the default behind.
class HostCache : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_limit_ = static_cast<size_t>(host_cache_stats().limit_bytes);
    cpu::set_host_cache_limit(size_t{64} << 20);
    cpu::empty_host_cache();
  }
  void TearDown() override {
    cpu::empty_host_cache();
    cpu::set_host_cache_limit(saved_limit_);
  }
  size_t saved_limit_ = 0;
};

TEST_F(HostCache, ReusesAFreedLargeBlockOfTheSameRoundedSize) {
  const size_t size = (size_t{1} << 20) + 1;
  void* p = host_allocate(size);
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, size);
  host_free(p, size);
  EXPECT_EQ(host_cache_stats().cached_bytes, int64_t{(1 << 20) + (64 << 10)});
  const int64_t hits = host_cache_stats().hits;
  void* q = host_allocate(size + 1000);  // the same 64 KiB class
  EXPECT_EQ(q, p);
  EXPECT_EQ(host_cache_stats().hits, hits + 1);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
  void* r = host_allocate(size + (size_t{64} << 10));  // the next class: a new block
  EXPECT_NE(r, p);
  host_free(q, size + 1000);
  host_free(r, size + (size_t{64} << 10));
}

TEST_F(HostCache, SmallBlocksGoStraightBackAndEveryBlockIsAligned) {
  for (size_t size : {size_t{1}, size_t{100}, size_t{4096}, size_t{300} << 10}) {
    void* p = host_allocate(size);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % cpu::kHostAlignment, 0u) << size;
    host_free(p, size);
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, int64_t{320} << 10);  // only the 300 KiB block
}

TEST_F(HostCache, KeepsNoMoreThanTheLimit) {
  cpu::set_host_cache_limit(size_t{1} << 20);
  const size_t size = size_t{768} << 10;
  void* a = host_allocate(size);
  void* b = host_allocate(size);
  host_free(a, size);
  host_free(b, size);  // 1.5 MiB would exceed the limit: b goes back to the system
  EXPECT_EQ(host_cache_stats().cached_bytes, int64_t{768} << 10);
  cpu::set_host_cache_limit(size_t{512} << 10);  // lowering the limit releases what is over it
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
  cpu::set_host_cache_limit(0);  // off: nothing is kept
  void* c = host_allocate(size);
  host_free(c, size);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

TEST_F(HostCache, EmptyGivesEverythingBack) {
  void* a = host_allocate(size_t{1} << 20);
  void* b = host_allocate(size_t{2} << 20);
  host_free(a, size_t{1} << 20);
  host_free(b, size_t{2} << 20);
  EXPECT_EQ(host_cache_stats().cached_bytes, int64_t{3} << 20);
  cpu::empty_host_cache();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

TEST_F(HostCache, TensorsReuseTheMemoryOfFreedTensors) {
  const Device cpu_device = kCPU;
  const int64_t before = memory_stats(cpu_device).current_bytes;
  Tensor t = empty({512, 512});
  const void* first = t.data();
  t = Tensor();
  EXPECT_EQ(memory_stats(cpu_device).current_bytes, before);  // accounting counts live tensors
  EXPECT_EQ(memory_stats(cpu_device).cached_bytes, int64_t{1} << 20);
  Tensor u = zeros({512, 512});
  EXPECT_EQ(u.data(), first);
  EXPECT_EQ(sum(u).item(), 0.0);  // a reused block is initialised like a fresh one
}

}  // namespace
}  // namespace loom
