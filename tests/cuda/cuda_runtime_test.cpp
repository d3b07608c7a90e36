// tests/cuda/cuda_runtime_test.cpp — the CUDA device layer on a real GPU: the caching allocator
// behind Storage, streams and events, pinned memory and asynchronous copies, the device guard,
// and the error a failing CUDA call raises. Every test skips without CUDA or without a GPU.

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/runtime.h"
#include "tensor/storage.h"

namespace loom::cuda {
namespace {

using test::kCuda0;

TEST(CudaAllocator, StorageReusesFreedBlocks) {
  LOOM_SKIP_WITHOUT_GPU();
  const size_t nbytes = 3 << 20;
  const AllocatorStats before = allocator_stats(0);
  const int64_t tensors_before = memory_stats(kCuda0).current_bytes;
  void* first = nullptr;
  {
    Storage s = allocate_storage(nbytes, kCuda0);
    first = s->data;
    EXPECT_EQ(memory_stats(kCuda0).current_bytes, tensors_before + int64_t(nbytes));
  }
  EXPECT_EQ(memory_stats(kCuda0).current_bytes, tensors_before);
  EXPECT_GE(memory_stats(kCuda0).cached_bytes, int64_t(nbytes));  // kept, not cudaFree'd
  {
    Storage s = allocate_storage(nbytes - 1000, kCuda0);
    EXPECT_EQ(s->data, first);  // same stream, fits: the cached block comes back
  }
  const AllocatorStats after = allocator_stats(0);
  EXPECT_EQ(after.num_allocs - before.num_allocs, 2);
  EXPECT_GE(after.num_cache_hits - before.num_cache_hits, 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + int64_t(nbytes));

  reset_peak_memory(kCuda0);
  EXPECT_EQ(allocator_stats(0).peak_allocated_bytes, allocator_stats(0).allocated_bytes);
  empty_cache();
  EXPECT_EQ(allocator_stats(0).cached_bytes, 0);  // every segment here was wholly free
}

TEST(CudaAllocator, StreamsDoNotShareCachedBlocks) {
  LOOM_SKIP_WITHOUT_GPU();
  Stream s1 = Stream::create(0), s2 = Stream::create(0);
  void* a = nullptr;
  {
    StreamGuard guard(s1);
    a = allocate(1 << 20, 0);
    deallocate(a, 0);
  }
  {
    StreamGuard guard(s2);
    void* b = allocate(1 << 20, 0);
    EXPECT_NE(a, b);
    deallocate(b, 0);
  }
  {
    StreamGuard guard(s1);
    void* c = allocate(1 << 20, 0);
    EXPECT_EQ(a, c);
    deallocate(c, 0);
  }
}

TEST(CudaAllocator, FailingCudaMallocNamesCallErrorAndDevice) {
  LOOM_SKIP_WITHOUT_GPU();
  const size_t absurd = size_t(1) << 50;  // 1 PiB
  EXPECT_LOOM_ERROR(allocate(absurd, 0), DeviceError,
                    {"cudaMalloc(1125899906842624 bytes) failed on cuda:0: out of memory"});
  EXPECT_LOOM_ERROR(allocate_storage(absurd, kCuda0), DeviceError,
                    {"cudaMalloc(", "failed on cuda:0", "out of memory"});
  void* p = allocate(1024, 0);  // the failure left the allocator and the device usable
  EXPECT_NE(p, nullptr);
  deallocate(p, 0);
  EXPECT_LOOM_ERROR(allocate(16, device_count()), DeviceError, {"is not available"});
}

TEST(CudaStream, CurrentStreamDefaultsAndGuard) {
  LOOM_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(Stream::current(0).is_default());
  Stream s = Stream::create(0);
  EXPECT_FALSE(s.is_default());
  EXPECT_EQ(s.device(), 0);
  {
    StreamGuard guard(s);
    EXPECT_EQ(Stream::current(0), s);
  }
  EXPECT_TRUE(Stream::current(0).is_default());
  s.synchronize();
  EXPECT_TRUE(s.query());
}

TEST(CudaStream, AsyncCopyRoundTripThroughPinnedMemory) {
  LOOM_SKIP_WITHOUT_GPU();
  const size_t n = 1 << 22;  // 16 MiB of floats
  const size_t nbytes = n * sizeof(float);
  PinnedBuffer host_in(nbytes), host_out(nbytes);
  float* in = static_cast<float*>(host_in.data());
  std::iota(in, in + n, 0.0f);
  std::memset(host_out.data(), 0, nbytes);

  Stream stream = Stream::create(0);
  StreamGuard guard(stream);  // the device buffers belong to this stream
  void* dev_a = allocate(nbytes, 0);
  void* dev_b = allocate(nbytes, 0);
  // Three copies queued back to back: the stream orders them, the host never waits in between.
  copy_bytes_async(dev_a, host_in.data(), nbytes, CopyKind::HostToDevice, stream);
  copy_bytes_async(dev_b, dev_a, nbytes, CopyKind::DeviceToDevice, stream);
  copy_bytes_async(host_out.data(), dev_b, nbytes, CopyKind::DeviceToHost, stream);
  Event done;
  done.record(stream);
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_EQ(std::memcmp(host_in.data(), host_out.data(), nbytes), 0);
  deallocate(dev_a, 0);
  deallocate(dev_b, 0);
}

TEST(CudaEvent, OrdersTwoStreamsWithoutHostSync) {
  LOOM_SKIP_WITHOUT_GPU();
  const size_t nbytes = 64 << 20;
  PinnedBuffer host_in(nbytes), host_out(nbytes);
  std::memset(host_in.data(), 0x5a, nbytes);
  std::memset(host_out.data(), 0, nbytes);
  Stream producer = Stream::create(0), consumer = Stream::create(0);
  void* dev = allocate(nbytes, 0);  // on the default stream: synchronised below before freeing
  copy_bytes_async(dev, host_in.data(), nbytes, CopyKind::HostToDevice, producer);
  Event ready;
  ready.record(producer);
  consumer.wait(ready);  // the consumer's copy starts after the producer's
  copy_bytes_async(host_out.data(), dev, nbytes, CopyKind::DeviceToHost, consumer);
  consumer.synchronize();
  EXPECT_EQ(std::memcmp(host_in.data(), host_out.data(), nbytes), 0);
  synchronize(0);
  deallocate(dev, 0);
}

TEST(CudaEvent, ElapsedTime) {
  LOOM_SKIP_WITHOUT_GPU();
  const size_t nbytes = 256 << 20;
  Stream stream = Stream::create(0);
  StreamGuard guard(stream);
  void* a = allocate(nbytes, 0);
  void* b = allocate(nbytes, 0);
  Event start(/*timing=*/true), end(/*timing=*/true);
  start.record(stream);
  for (int i = 0; i < 8; ++i)
    copy_bytes_async(i % 2 ? a : b, i % 2 ? b : a, nbytes, CopyKind::DeviceToDevice, stream);
  end.record(stream);
  end.synchronize();
  const float ms = start.elapsed_ms(end);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  Event untimed;
  untimed.record(stream);
  EXPECT_LOOM_ERROR(start.elapsed_ms(untimed), DeviceError, {"timing=true"});
  Event never;
  EXPECT_TRUE(never.query());  // an event never recorded has nothing to wait for
  stream.synchronize();
  deallocate(a, 0);
  deallocate(b, 0);
}

TEST(CudaDevice, GuardSetsAndRestoresTheDevice) {
  LOOM_SKIP_WITHOUT_GPU();
  const int last = device_count() - 1;
  set_device(0);
  {
    DeviceGuard guard(last);
    EXPECT_EQ(current_device(), last);
    EXPECT_EQ(guard.previous(), 0);
  }
  EXPECT_EQ(current_device(), 0);
  EXPECT_LOOM_ERROR(DeviceGuard guard(device_count()), DeviceError,
                    {"is not available", "CUDA_VISIBLE_DEVICES"});
  EXPECT_EQ(current_device(), 0);
}

}  // namespace
}  // namespace loom::cuda
