// Tensor lists (tensor/cuda/tensor_list.h, Note [Tensor lists]) are packed on the host and
// walked on the device with block_span, both plain code: checked here on the CPU by running
// every launch's blocks over host arrays, as the kernels do, without a GPU.

#include "tensor/cuda/tensor_list.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace loom::cuda {
namespace {

// The launches pack() makes for tensors of `sizes`: each visits its blocks' elements, adding
// one to a counter per element of the tensor in data[0] and checking the launch's bounds; the
// tensors' other addresses and flags must reach the launch as given.
template <int Depth>
int count_visits(const std::vector<int64_t>& sizes, int64_t chunk,
                 std::vector<std::vector<int>>& visits) {
  using L = TensorListLaunch<Depth>;
  visits.assign(sizes.size(), {});
  std::vector<TensorListEntry<Depth>> entries;
  for (size_t i = 0; i < sizes.size(); ++i) {
    visits[i].assign(static_cast<size_t>(sizes[i]), 0);
    TensorListEntry<Depth> e{};
    e.data[0] = visits[i].data();
    for (int d = 1; d < Depth; ++d)  // a distinct tag per tensor and depth
      e.data[static_cast<size_t>(d)] = reinterpret_cast<void*>((i + 1) * 16 + d);
    e.numel = sizes[i];
    e.flag = i % 3 == 1;
    entries.push_back(e);
  }
  int launches = 0;
  pack<Depth>(std::span<const TensorListEntry<Depth>>(entries), chunk, [&](const L& l) {
    ++launches;
    EXPECT_GT(l.blocks, 0);
    EXPECT_LE(l.blocks, L::kMaxBlocks);
    EXPECT_GT(l.tensors, 0);
    EXPECT_LE(l.tensors, L::kMaxTensors);
    for (int b = 0; b < l.blocks; ++b) {
      const int t = l.block_tensor[b];
      ASSERT_LT(t, l.tensors);
      auto* counts = static_cast<int*>(l.data[0][t]);
      // Which entry this slot holds: the one whose counters it points at.
      size_t i = 0;
      while (i < entries.size() && entries[i].data[0] != counts) ++i;
      ASSERT_LT(i, entries.size());
      for (int d = 1; d < Depth; ++d) EXPECT_EQ(l.data[d][t], entries[i].data[size_t(d)]);
      EXPECT_EQ(l.flag[t] != 0, entries[i].flag);
      EXPECT_EQ(l.numel[t], sizes[i]);
      int64_t begin = 0, end = 0;
      block_span(l, b, chunk, begin, end);
      EXPECT_LT(begin, end);
      EXPECT_LE(end, sizes[i]);
      for (int64_t j = begin; j < end; ++j) ++counts[j];
    }
  });
  return launches;
}

void expect_each_element_once(const std::vector<std::vector<int>>& visits) {
  for (size_t i = 0; i < visits.size(); ++i)
    for (size_t j = 0; j < visits[i].size(); ++j)
      ASSERT_EQ(visits[i][j], 1) << "tensor " << i << " element " << j;
}

TEST(TensorList, EveryElementOnceAcrossChunkEdgesAndEmptyTensors) {
  const int64_t chunk = 64;
  const std::vector<int64_t> sizes = {0, 1, 63, 64, 65, 5 * 64 + 3, 0, 128, 7};
  std::vector<std::vector<int>> visits;
  EXPECT_EQ(count_visits<3>(sizes, chunk, visits), 1);
  expect_each_element_once(visits);
}

TEST(TensorList, ManySmallTensorsFillOneLaunchPerMaxTensors) {
  for (int n : {1, 35, 36, 37, 100}) {
    const std::vector<int64_t> sizes(static_cast<size_t>(n), 10);
    std::vector<std::vector<int>> visits;
    const int per_launch = TensorListLaunch<5>::kMaxTensors;
    EXPECT_EQ(count_visits<5>(sizes, 16, visits), (n + per_launch - 1) / per_launch) << n;
    expect_each_element_once(visits);
  }
}

TEST(TensorList, ALargeTensorContinuesInTheNextLaunch) {
  // 700 chunks of one tensor between two small ones: the big one spans three launches.
  const int64_t chunk = 8;
  const std::vector<int64_t> sizes = {5, 700 * chunk - 1, 3};
  std::vector<std::vector<int>> visits;
  const int blocks = TensorListLaunch<1>::kMaxBlocks;
  EXPECT_EQ(count_visits<1>(sizes, chunk, visits), (1 + 700 + 1 + blocks - 1) / blocks);
  expect_each_element_once(visits);
}

// The Note's figure: ResNet-18 CIFAR's 62 parameters take two SGD launches at optim.cu's chunk.
TEST(TensorList, ResNet18TakesTwoSgdLaunches) {
  std::vector<int64_t> sizes = {3 * 64 * 9, 64, 64};  // stem conv, bn
  const int64_t widths[] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int64_t w : widths) {
    for (int block = 0; block < 2; ++block) {
      const int64_t c_in = block == 0 ? in : w;
      for (int64_t e : {c_in * w * 9, w, w, w * w * 9, w, w}) sizes.push_back(e);
      if (block == 0 && c_in != w)
        for (int64_t e : {c_in * w, w, w}) sizes.push_back(e);  // the 1x1 shortcut and its bn
    }
    in = w;
  }
  sizes.push_back(512 * 10);  // fc
  sizes.push_back(10);
  ASSERT_EQ(sizes.size(), 62u);
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 11173962);
  std::vector<std::vector<int>> visits;
  EXPECT_EQ(count_visits<3>(sizes, int64_t{1} << 16, visits), 2);
  expect_each_element_once(visits);
}

}  // namespace
}  // namespace loom::cuda
