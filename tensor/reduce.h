// tensor/reduce.h — reductions over any set of dims, with keepdim. Not differentiable:
// autograd/ops/reduce.cpp wraps them. An empty dims list means every dim.
// Float reductions accumulate in double for float32 inputs (sums of many floats stay exact to
// float precision); integer sums accumulate in int64 and return int64, as PyTorch.
#pragma once

#include <utility>

#include "tensor/tensor.h"

namespace loom::kernels {

// The layout every reduction works on: the input permuted so that the reduced dims come last,
// made contiguous, seen as [outer, inner] (inner = the product of the reduced sizes).
struct ReducePlan {
  Tensor src;  // contiguous, reduced dims last
  int64_t outer = 1;
  int64_t inner = 1;
  Shape out_shape;  // with or without the reduced dims, as keepdim asks
  Shape dims;       // the reduced dims, wrapped, sorted, unique
};
ReducePlan plan_reduce(const Tensor& x, const Shape& dims, bool keepdim, const char* op);
// The reduced dims of `x` wrapped and sorted; empty input list means all dims.
Shape reduce_dims(const Tensor& x, const Shape& dims, const char* op);
// The output shape of a reduction.
Shape reduced_shape(const Shape& shape, const Shape& sorted_dims, bool keepdim);

Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (leading dims dropped, size-1 dims kept).
Tensor sum_to(const Tensor& x, const Shape& shape);
// The dims of x that sum_to(x, shape) sums (ShapeError when x does not reduce to shape): the
// checks and plan of both devices' sum_to.
Shape sum_to_dims(const Tensor& x, const Shape& shape);

// Max/min values over dims (NaN propagates).
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Values and int64 indices along one dim (the first occurrence wins ties, as PyTorch).
std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim = false);
// Index of the maximum along dim, or in the flattened tensor when dim is absent.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// Variance and standard deviation; unbiased divides by N-1 (Bessel).
Tensor var(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor std(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
// log(sum(exp(x))) computed stably (max subtracted first).
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);

}  // namespace loom::kernels
