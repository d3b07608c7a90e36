// tensor/cuda/optim.h — the optimizers' fused updates on CUDA tensors (tensor/optim.h): the
// arithmetic of tensor/cpu/optim.cpp, each call updating its list in as few launches as Note
// [Tensor lists] (tensor/cuda/tensor_list.h) allows. Host-only header.
#pragma once

#include <span>

#include "tensor/optim.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// The kernels behind tensor/optim.h's front, which has checked the list: one dtype (float32 or
// float64) and one device for every entry, dense tensors stored alike.
using kernels::AdamStep;
using kernels::AdamTensors;
using kernels::SgdStep;
using kernels::SgdTensors;

void sgd_update(std::span<const SgdTensors> list, const SgdStep& s);
void adam_update(std::span<const AdamTensors> list, const AdamStep& s);
void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf);

}  // namespace loom::cuda
