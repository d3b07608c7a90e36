// autograd/ops/reduce.h — differentiable reductions over any set of dims (empty: all dims).
#pragma once

#include <optional>
#include <utility>

#include "tensor/tensor.h"

namespace loom {

Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Max/min over dims; the gradient is shared evenly among tied maxima (as PyTorch's amax).
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);  // over everything
Tensor min(const Tensor& x);
// Values and int64 indices along one dim; the gradient goes to the chosen index.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor std(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);

}  // namespace loom
