// tensor/reduce.cpp — the front of the reductions (tensor/reduce.h): the dims, output shapes
// and [outer, inner] plan that both devices use, the argument checks, and the one device switch
// to tensor/cpu/reduce.cpp or the CUDA backend (tensor/cuda_backend.h).

#include "tensor/reduce.h"

#include <algorithm>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/reduce.h"
#include "tensor/cuda_backend.h"
#include "tensor/view.h"

namespace loom::kernels {

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
  if (x.dtype() == kBool) return sum(to_dtype(x, kInt64), dims, keepdim);  // counts, as PyTorch
  return cpu::sum(x, reduce_dims(x, dims, "sum"), keepdim);
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  LOOM_CHECK(is_floating(x.dtype()), DTypeError, "mean: expected a floating-point tensor; got ",
             x.dtype());
  if (on_cuda("mean", {x})) return cuda_backend().mean(x, dims, keepdim);
  return cpu::mean(x, reduce_dims(x, dims, "mean"), keepdim);
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
  return cpu::sum_to(x, shape, dims);
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

}  // namespace

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  check_extremum(x, dims, "amax", x.sizes());
  if (on_cuda("amax", {x})) return cuda_backend().amax(x, dims, keepdim);
  return cpu::amax(plan_reduce(x, dims, keepdim, "amax"));
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  check_extremum(x, dims, "amin", x.sizes());
  if (on_cuda("amin", {x})) return cuda_backend().amin(x, dims, keepdim);
  return cpu::amin(plan_reduce(x, dims, keepdim, "amin"));
}
std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  check_extremum(x, {dim}, "max", x.sizes());
  if (on_cuda("max_dim", {x})) return cuda_backend().max_dim(x, dim, keepdim);
  return cpu::max_dim(plan_reduce(x, {dim}, keepdim, "max"));
}
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  check_extremum(x, {dim}, "min", x.sizes());
  if (on_cuda("min_dim", {x})) return cuda_backend().min_dim(x, dim, keepdim);
  return cpu::min_dim(plan_reduce(x, {dim}, keepdim, "min"));
}

// Without a dim, argmax and argmin reduce the flattened [numel].
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim)
    check_extremum(x, {*dim}, "argmax", x.sizes());
  else
    check_extremum(x, {}, "argmax", {x.numel()});
  if (on_cuda("argmax", {x})) return cuda_backend().argmax(x, dim, keepdim);
  if (!dim) return cpu::argmax(plan_reduce(reshape(x, {-1}), {0}, false, "argmax"));
  return cpu::argmax(plan_reduce(x, {*dim}, keepdim, "argmax"));
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim)
    check_extremum(x, {*dim}, "argmin", x.sizes());
  else
    check_extremum(x, {}, "argmin", {x.numel()});
  if (on_cuda("argmin", {x})) return cuda_backend().argmin(x, dim, keepdim);
  if (!dim) return cpu::argmin(plan_reduce(reshape(x, {-1}), {0}, false, "argmin"));
  return cpu::argmin(plan_reduce(x, {*dim}, keepdim, "argmin"));
}

// ---------------------------------------------------------------- var, std, logsumexp

Tensor var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  if (on_cuda("var", {x})) return cuda_backend().var(x, dims, unbiased, keepdim);
  return cpu::var(plan_reduce(x, dims, keepdim, "var"), unbiased);
}

Tensor std(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  if (on_cuda("std", {x})) return cuda_backend().std(x, dims, unbiased, keepdim);
  return cpu::std(x, dims, unbiased, keepdim);
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  if (on_cuda("logsumexp", {x})) return cuda_backend().logsumexp(x, dims, keepdim);
  return cpu::logsumexp(plan_reduce(x, dims, keepdim, "logsumexp"));
}

}  // namespace loom::kernels
