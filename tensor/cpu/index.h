// tensor/cpu/index.h — the CPU loops of the joining and indexing kernels (tensor/index.h, whose
// front in tensor/index.cpp checks the arguments, the index ranges included, and calls these for
// CPU tensors). `idx` is always the index as contiguous int64, every value in range; `d` a
// wrapped dim.
#pragma once

#include <cstdint>

#include "tensor/index.h"

namespace loom::cpu {

// The position of the first value of idx outside [0, limit), or -1 (any idx values).
int64_t first_out_of_range(const Tensor& idx, int64_t limit);

// The plan's parts (checked, in order) joined along plan.dim into a fresh tensor.
Tensor cat(const kernels::CatPlan& plan);

// x's rows along d at idx, into a fresh tensor of out_shape (index_select_shape).
Tensor index_select(const Tensor& x, int64_t d, const Tensor& idx, const Shape& out_shape);
// self (contiguous) += src's rows along d at rows idx; src of self's dtype and matching shape.
void index_add_(const Tensor& self, int64_t d, const Tensor& idx, const Tensor& src);
// x's elements at idx along d, of idx's shape (no larger than x off d).
Tensor gather(const Tensor& x, int64_t d, const Tensor& idx);
// self[.., idx, ..] += src along d; shapes checked, self without overlapping elements. `op`
// names the entry in a dtype error.
void scatter_add_into(const Tensor& self, int64_t d, const Tensor& idx, const Tensor& src,
                      const char* op);
// int64 [idx.shape, num_classes], 1 at each idx value.
Tensor one_hot(const Tensor& idx, int64_t num_classes);

// weight [V, D] rows at idx: [idx.shape, D].
Tensor embedding(const Tensor& weight, const Tensor& idx);
// dweight [num_weights, D] from dout [idx.shape, D] (float32 or float64), padding_idx's row zero.
Tensor embedding_backward(const Tensor& dout, const Tensor& idx, int64_t num_weights,
                          int64_t padding_idx);

// x * mask / (1 - p) by Note [Dropout mask] (tensor/index.h); 0 < p < 1, float32 or float64 x.
Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first);

}  // namespace loom::cpu
