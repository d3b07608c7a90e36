// tensor/cpu/reduce.cpp — reductions on the CPU. Every reduction sees its input as
// [outer, inner] (plan_reduce, computed by the front tensor/reduce.cpp), reduces each row of
// `inner` elements, and runs rows in parallel. Sums over leading dims (bias gradients) take a
// faster path that keeps the input's layout and adds rows into the output.

#include "tensor/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

using kernels::ReducePlan;

namespace {

// The accumulator type of a sum: double for floats, int64 for integers and bool.
template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

// Runs row(r, const T* data, T_out* out) for each of plan.outer rows, in parallel.
template <typename T, typename Tout, typename Row>
void for_rows(const ReducePlan& plan, const Tensor& out, Row&& row) {
  const T* src = plan.src.data_ptr<T>();
  Tout* dst = out.data_ptr<Tout>();
  const int64_t inner = plan.inner;
  const int64_t grain = grain_for(inner);
  parallel_for(0, plan.outer, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) row(src + r * inner, inner, dst + r);
  });
}

// Extremum over rows; Better(a, b) is true when a should replace b. NaN wins, as in PyTorch.
// The front has run check_extremum.
template <bool kMax>
Tensor extremum(const ReducePlan& plan, const char* op) {
  const Tensor& x = plan.src;
  Tensor out = empty(plan.out_shape, x.dtype(), x.device());
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    for_rows<T, T>(plan, out, [](const T* row, int64_t n, T* o) {
      T best = row[0];
      for (int64_t i = 1; i < n; ++i) {
        const T v = row[i];
        if (best != best) break;
        if (v != v || (kMax ? v > best : v < best)) best = v;
      }
      *o = best;
    });
  });
  return out;
}

template <bool kMax>
std::pair<Tensor, Tensor> extremum_dim(const ReducePlan& plan, const char* op) {
  const Tensor& x = plan.src;
  Tensor values = empty(plan.out_shape, x.dtype(), x.device());
  Tensor indices = empty(plan.out_shape, kInt64, x.device());
  int64_t* idx = indices.data_ptr<int64_t>();
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    const T* values_base = values.data_ptr<T>();
    for_rows<T, T>(plan, values, [&](const T* row, int64_t n, T* o) {
      int64_t best_i = 0;
      T best = row[0];
      for (int64_t i = 1; i < n && best == best; ++i) {
        const T v = row[i];
        if (v != v || (kMax ? v > best : v < best)) {
          best = v;
          best_i = i;
        }
      }
      *o = best;
      idx[o - values_base] = best_i;
    });
  });
  return {values, indices};
}

}  // namespace

// ---------------------------------------------------------------- sum, mean

Tensor sum(const Tensor& x, const Shape& rdims, bool keepdim) {
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : kInt64;
  // Fast path: a contiguous input reduced over its leading dims (a bias gradient): add rows.
  bool leading = x.is_contiguous() && !rdims.empty();
  for (size_t i = 0; i < rdims.size() && leading; ++i)
    leading = rdims[i] == static_cast<int64_t>(i);
  if (leading && is_floating(x.dtype()) && static_cast<int64_t>(rdims.size()) < x.dim()) {
    int64_t rows = 1;
    for (int64_t d : rdims) rows *= x.sizes()[d];
    const int64_t cols = x.numel() / std::max<int64_t>(rows, 1);
    Tensor out = empty(kernels::reduced_shape(x.sizes(), rdims, keepdim), out_dtype, x.device());
    dispatch_floating(x.dtype(), "sum", [&]<typename T>() {
      const T* src = x.data_ptr<T>();
      T* dst = out.data_ptr<T>();
      // Columns split across threads; each thread walks all rows of its columns.
      parallel_for(0, cols, grain_for(rows), [&](int64_t lo, int64_t hi) {
        std::vector<acc_t<T>> acc(hi - lo, 0);
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = src + r * cols;
          for (int64_t c = lo; c < hi; ++c) acc[c - lo] += row[c];
        }
        for (int64_t c = lo; c < hi; ++c) dst[c] = static_cast<T>(acc[c - lo]);
      });
    });
    return out;
  }
  const ReducePlan plan = kernels::plan_reduce(x, rdims, keepdim, "sum");
  Tensor out = empty(plan.out_shape, out_dtype, x.device());
  dispatch_numeric(x.dtype(), "sum", [&]<typename T>() {
    using Out = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
    for_rows<T, Out>(plan, out, [](const T* row, int64_t n, Out* o) {
      acc_t<T> acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += row[i];
      *o = static_cast<Out>(acc);
    });
  });
  return out;
}

Tensor mean(const Tensor& x, const Shape& rdims, bool keepdim) {
  int64_t count = 1;
  for (int64_t d : rdims) count *= x.sizes()[d];
  Tensor s = kernels::sum(x, rdims, keepdim);
  kernels::mul_scalar_(s, count == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / count);
  return s;
}

Tensor sum_to(const Tensor& x, const Shape& shape, const Shape& dims) {
  if (dims.empty()) return kernels::reshape(x, shape);
  return kernels::reshape(kernels::sum(x, dims, /*keepdim=*/true), shape);
}

// ---------------------------------------------------------------- max, min, arg

Tensor amax(const ReducePlan& plan) { return extremum<true>(plan, "amax"); }
Tensor amin(const ReducePlan& plan) { return extremum<false>(plan, "amin"); }
std::pair<Tensor, Tensor> max_dim(const ReducePlan& plan) {
  return extremum_dim<true>(plan, "max");
}
std::pair<Tensor, Tensor> min_dim(const ReducePlan& plan) {
  return extremum_dim<false>(plan, "min");
}
Tensor argmax(const ReducePlan& plan) { return extremum_dim<true>(plan, "argmax").second; }
Tensor argmin(const ReducePlan& plan) { return extremum_dim<false>(plan, "argmin").second; }

// ---------------------------------------------------------------- var, std, logsumexp

Tensor var(const ReducePlan& plan, bool unbiased) {
  const Tensor& x = plan.src;
  Tensor out = empty(plan.out_shape, x.dtype(), x.device());
  const int64_t correction = unbiased ? 1 : 0;
  dispatch_floating(x.dtype(), "var", [&]<typename T>() {
    // Two passes in double: the mean, then the sum of squared deviations.
    for_rows<T, T>(plan, out, [correction](const T* row, int64_t n, T* o) {
      double mean = 0;
      for (int64_t i = 0; i < n; ++i) mean += row[i];
      mean /= static_cast<double>(n);
      double m2 = 0;
      for (int64_t i = 0; i < n; ++i) m2 += (row[i] - mean) * (row[i] - mean);
      const int64_t denom = n - correction;
      *o = static_cast<T>(denom > 0 ? m2 / static_cast<double>(denom)
                                    : std::numeric_limits<double>::quiet_NaN());
    });
  });
  return out;
}

Tensor std(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  return kernels::sqrt(kernels::var(x, dims, unbiased, keepdim));
}

Tensor logsumexp(const ReducePlan& plan) {
  const Tensor& x = plan.src;
  Tensor out = empty(plan.out_shape, x.dtype(), x.device());
  dispatch_floating(x.dtype(), "logsumexp", [&]<typename T>() {
    for_rows<T, T>(plan, out, [](const T* row, int64_t n, T* o) {
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) m = std::max(m, row[i]);
      if (!std::isfinite(m)) {  // all -inf (or an inf/NaN present): the plain formula is right
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]));
        *o = static_cast<T>(std::log(s));
        return;
      }
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i] - m));
      *o = static_cast<T>(m + std::log(s));
    });
  });
  return out;
}

}  // namespace loom::cpu
