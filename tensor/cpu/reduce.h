// tensor/cpu/reduce.h — the CPU loops of the reductions (tensor/reduce.h, whose front checks the
// arguments, plans the [outer, inner] layout and calls these for CPU tensors).
#pragma once

#include <utility>

#include "tensor/reduce.h"

namespace loom::cpu {

// Each takes CPU tensors and dims the front has checked; a plan is plan_reduce's of the input.
// The dtype is refused by dispatch where a loop has no such type (16-bit floats among them).

// x summed over rdims (reduce_dims's: wrapped, sorted, unique); x is not bool (the front counts
// a bool x as int64). Floats accumulate in double and integers in int64, returned as int64.
Tensor sum(const Tensor& x, const Shape& rdims, bool keepdim);
// sum(x, rdims) / the count of reduced elements (NaN for none); x floating.
Tensor mean(const Tensor& x, const Shape& rdims, bool keepdim);
// x summed over dims (sum_to_dims's) and reshaped to `shape`.
Tensor sum_to(const Tensor& x, const Shape& shape, const Shape& dims);

// The max or min of each row of the plan (NaN propagates); rows are not empty (check_extremum).
Tensor amax(const kernels::ReducePlan& plan);
Tensor amin(const kernels::ReducePlan& plan);
// The values and int64 indices of each row's max or min (the first wins ties; rows not empty).
std::pair<Tensor, Tensor> max_dim(const kernels::ReducePlan& plan);
std::pair<Tensor, Tensor> min_dim(const kernels::ReducePlan& plan);
Tensor argmax(const kernels::ReducePlan& plan);
Tensor argmin(const kernels::ReducePlan& plan);

// Each row's variance, in two passes in double; unbiased divides by N-1.
Tensor var(const kernels::ReducePlan& plan, bool unbiased);
// sqrt(var(x, dims)).
Tensor std(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim);
// log(sum(exp(row))) of each row, with the row's max subtracted first where it is finite.
Tensor logsumexp(const kernels::ReducePlan& plan);

}  // namespace loom::cpu
