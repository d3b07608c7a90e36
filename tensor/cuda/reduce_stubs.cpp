// tensor/cuda/reduce_stubs.cpp — the CUDA reductions in a build without CUDA: no tensor lives on
// a GPU there, so each raises DeviceError (tensor/cuda/stubs.h).

#include "tensor/cuda/reduce.h"
#include "tensor/cuda/stubs.h"

namespace loom::cuda {

Tensor sum(const Tensor&, const Shape&, bool) { built_without_cuda("sum"); }
Tensor mean(const Tensor&, const Shape&, bool) { built_without_cuda("mean"); }
Tensor sum_to(const Tensor&, const Shape&) { built_without_cuda("sum_to"); }
Tensor amax(const Tensor&, const Shape&, bool) { built_without_cuda("amax"); }
Tensor amin(const Tensor&, const Shape&, bool) { built_without_cuda("amin"); }
std::pair<Tensor, Tensor> max_dim(const Tensor&, int64_t, bool) { built_without_cuda("max"); }
std::pair<Tensor, Tensor> min_dim(const Tensor&, int64_t, bool) { built_without_cuda("min"); }
Tensor argmax(const Tensor&, std::optional<int64_t>, bool) { built_without_cuda("argmax"); }
Tensor argmin(const Tensor&, std::optional<int64_t>, bool) { built_without_cuda("argmin"); }
Tensor var(const Tensor&, const Shape&, bool, bool) { built_without_cuda("var"); }
Tensor std(const Tensor&, const Shape&, bool, bool) { built_without_cuda("std"); }
Tensor logsumexp(const Tensor&, const Shape&, bool) { built_without_cuda("logsumexp"); }
Tensor contiguous_as(const Tensor&, DType, MemoryFormat) { built_without_cuda("contiguous_as"); }

}  // namespace loom::cuda
