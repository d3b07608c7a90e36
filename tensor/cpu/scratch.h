// tensor/cpu/scratch.h — per-thread scratch memory for CPU kernels (GEMM packing buffers, conv2d
// patch blocks). Asking the allocator for megabytes on every call costs page faults: a fresh
// mapping is zero-filled by the kernel one 4 KiB page at a time, which showed up as several per
// cent of a 1024^3 GEMM. Each thread keeps its memory instead and hands it out stack-fashion.
//
// Note [Scratch frames]
//   ScratchFrame frame;                       // marks the thread's arena
//   float* packed = frame.get<float>(n);      // 64-byte aligned, uninitialised
//   ...                                       // frames nest: a kernel may call cpu::gemm
// When the frame ends, everything it handed out is free again. The arena grows by adding blocks
// (pointers already handed out never move); when the outermost frame ends, several blocks are
// merged into one of their total size, so a steady workload settles on one allocation per
// thread and none per call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::cpu {

class ScratchFrame {
 public:
  ScratchFrame();
  ~ScratchFrame();
  ScratchFrame(const ScratchFrame&) = delete;
  ScratchFrame& operator=(const ScratchFrame&) = delete;

  template <typename T>
  T* get(int64_t count) {
    return static_cast<T*>(get_bytes(static_cast<size_t>(count < 0 ? 0 : count) * sizeof(T)));
  }

 private:
  void* get_bytes(size_t bytes);
  size_t block_, offset_;  // the arena's position when the frame began
};

// Bytes this thread's arena holds (for tests and memory reports).
size_t scratch_capacity();

}  // namespace loom::cpu
