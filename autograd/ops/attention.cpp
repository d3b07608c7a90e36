// autograd/ops/attention.cpp — scaled_dot_product_attention: the fused kernels of
// tensor/attention.h and the backward right below the forward. Its autocast rule is applied by
// its entry in autograd/autocast_ops.cpp.

#include "autograd/ops/attention.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "tensor/attention.h"
#include "tensor/random.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

// d attention (Note [Fused attention]): from the saved out and row log-sum-exp, the backward
// recomputes the scores block by block; dropout's mask is recomputed from the forward's
// (seed, first). The mask gets no gradient (as PyTorch's fused kernels).
Tensor ops_impl::scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& attn_mask, double dropout_p,
                                              bool is_causal, std::optional<double> scale) {
  k::AttentionOptions o;
  o.mask = attn_mask;
  o.is_causal = is_causal;
  o.scale = scale.has_value() ? *scale
                              : 1.0 / std::sqrt(static_cast<double>(q.dim() > 0 ? q.size(-1) : 1));
  o.dropout_p = dropout_p;
  if (dropout_p > 0.0 && dropout_p < 1.0 && q.dim() >= 2 && k.dim() >= 2) {
    // One Philox counter per four weights of the [..., L, S] attention (Note [Dropout mask]).
    const int64_t weights = q.numel() / std::max<int64_t>(q.size(-1), 1) * k.size(-2);
    Generator& gen = default_generator();
    o.seed = gen.seed();
    o.first = gen.reserve(static_cast<uint64_t>((weights + 3) / 4));
  }
  k::AttentionForward f = k::attention_forward(q, k, v, o);
  return record("scaled_dot_product_attention", f.out, {q, k, v}, {q, k, v, f.out, f.lse},
                [o](const Grads& dout, Saved& s, Grads& g) {
                  k::AttentionGrads r =
                      k::attention_backward(dout[0], s[0], s[1], s[2], s[3], s[4], o);
                  g[0] = r.dq;
                  g[1] = r.dk;
                  g[2] = r.dv;
                });
}

}  // namespace loom
