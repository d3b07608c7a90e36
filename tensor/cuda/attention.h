// tensor/cuda/attention.h — the CUDA fused scaled dot-product attention behind tensor/attention.h:
// the same contract (Note [Fused attention]) as the loom::kernels entries, which check the
// arguments and switch here for CUDA tensors. FlashAttention-2 kernels, Note [CUDA flash
// attention] in tensor/cuda/attention.cu. Host-only header.
//
// Head dims E and Ev up to 128 (kMaxAttentionHeadDim); larger ones raise ValueError naming
// scaled_dot_product_attention and the shapes. The tiles live in shared memory: up to about
// 116 KB per block with E = Ev = 128, more than some GPUs give a block (DeviceError then).
#pragma once

#include <cstdint>

#include "tensor/attention.h"
#include "tensor/tensor.h"

namespace loom::cuda {

inline constexpr int64_t kMaxAttentionHeadDim = 128;

kernels::AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kernels::AttentionOptions& options);
kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionOptions& options);

}  // namespace loom::cuda
