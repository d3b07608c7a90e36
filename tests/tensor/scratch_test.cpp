// tests/tensor/scratch_test.cpp — per-thread scratch frames (Note [Scratch frames]).

#include "tensor/cpu/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace loom::cpu {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

TEST(Scratch, PiecesAreAlignedAndDisjoint) {
  ScratchFrame frame;
  char* a = frame.get<char>(3);
  float* b = frame.get<float>(100);
  EXPECT_TRUE(aligned64(a));
  EXPECT_TRUE(aligned64(b));
  EXPECT_GE(reinterpret_cast<char*>(b), a + 3);
}

TEST(Scratch, GrowingKeepsEarlierPiecesInPlace) {
  ScratchFrame frame;
  int* small = frame.get<int>(16);
  for (int i = 0; i < 16; ++i) small[i] = i;
  // Larger than any block so far: a new block, the first piece untouched.
  double* big = frame.get<double>(int64_t{1} << 20);
  std::memset(big, 0xff, sizeof(double) << 20);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(small[i], i);
}

TEST(Scratch, EndedFramesGiveTheirMemoryBack) {
  void* first = nullptr;
  {
    ScratchFrame frame;
    first = frame.get<float>(1000);
  }
  ScratchFrame frame;
  EXPECT_EQ(frame.get<float>(1000), first);
}

TEST(Scratch, NestedFramesDoNotOverlapAndBlocksMerge) {
  {
    ScratchFrame outer;
    float* a = outer.get<float>(1 << 18);  // 1 MiB
    {
      ScratchFrame inner;
      float* b = inner.get<float>(3 << 18);
      EXPECT_TRUE(b + (3 << 18) <= a || b >= a + (1 << 18));
    }
    float* c = outer.get<float>(1 << 10);
    EXPECT_TRUE(c >= a + (1 << 18) || c + (1 << 10) <= a);
  }
  // With no frame alive the arena is one block that holds both frames' needs at once.
  const size_t capacity = scratch_capacity();
  EXPECT_GE(capacity, size_t{4} << 20);
  ScratchFrame frame;
  float* a = frame.get<float>(1 << 18);
  float* b = frame.get<float>(3 << 18);
  EXPECT_EQ(b, a + (1 << 18));
  EXPECT_EQ(scratch_capacity(), capacity);
}

}  // namespace
}  // namespace loom::cpu
