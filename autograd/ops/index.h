// autograd/ops/index.h — joining, splitting and indexing ops, embedding and dropout.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Pieces of split_size along dim (the last may be smaller), as views.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// index: int64/int32 1-D
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j] = x[index[i][j]][j] (dim 0), ... as torch.gather
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x with out[index[i][j]][j] += src[i][j] (dim 0), ... as torch.scatter_add
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// int64 [...] -> int64 [..., num_classes] (num_classes -1: max + 1)
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);

// weight [V, D], index int64 [...] -> [..., D]; rows equal to padding_idx get no gradient.
Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx = -1);
// Zeroes each element with probability p and scales the rest by 1/(1-p), when training. The
// mask comes from the default Philox generator (see Note [Philox streams]).
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

}  // namespace loom
