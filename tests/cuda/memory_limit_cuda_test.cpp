// tests/cuda/memory_limit_cuda_test.cpp — a GPU's memory cap (Note [Device memory cap] in
// tensor/memory_limit.h) on a real device: both checks, the caching allocator's on the segments
// it reserves and the count's on the bytes tensors hold, raising OutOfMemoryError with nothing
// allocated; no cap refusing nothing. Skips without CUDA or without a GPU.

#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/runtime.h"
#include "tensor/memory_limit.h"
#include "tensor/storage.h"

namespace loom {
namespace {

using test::kCuda0;
constexpr int64_t kMiB = 1024 * 1024;

// cuda:0's cap for the test's length.
class Cuda0Cap {
 public:
  Cuda0Cap() : previous_(memory_limit(kCuda0)) {}
  ~Cuda0Cap() { set_memory_limit(kCuda0, previous_); }

 private:
  int64_t previous_;
};

TEST(CudaMemoryLimit, TheAllocatorsSegmentsAndTheTensorsBytesAreCapped) {
  LOOM_SKIP_WITHOUT_GPU();
  const Cuda0Cap restore;
  cuda::empty_cache();
  // Each new stream starts its own small segment (2 MiB) for a tiny tensor.
  const cuda::Stream first = cuda::Stream::create(0), second = cuda::Stream::create(0);
  const int64_t reserved = cuda::allocator_stats(0).reserved_bytes;
  set_memory_limit(kCuda0, reserved + 3 * kMiB);
  Tensor tiny;
  {
    cuda::StreamGuard guard(first);
    tiny = empty({16}, kFloat32, kCuda0);  // a 2 MiB segment: within the cap
  }
  EXPECT_EQ(cuda::allocator_stats(0).reserved_bytes, reserved + 2 * kMiB);
  {
    cuda::StreamGuard guard(second);
    const int64_t held = memory_stats(kCuda0).current_bytes;
    const int64_t allocated = cuda::allocator_stats(0).allocated_bytes;
    // 64 bytes of tensors fit the count, but a second segment would pass the cap.
    EXPECT_LOOM_ERROR(empty({16}, kFloat32, kCuda0), OutOfMemoryError,
                      {"out of memory on cuda:0: allocating 64 B (64 bytes, float32 [16])",
                       "caching allocator of cuda:0 would reserve a segment of 2.00 MiB",
                       "over the cap of", "Nothing was allocated."});
    EXPECT_EQ(memory_stats(kCuda0).current_bytes, held);
    EXPECT_EQ(cuda::allocator_stats(0).allocated_bytes, allocated);
    EXPECT_LE(cuda::allocator_stats(0).reserved_bytes, reserved + 3 * kMiB);
  }
  {
    // The count's check: the first stream's segment has room, the cap on tensors does not.
    cuda::StreamGuard guard(first);
    set_memory_limit(kCuda0, memory_stats(kCuda0).current_bytes + 1024);
    EXPECT_LOOM_ERROR(
        empty({1024}, kFloat32, kCuda0), OutOfMemoryError,
        {"float32 [1024]", "would take loom's tensors on cuda:0 to", "(set_memory_limit)"});
    EXPECT_EQ(empty({256}, kFloat32, kCuda0).numel(), 256);  // 1 KiB: exactly the cap
  }
  // No cap: nothing refused.
  set_memory_limit(kCuda0, 0);
  EXPECT_EQ(empty({16 * kMiB}, kFloat32, kCuda0).numel(), 16 * kMiB);
  tiny = Tensor();
  cuda::empty_cache();
}

}  // namespace
}  // namespace loom
