// autograd/ops/attention.h — differentiable scaled dot-product attention, one fused op.
#pragma once

#include <optional>

#include "tensor/tensor.h"

namespace loom {

// softmax(q k^T scale + attn_mask) v with PyTorch's F.scaled_dot_product_attention semantics:
// q [..., L, E], k [..., S, E], v [..., S, Ev] with equal leading dims -> [..., L, Ev].
// attn_mask: undefined, bool (true: take part in attention) or a float mask of q's dtype added
// to the scores, broadcastable to [..., L, S]. is_causal: query i attends to keys j <= i (not
// together with attn_mask). dropout_p: applied to the attention weights (pass 0 outside
// training). scale: 1/sqrt(E) when not given.
// One fused kernel pair that never holds the [L, S] scores (Note [Fused attention],
// tensor/attention.h); the backward recomputes them from the saved row log-sum-exp. The result
// of a 4-D q [N, H, L, E] is laid out as [N, L, H, Ev], so out.transpose(1, 2) is contiguous.
// Under autocast, q, k, v (and a float mask) run in the region's 16-bit dtype with float32
// softmax statistics.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace loom
