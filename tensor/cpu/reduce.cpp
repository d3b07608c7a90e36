// tensor/cpu/reduce.cpp — reductions on the CPU. Every reduction sees its input as
// [outer, inner] (plan_reduce), reduces each row of `inner` elements, and runs rows in
// parallel. Sums over leading dims (bias gradients) take a faster path that keeps the input's
// layout and adds rows into the output.

#include "tensor/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

void cpu_only(const char* op, const Tensor& x) {
  LOOM_ASSERT(x.is_cpu(), op, ": a CUDA operand missed the device switch");
}

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

}  // namespace

Shape reduce_dims(const Tensor& x, const Shape& dims, const char* op) {
  Shape out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, x.dim(), op));
  std::sort(out.begin(), out.end());
  LOOM_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), IndexError, op,
             ": dim appears more than once in dims=", dims);
  if (x.dim() == 0) out.clear();  // a 0-d tensor: dim 0 / -1 name the tensor itself
  return out;
}

Shape reduced_shape(const Shape& shape, const Shape& sorted_dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::binary_search(sorted_dims.begin(), sorted_dims.end(), d);
    if (!reduced)
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

ReducePlan plan_reduce(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  ReducePlan plan;
  plan.dims = reduce_dims(x, dims, op);
  plan.out_shape = reduced_shape(x.sizes(), plan.dims, keepdim);
  Shape order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!std::binary_search(plan.dims.begin(), plan.dims.end(), d)) order.push_back(d);
  for (int64_t d : plan.dims) {
    order.push_back(d);
    plan.inner *= x.sizes()[d];
  }
  plan.outer = plan.inner == 0 ? shape_numel(plan.out_shape) : x.numel() / plan.inner;
  plan.src = contiguous(permute(x, order));
  return plan;
}

// ---------------------------------------------------------------- sum, mean

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  if (on_cuda("sum", {x})) return cuda_backend().sum(x, dims, keepdim);
  cpu_only("sum", x);
  if (x.dtype() == kBool) return sum(to_dtype(x, kInt64), dims, keepdim);  // counts, as PyTorch
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : kInt64;
  const Shape rdims = reduce_dims(x, dims, "sum");
  // Fast path: a contiguous input reduced over its leading dims (a bias gradient): add rows.
  bool leading = x.is_contiguous() && !rdims.empty();
  for (size_t i = 0; i < rdims.size() && leading; ++i)
    leading = rdims[i] == static_cast<int64_t>(i);
  if (leading && is_floating(x.dtype()) && static_cast<int64_t>(rdims.size()) < x.dim()) {
    int64_t rows = 1;
    for (int64_t d : rdims) rows *= x.sizes()[d];
    const int64_t cols = x.numel() / std::max<int64_t>(rows, 1);
    Tensor out = empty(reduced_shape(x.sizes(), rdims, keepdim), out_dtype, x.device());
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
  const ReducePlan plan = plan_reduce(x, dims, keepdim, "sum");
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

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  LOOM_CHECK(is_floating(x.dtype()), DTypeError, "mean: expected a floating-point tensor; got ",
             x.dtype());
  if (on_cuda("mean", {x})) return cuda_backend().mean(x, dims, keepdim);
  const Shape rdims = reduce_dims(x, dims, "mean");
  int64_t count = 1;
  for (int64_t d : rdims) count *= x.sizes()[d];
  Tensor s = sum(x, dims, keepdim);
  mul_scalar_(s, count == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / count);
  return s;
}

Shape sum_to_dims(const Tensor& x, const Shape& shape) {
  LOOM_CHECK(static_cast<int64_t>(shape.size()) <= x.dim(), ShapeError,
             "sum_to: cannot reduce shape=", x.sizes(), " to shape=", shape);
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
      continue;
    }
    const int64_t want = shape[d - lead];
    LOOM_CHECK(want == x.sizes()[d] || want == 1, ShapeError,
               "sum_to: cannot reduce shape=", x.sizes(), " to shape=", shape);
    if (want == 1 && x.sizes()[d] != 1) dims.push_back(d);
  }
  return dims;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const Shape dims = sum_to_dims(x, shape);
  if (on_cuda("sum_to", {x})) return cuda_backend().sum_to(x, shape);
  if (dims.empty()) return reshape(x, shape);
  return reshape(sum(x, dims, /*keepdim=*/true), shape);
}

// ---------------------------------------------------------------- max, min, arg

namespace {

// A max or min needs an element to pick: checks dims and that none of them has size zero,
// before the device switch. `shape` names x in the message (the flattened [numel] of an
// argmax/argmin without a dim, which reduces every dim).
void check_extremum(const Tensor& x, const Shape& dims, const char* op, const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : reduce_dims(x, dims, op)) count *= x.sizes()[d];
  LOOM_CHECK(count > 0, ValueError, op, ": cannot reduce over a zero-size dim; got shape=", shape);
}

// Extremum over rows; Better(a, b) is true when a should replace b. NaN wins, as in PyTorch.
// The caller has run check_extremum.
template <bool kMax>
Tensor extremum(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  cpu_only(op, x);
  const ReducePlan plan = plan_reduce(x, dims, keepdim, op);
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
std::pair<Tensor, Tensor> extremum_dim(const Tensor& x, int64_t dim, bool keepdim, const char* op) {
  cpu_only(op, x);
  const ReducePlan plan = plan_reduce(x, {dim}, keepdim, op);
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

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  check_extremum(x, dims, "amax", x.sizes());
  if (on_cuda("amax", {x})) return cuda_backend().amax(x, dims, keepdim);
  return extremum<true>(x, dims, keepdim, "amax");
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  check_extremum(x, dims, "amin", x.sizes());
  if (on_cuda("amin", {x})) return cuda_backend().amin(x, dims, keepdim);
  return extremum<false>(x, dims, keepdim, "amin");
}
std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  check_extremum(x, {dim}, "max", x.sizes());
  if (on_cuda("max_dim", {x})) return cuda_backend().max_dim(x, dim, keepdim);
  return extremum_dim<true>(x, dim, keepdim, "max");
}
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  check_extremum(x, {dim}, "min", x.sizes());
  if (on_cuda("min_dim", {x})) return cuda_backend().min_dim(x, dim, keepdim);
  return extremum_dim<false>(x, dim, keepdim, "min");
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim)
    check_extremum(x, {*dim}, "argmax", x.sizes());
  else
    check_extremum(x, {}, "argmax", {x.numel()});
  if (on_cuda("argmax", {x})) return cuda_backend().argmax(x, dim, keepdim);
  if (!dim) return extremum_dim<true>(reshape(x, {-1}), 0, false, "argmax").second;
  return extremum_dim<true>(x, *dim, keepdim, "argmax").second;
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim)
    check_extremum(x, {*dim}, "argmin", x.sizes());
  else
    check_extremum(x, {}, "argmin", {x.numel()});
  if (on_cuda("argmin", {x})) return cuda_backend().argmin(x, dim, keepdim);
  if (!dim) return extremum_dim<false>(reshape(x, {-1}), 0, false, "argmin").second;
  return extremum_dim<false>(x, *dim, keepdim, "argmin").second;
}

// ---------------------------------------------------------------- var, std, logsumexp

Tensor var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  if (on_cuda("var", {x})) return cuda_backend().var(x, dims, unbiased, keepdim);
  cpu_only("var", x);
  const ReducePlan plan = plan_reduce(x, dims, keepdim, "var");
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
  if (on_cuda("std", {x})) return cuda_backend().std(x, dims, unbiased, keepdim);
  return sqrt(var(x, dims, unbiased, keepdim));
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  if (on_cuda("logsumexp", {x})) return cuda_backend().logsumexp(x, dims, keepdim);
  cpu_only("logsumexp", x);
  const ReducePlan plan = plan_reduce(x, dims, keepdim, "logsumexp");
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

}  // namespace loom::kernels
