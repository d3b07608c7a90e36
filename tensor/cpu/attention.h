// tensor/cpu/attention.h — the CPU loops of the fused attention (tensor/attention.h, whose front
// checks the arguments and calls these with the kernels' contract of Note [Fused attention]):
// q, k, v [N, H, *, E] of float32 or float64 (the front widens 16-bit ones), the mask [N, H, L, S]
// or undefined.
#pragma once

#include "tensor/attention.h"

namespace loom::cpu {

// Forward: one work item per (n, h, block of query rows), keys visited block by block.
kernels::AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kernels::AttentionOptions& options);
// Backward: one work item per (n, h), which owns its rows of dq, dk and dv (no reduction
// across threads), visiting key blocks and, within each, every query row that can see them.
kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionOptions& options);

}  // namespace loom::cpu
