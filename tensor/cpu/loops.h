// tensor/cpu/loops.h — the one strided loop under every elementwise CPU kernel.
//
//   cpu::map<float, float>(out, [](float a, float b) { return a + b; }, a, b);
//
// The output and inputs are viewed over the output's shape (a broadcast input has stride 0 in
// the dims it repeats), dims taken in the output's memory order; adjacent dims that are
// contiguous for every operand are merged, so the common cases (all contiguous, all
// channels-last, or a broadcast row) become one flat loop the compiler vectorises. Large loops are
// split over OpenMP threads by outer index.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/loop_plan.h"
#include "tensor/parallel.h"
#include "tensor/tensor.h"

namespace loom::cpu {

using kernels::broadcast_strides;
using kernels::LoopPlan;
using kernels::plan_loop;

// Runs body(ptrs, inner_count, inner_strides) over rows of the innermost merged dim, rows
// [row_begin, row_end) of the outer dims in row-major order. ptrs are byte pointers.
template <size_t N, typename Body>
void for_each_row(const LoopPlan<N>& plan, std::array<char*, N> base,
                  const std::array<int64_t, N>& elem_bytes, int64_t row_begin, int64_t row_end,
                  Body&& body) {
  const int64_t outer_dims = static_cast<int64_t>(plan.sizes.size()) - 1;
  const int64_t inner = plan.sizes.back();
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = plan.strides[k].back();
  // Decompose row_begin into an index over the outer dims.
  std::vector<int64_t> idx(std::max<int64_t>(outer_dims, 0), 0);
  int64_t rest = row_begin;
  for (int64_t d = outer_dims - 1; d >= 0; --d) {
    idx[d] = rest % plan.sizes[d];
    rest /= plan.sizes[d];
  }
  std::array<char*, N> ptr;
  for (size_t k = 0; k < N; ++k) {
    int64_t off = 0;
    for (int64_t d = 0; d < outer_dims; ++d) off += idx[d] * plan.strides[k][d];
    ptr[k] = base[k] + off * elem_bytes[k];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    body(ptr, inner, inner_stride);
    for (int64_t d = outer_dims - 1; d >= 0; --d) {
      if (++idx[d] < plan.sizes[d]) {
        for (size_t k = 0; k < N; ++k) ptr[k] += plan.strides[k][d] * elem_bytes[k];
        break;
      }
      for (size_t k = 0; k < N; ++k)
        ptr[k] -= (plan.sizes[d] - 1) * plan.strides[k][d] * elem_bytes[k];
      idx[d] = 0;
    }
  }
}

// out[i] = f(in0[i], in1[i], ...) over out's shape, inputs broadcast to it. Tout and Tin are the
// C++ types of out and of every input (the caller converts inputs beforehand).
template <typename Tout, typename Tin, typename F, typename... Ins>
void map(const Tensor& out, F&& f, const Ins&... in) {
  constexpr size_t N = 1 + sizeof...(Ins);
  const Shape& shape = out.sizes();
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const LoopPlan<N> plan = plan_loop<N>(shape, {out.strides(), broadcast_strides(in, shape)...});
  const std::array<char*, N> base = {static_cast<char*>(out.data()),
                                     static_cast<char*>(in.data())...};
  const std::array<int64_t, N> bytes = {static_cast<int64_t>(sizeof(Tout)),
                                        static_cast<int64_t>((void(in), sizeof(Tin)))...};
  auto row_body = [&](std::array<char*, N> p, int64_t n, const std::array<int64_t, N>& st) {
    Tout* o = reinterpret_cast<Tout*>(p[0]);
    bool dense = true;
    for (size_t k = 0; k < N; ++k) dense = dense && st[k] == 1;
    [&]<size_t... K>(std::index_sequence<K...>) {
      if (dense) {
        // Every operand contiguous: the loop the compiler vectorises.
        for (int64_t i = 0; i < n; ++i)
          o[i] = static_cast<Tout>(f(reinterpret_cast<const Tin*>(p[K + 1])[i]...));
      } else {
        for (int64_t i = 0; i < n; ++i)
          o[i * st[0]] =
              static_cast<Tout>(f(reinterpret_cast<const Tin*>(p[K + 1])[i * st[K + 1]]...));
      }
    }
    (std::make_index_sequence<N - 1>{});
  };
  const int64_t rows = numel / plan.sizes.back();
  if (rows == 1) {
    // One long row: split it into chunks across threads.
    const int64_t n = plan.sizes.back();
    std::array<int64_t, N> st;
    for (size_t k = 0; k < N; ++k) st[k] = plan.strides[k].back();
    parallel_for(0, n, kParallelGrain, [&](int64_t lo, int64_t hi) {
      std::array<char*, N> p = base;
      for (size_t k = 0; k < N; ++k) p[k] += lo * st[k] * bytes[k];
      row_body(p, hi - lo, st);
    });
    return;
  }
  // Many rows: split by rows, when there are enough elements to pay for the threads.
  const int64_t row_grain = grain_for(plan.sizes.back());
  parallel_for(0, rows, row_grain, [&](int64_t lo, int64_t hi) {
    for_each_row<N>(plan, base, bytes, lo, hi, row_body);
  });
}

}  // namespace loom::cpu
