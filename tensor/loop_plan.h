// tensor/loop_plan.h — how an elementwise loop walks its operands, for both backends: the
// operands viewed over the output's shape (a broadcast input has stride 0 in the dims it
// repeats), dims taken in the output's memory order, and adjacent dims that are contiguous for
// every operand merged, so the common cases (all contiguous, all channels-last, or a broadcast
// row) become one flat loop. tensor/cpu/loops.h runs the plan on OpenMP threads,
// tensor/cuda/loops.cuh in CUDA threads.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "tensor/tensor.h"

namespace loom::kernels {

// Strides of `t` when broadcast to `shape` (0 in the dims it repeats).
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape s(shape.size(), 0);
  const size_t lead = shape.size() - t.sizes().size();
  for (size_t i = 0; i < t.sizes().size(); ++i)
    s[lead + i] = t.sizes()[i] == 1 ? 0 : t.strides()[i];
  return s;
}

// The iteration space after merging dims: sizes, and one stride list per operand.
template <size_t N>
struct LoopPlan {
  Shape sizes;
  std::array<Shape, N> strides;
};

// Dims are visited in operand 0's memory order, outermost first (a stable sort by its strides,
// descending), so that an output stored channels-last, or in any other dense order, merges
// into one flat loop as a contiguous one does (Note [Memory formats]). A row-major output,
// every map's common case, keeps the row-major order without sorting or allocating.
template <size_t N>
LoopPlan<N> plan_loop(const Shape& shape, const std::array<Shape, N>& strides) {
  const Shape& out = strides[0];
  std::vector<size_t> order;
  if (!std::is_sorted(out.begin(), out.end(), std::greater<>())) {
    order.resize(shape.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return out[a] > out[b]; });
  }
  LoopPlan<N> plan;
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t d = order.empty() ? i : order[i];
    if (shape[d] == 1) continue;  // size-1 dims do not move any pointer
    bool merge = !plan.sizes.empty();
    for (size_t k = 0; merge && k < N; ++k)
      merge = plan.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      plan.sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) plan.strides[k].back() = strides[k][d];
    } else {
      plan.sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) plan.strides[k].push_back(strides[k][d]);
    }
  }
  if (plan.sizes.empty()) {  // a scalar, or all dims of size 1
    plan.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) plan.strides[k].push_back(0);
  }
  return plan;
}

}  // namespace loom::kernels
