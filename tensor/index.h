// tensor/index.h — kernels that join, split and index tensors: cat, stack, split, gather,
// scatter_add, index_select/index_add, one_hot, embedding and dropout's masked scaling.
// Not differentiable: autograd/ops/index.cpp wraps each with its backward. tensor/index.cpp
// checks the arguments and picks the device; tensor/cpu/index.cpp and tensor/cuda/index.cu hold
// the loops and the kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom::kernels {

// --- joining and splitting ---
// Concatenates along dim. Shapes must agree except in dim; dtypes promote (promote_types);
// 1-D tensors of size 0 are skipped, as PyTorch does.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// cat's arguments checked (cat's errors all come from here) and its output worked out, shared
// by the CPU and CUDA cat.
struct CatPlan {
  DType dtype = kFloat32;     // the inputs' promoted dtype
  int64_t dim = 0;            // wrapped
  Shape out_shape;            // [0] when every input is an empty 1-D tensor
  std::vector<Tensor> parts;  // the inputs to copy, in order (empty 1-D ones left out)
};
CatPlan plan_cat(const std::vector<Tensor>& tensors, int64_t dim);
// Joins tensors of one shape along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// The sizes of the pieces split / chunk produce along dim (checks the arguments).
Shape split_sizes(const Tensor& x, int64_t split_size, int64_t dim);
Shape chunk_sizes(const Tensor& x, int64_t chunks, int64_t dim);
// Views of x, one per size along dim; the sizes must be >= 0 and sum to x.size(dim).
std::vector<Tensor> split_with_sizes(const Tensor& x, const Shape& sizes, int64_t dim);

// --- indexing (index: an int64 or int32 tensor; negative values are out of range) ---
// Rows of x along dim picked by a 1-D (or 0-d) index.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Its output shape for the wrapped dim d, once the index is known in range (both devices): x's
// with index.numel() in dim d; a 0-d x takes one index (ShapeError) and gives a 0-d result.
Shape index_select_shape(const Tensor& x, int64_t d, const Tensor& index);
// self[..., index[j], ...] += src[..., j, ...] along dim (duplicates accumulate). self must be
// contiguous; bumps its version.
void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// out[i][j] = x[index[i][j]][j] for dim 0, and likewise for other dims (torch.gather).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// self[index[i][j]][j] += src[i][j] for dim 0, ... (torch.scatter_add_). Bumps self's version.
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// A copy of x with src scattered in (scatter_add_ on a clone).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// int64 [..., num_classes]; num_classes = -1 uses max(index) + 1.
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);

// --- embedding ---
// weight [V, D], index [...] -> [..., D].
Tensor embedding(const Tensor& weight, const Tensor& index);
// dweight [V, D] (dout's dtype): row v is the sum of the dout rows whose index is v, in index
// order; rows equal to padding_idx (-1: none) stay zero.
Tensor embedding_backward(const Tensor& dout, const Tensor& index, int64_t num_weights,
                          int64_t padding_idx);

// --- dropout ---
// Note [Dropout mask]
// Element i (row-major over the tensor's shape) is kept when u_i >= p, where u_i is the
// float uniform that rand() would draw for element i from (seed, first): lane i%4 of
// philox4x32(seed, first + i/4), through uniform_float. So after manual_seed(s),
// dropout(x, p) equals x * (rand(x.sizes()) >= p) / (1 - p) for the same s, whatever the thread
// count. dropout takes ceil(n/4) counters from the default generator (as rand does), and its
// backward recomputes the mask from (seed, first) instead of saving it: no n-byte mask kept
// alive between forward and backward, for one Philox evaluation per 4 elements.
//
// x * mask_i / (1 - p) with the mask above, for 0 < p < 1; out is contiguous. Serves forward
// (on x) and backward (on dout) alike.
Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first);

}  // namespace loom::kernels
