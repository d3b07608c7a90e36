// tensor/cuda/tensor_list.h — many tensors in one kernel launch, for the updates that visit every
// parameter (the optimizers' steps, GradScaler's unscale). Host and device code without a CUDA
// include, so the packing is checked on the CPU (tests/tensor/tensor_list_test.cpp).
//
// Note [Tensor lists]
//   A training step ends with passes over every parameter: ResNet-18 has 62, so one kernel per
//   parameter for the unscale and another for SGD is 124 launches a step. Each costs the host a
//   few microseconds (arguments, cudaLaunchKernel, the launch check) for a few microseconds of
//   device work: a batch norm's weight has 64 to 512 elements. A ResNet-18 CIFAR step on an H200
//   takes a few milliseconds, which the host's launches can bound, so those launches show.
//   PyTorch's foreach kernels answer the same way.
//
//   One launch carries up to kMaxTensors tensors' addresses in its argument block (kernel
//   arguments may take 4 KiB on every architecture and CUDA release), and a table that gives
//   each of up to kMaxBlocks blocks one chunk (`chunk` elements) of one tensor. pack() fills
//   launches in order; a tensor whose chunks do not all fit continues in the next launch. So a
//   list takes at least as many launches as its chunks need blocks or its tensors need slots,
//   whichever is more (one more where a launch fills up early): ResNet-18's 62 parameters
//   (11.2 M elements, 220 chunks) take 2 for SGD and 1 for the unscale.
//   block_span() is the device's side: block b's [begin, end) within its tensor.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "tensor/cuda/float16.h"  // LOOM_HOST_DEVICE

namespace loom::cuda {

// One launch's tensors: Depth addresses per tensor (param, grad, buffers...; nullptr where a
// tensor has no such buffer), its element count and one flag of per-tensor state.
template <int Depth>
struct TensorListLaunch {
  static_assert(Depth >= 1 && Depth <= 5);
  static constexpr int kMaxTensors = Depth == 1 ? 96 : Depth == 2 ? 64 : Depth == 3 ? 48 : 36;
  static constexpr int kMaxBlocks = 320;

  void* data[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];   // which chunk of its tensor block b takes
  uint8_t block_tensor[kMaxBlocks];  // which tensor (index into the arrays above)
  uint8_t flag[kMaxTensors];
  int tensors;
  int blocks;
};
// What the kernels' scalar arguments may add stays within the 4 KiB.
static_assert(sizeof(TensorListLaunch<1>) <= 3584 && sizeof(TensorListLaunch<2>) <= 3584 &&
              sizeof(TensorListLaunch<3>) <= 3584 && sizeof(TensorListLaunch<4>) <= 3584 &&
              sizeof(TensorListLaunch<5>) <= 3584);

template <int Depth>
struct TensorListEntry {
  std::array<void*, Depth> data;
  int64_t numel;
  bool flag = false;
};

// Calls launch(const TensorListLaunch<Depth>&) once per launch that covers every chunk of
// `entries`, in order; empty tensors take no block. chunk > 0.
template <int Depth, typename Launch>
void pack(std::span<const TensorListEntry<Depth>> entries, int64_t chunk, Launch&& launch) {
  using L = TensorListLaunch<Depth>;
  L l{};
  const auto flush = [&] {
    if (l.blocks > 0) launch(static_cast<const L&>(l));
    l.tensors = 0;
    l.blocks = 0;
  };
  for (const TensorListEntry<Depth>& e : entries) {
    const int64_t chunks = (e.numel + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || l.tensors == 0) {  // this tensor needs a slot in the launch being filled
        if (l.tensors == L::kMaxTensors) flush();
        const int slot = l.tensors++;
        for (int d = 0; d < Depth; ++d) l.data[d][slot] = e.data[static_cast<size_t>(d)];
        l.numel[slot] = e.numel;
        l.flag[slot] = e.flag ? 1 : 0;
      }
      l.block_tensor[l.blocks] = static_cast<uint8_t>(l.tensors - 1);
      l.block_chunk[l.blocks] = static_cast<int32_t>(c);
      if (++l.blocks == L::kMaxBlocks) flush();
    }
  }
  flush();
}

// Block b's elements of its tensor: [begin, end).
template <int Depth>
LOOM_HOST_DEVICE void block_span(const TensorListLaunch<Depth>& l, int b, int64_t chunk,
                                 int64_t& begin, int64_t& end) {
  begin = int64_t{l.block_chunk[b]} * chunk;
  const int64_t n = l.numel[l.block_tensor[b]];
  end = begin + chunk < n ? begin + chunk : n;
}

}  // namespace loom::cuda
