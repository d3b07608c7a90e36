// nn/transformer.h — nn::MultiheadAttention and nn::TransformerEncoderLayer with PyTorch's
// options, semantics, initialisation and state-dict keys, so that a PyTorch state dict loads. The
// attention itself is loom::scaled_dot_product_attention, one fused op that never forms the
// [L, S] weights (Note [Fused attention], tensor/attention.h).
//
// Shape legend: L = target (query) length, S = source (key) length, N = batch, E = embed_dim,
// H = num_heads, hd = E / H (head_dim).
//
// Note [Attention masks]
// ~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's nn.MultiheadAttention takes its masks in the opposite boolean sense to
// F.scaled_dot_product_attention: here TRUE means "may NOT attend".
// - key_padding_mask [N, S] ([S] unbatched): true ignores that key for every query of that batch
//   element; a float mask (of the query's dtype) is added to the scores instead.
// - attn_mask [L, S] or [N*H, L, S] ([H, L, S] unbatched; row n*H + h is batch n, head h): true
//   forbids query i to attend to key j; a float mask is added.
// - Both given: a query may attend where neither forbids it; float masks add (a boolean one counts
//   as -inf where true, 0 elsewhere), as PyTorch 2's MultiheadAttention merges them.
// - is_causal: query i sees keys j <= i (top-left aligned, SDPA's convention). Alone it goes to
//   the fused kernel as its is_causal; with a key_padding_mask the causal mask is formed and merged
//   with it. With an attn_mask given, the attn_mask is used as it is (PyTorch 2 requires the
//   attn_mask with is_causal and takes is_causal as a hint that it is causal; loom needs neither).
// loom hands the fused kernel one mask: bool (true: attend) when every mask is boolean, otherwise
// one float mask. Masks get no gradient. A query whose every key is masked gives 0 (the fused
// kernel's convention, Note [Fused attention]) where PyTorch's math path gives NaN.
//
// Left out, compared with PyTorch: need_weights (loom returns the output only; the fused kernel
// never holds the attention weights, so there is no need_weights=true path), kdim/vdim other than
// embed_dim (so no q/k/v_proj_weight), add_bias_kv and add_zero_attn; these options do not exist.
// TransformerEncoderLayer's activation is relu or gelu (no custom callable).
#pragma once

#include <memory>
#include <string>

#include "nn/layers.h"
#include "nn/module.h"

namespace loom::nn {

struct MultiheadAttentionOptions {
  double dropout = 0.0;      // on the attention weights, in training mode only
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // inputs and output [N, L, E] instead of [L, N, E]
};

// PyTorch's nn.MultiheadAttention: out = out_proj(concat_h softmax(q_h k_h^T / sqrt(hd) + mask)
// v_h), with q, k, v the three E-row blocks of in_proj_weight [3E, E] (and in_proj_bias [3E])
// applied to query, key and value. Keys: in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias. Initialisation as PyTorch's: xavier_uniform_ in_proj_weight, out_proj.weight as
// Linear's default, both biases zero.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});

  // Module's single-input forward raises NotImplementedError: attention takes query, key, value.
  using Module::forward;

  // query [L, N, E], key and value [S, N, E] ([N, L, E], [N, S, E] with batch_first; unbatched
  // [L, E], [S, E] whatever batch_first) -> [L, N, E] ([N, L, E]; [L, E]). The masks as in
  // Note [Attention masks]. When query, key and value are one tensor (self-attention), the three
  // projections are one matrix product.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                 bool is_causal = false);

  const int64_t embed_dim, num_heads, head_dim;
  const MultiheadAttentionOptions options;
  Tensor in_proj_weight, in_proj_bias;  // [3E, E], [3E] (undefined without bias)
  std::shared_ptr<Linear> out_proj;  // E -> E; prints as PyTorch's NonDynamicallyQuantizableLinear

  // What forward reads off its checked arguments (unbatched: a batch of 1, not batch_first).
  struct AttentionDims {
    bool batched = true, batch_first = false;
    int64_t batch = 0, target_len = 0, source_len = 0;  // N, L, S
  };

 private:
  AttentionDims check_arguments(const Tensor& query, const Tensor& key, const Tensor& value,
                                const Tensor& key_padding_mask, const Tensor& attn_mask) const;
  Tensor project(const Tensor& x, int64_t block) const;
};

enum class TransformerActivation { kRelu, kGelu };

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;  // on the attention weights, after attention, inside and after the MLP
  TransformerActivation activation = TransformerActivation::kRelu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;  // src [N, S, E] instead of [S, N, E]
  bool norm_first = false;   // pre-norm instead of post-norm
  bool bias = true;          // in the attention, both linears and both norms (PyTorch 2.1's bias)
};

// PyTorch's nn.TransformerEncoderLayer, with its children's names (self_attn, linear1, dropout,
// linear2, norm1, norm2, dropout1, dropout2) and so its keys (self_attn.in_proj_weight,
// linear1.weight, norm2.bias, ...):
//   post-norm: x = norm1(x + sa(x));  x = norm2(x + ff(x))
//   pre-norm:  x = x + sa(norm1(x));  x = x + ff(norm2(x))
// with sa(x) = dropout1(self_attn(x, x, x)) and ff(x) =
// dropout2(linear2(dropout(act(linear1(x))))).
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                          TransformerEncoderLayerOptions options = {});

  Tensor forward(const Tensor& src) override;  // no masks: chains in a Sequential
  // src [S, N, E] ([N, S, E] with batch_first; unbatched [S, E]) -> the same shape. src_mask is
  // self_attn's attn_mask, src_key_padding_mask its key_padding_mask (Note [Attention masks]).
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);

  const int64_t d_model, nhead;
  const TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& src_mask,
                              const Tensor& src_key_padding_mask, bool is_causal);
  Tensor feed_forward_block(const Tensor& x);
};

}  // namespace loom::nn
