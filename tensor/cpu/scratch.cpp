// tensor/cpu/scratch.cpp — the per-thread arena behind ScratchFrame (Note [Scratch frames]).

#include "tensor/cpu/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tensor/error.h"

namespace loom::cpu {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMinBlock = size_t{1} << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

struct Block {
  std::unique_ptr<std::byte[], FreeDeleter> data;
  size_t size = 0;
};

struct Arena {
  std::vector<Block> blocks;
  size_t block = 0, offset = 0;  // the next free byte: blocks[block].data + offset
  int depth = 0;                 // frames alive on this thread

  static Block allocate(size_t size) {
    Block b;
    b.data.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, size)));
    LOOM_CHECK(b.data != nullptr, Error, "scratch memory: out of memory asking for ", size,
               " bytes");
    b.size = size;
    return b;
  }

  void* take(size_t bytes) {
    bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    // The current block, then later ones (left by an earlier, larger frame), then a new one.
    for (; block < blocks.size(); ++block, offset = 0)
      if (offset + bytes <= blocks[block].size) {
        void* p = blocks[block].data.get() + offset;
        offset += bytes;
        return p;
      }
    blocks.push_back(allocate(std::max(bytes, kMinBlock)));
    block = blocks.size() - 1;
    offset = bytes;
    return blocks.back().data.get();
  }

  // With no frame alive, several blocks become one of their total size. Runs in a destructor,
  // so it never throws: without the memory the blocks stay as they are.
  void merge() noexcept {
    if (blocks.size() < 2) return;
    size_t total = 0;
    for (const Block& b : blocks) total += b.size;
    Block merged;
    merged.data.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, total)));
    if (merged.data == nullptr) return;
    merged.size = total;
    blocks.clear();
    blocks.push_back(std::move(merged));
  }
};

Arena& arena() {
  thread_local Arena a;
  return a;
}

}  // namespace

ScratchFrame::ScratchFrame() {
  Arena& a = arena();
  block_ = a.block;
  offset_ = a.offset;
  ++a.depth;
}

ScratchFrame::~ScratchFrame() {
  Arena& a = arena();
  a.block = block_;
  a.offset = offset_;
  if (--a.depth == 0) {
    a.block = a.offset = 0;
    a.merge();
  }
}

void* ScratchFrame::get_bytes(size_t bytes) { return arena().take(bytes); }

size_t scratch_capacity() {
  size_t total = 0;
  for (const Block& b : arena().blocks) total += b.size;
  return total;
}

}  // namespace loom::cpu
