// tensor/cuda/reduce.h — the CUDA reductions behind tensor/reduce.h: same names, signatures and
// results as the loom::kernels ones (the front, tensor/reduce.cpp, checks the arguments, then
// switches here for CUDA tensors). Host-only header; the kernels live in tensor/cuda/reduce.cu.
#pragma once

#include <optional>
#include <utility>

#include "tensor/reduce.h"
#include "tensor/tensor.h"

namespace loom::cuda {

Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor std(const Tensor& x, const Shape& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);

// x dense in `format` and of `dtype` (one copy on the device, kernels::copy_, when it is not):
// x itself when it already is both. The loss and norm kernels read their inputs
// through it.
Tensor contiguous_as(const Tensor& x, DType dtype, MemoryFormat format = MemoryFormat::kContiguous);

}  // namespace loom::cuda
