// tensor/cuda/index.h — CUDA versions of tensor/index.h's kernels that need a kernel (stack and
// split stay host-side: views and cat). Same names, arguments and results as loom::kernels::;
// the front, tensor/index.cpp, checks the arguments on the host, then calls them for CUDA tensors
// (through tensor/cuda_backend.h).
// Host-only header.
//
// Index tensors (int64 or int32, any strides) are range-checked here against the data, with the
// CPU's IndexError message: the value is on the device, so the check waits for it (one small copy
// back). index_add_, scatter_add_ and embedding_backward copy the index to the host to group the
// positions by destination (a counting or stable sort), then sum each destination on one thread
// in index order: bitwise reproducible, and bitwise equal to the CPU (Note [Race-free index_add]).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom::cuda {

// Works from kernels::plan_cat (the CPU's checks and output shape): promotes dtypes, skips empty
// 1-D tensors. All tensors on one CUDA device.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// scatter_add_ raising its errors under `op` ("scatter_add_" or "scatter_add"): what the CPU's
// scatter_add_into calls after its argument checks.
void scatter_add_into(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const char* op);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor one_hot(const Tensor& index, int64_t num_classes);
Tensor embedding(const Tensor& weight, const Tensor& index);
Tensor embedding_backward(const Tensor& dout, const Tensor& index, int64_t num_weights,
                          int64_t padding_idx);
// Note [Dropout mask] (tensor/index.h): the same mask as the CPU, bit for bit.
Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first);

}  // namespace loom::cuda
