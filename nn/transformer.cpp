// nn/transformer.cpp — MultiheadAttention and TransformerEncoderLayer (nn/transformer.h): their
// construction with PyTorch's initialisation, the argument checks, the masks brought to the one
// mask the fused attention takes (Note [Attention masks]), and the encoder layer's two orders.

#include "nn/transformer.h"

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/ops.h"
#include "nn/init.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/view.h"

namespace loom::nn {

namespace {

// PyTorch names MultiheadAttention's output projection so (a Linear that its dynamic quantisation
// leaves alone); the name shows only in the printed form.
class NonDynamicallyQuantizableLinear : public Linear {
 public:
  NonDynamicallyQuantizableLinear(int64_t in, int64_t out, bool bias) : Linear(in, out, bias) {
    set_type_name("NonDynamicallyQuantizableLinear");
  }
};

// A mask is bool or of the query's dtype, on the query's device, and has one of `shapes`.
void check_mask(const char* name, const Tensor& mask, const Tensor& query,
                const std::vector<Shape>& shapes, const std::string& expected) {
  LOOM_CHECK(mask.dtype() == kBool || mask.dtype() == query.dtype(), DTypeError,
             "MultiheadAttention: ", name, " must be bool or of the query's dtype ", query.dtype(),
             "; got ", mask.dtype());
  LOOM_CHECK(mask.device() == query.device(), DeviceError, "MultiheadAttention: ", name, " is on ",
             mask.device(), " but the query is on ", query.device());
  bool fits = false;
  for (const Shape& shape : shapes) fits = fits || mask.sizes() == shape;
  LOOM_CHECK(fits, ShapeError, "MultiheadAttention: ", name, " must be ", expected, "; got ", name,
             "=", mask.sizes());
}

// [L, S] bool, true where key j > query i: what is_causal forbids (top-left aligned).
Tensor causal_forbidden(int64_t target_len, int64_t source_len, Device device) {
  const Tensor queries =
      kernels::reshape(arange(0, static_cast<double>(target_len), 1, kInt64), {target_len, 1});
  const Tensor keys = arange(0, static_cast<double>(source_len), 1, kInt64);
  const Tensor forbidden = kernels::gt(keys, queries);
  return device == forbidden.device() ? forbidden : kernels::to_device(forbidden, device);
}

// The masks of Note [Attention masks] (each 4-D, broadcastable to [N, H, L, S], or undefined) as
// the one mask scaled_dot_product_attention takes: bool with true where attention is allowed
// when both are boolean, otherwise their sum as float masks (a boolean one -inf where true).
Tensor merged_mask(const Tensor& padding, const Tensor& attn, DType dtype, Device device) {
  std::vector<Tensor> masks;
  for (const Tensor& m : {padding, attn})
    if (m.defined()) masks.push_back(m);
  if (masks.empty()) return Tensor();
  bool all_bool = true;
  for (const Tensor& m : masks) all_bool = all_bool && m.dtype() == kBool;
  if (all_bool) {  // allowed = !(padding || attn), counted in uint8 (bool has no arithmetic)
    Tensor forbidden = kernels::to_dtype(masks[0], kUInt8);
    for (size_t i = 1; i < masks.size(); ++i)
      forbidden = kernels::add(forbidden, kernels::to_dtype(masks[i], kUInt8));
    return kernels::eq_scalar(forbidden, 0.0);
  }
  const Tensor minus_inf = scalar_tensor(-std::numeric_limits<double>::infinity(), dtype, device);
  const Tensor zero = scalar_tensor(0.0, dtype, device);
  Tensor sum;
  for (const Tensor& m : masks) {
    const Tensor additive = m.dtype() == kBool ? kernels::where(m, minus_inf, zero) : m;
    sum = sum.defined() ? kernels::add(sum, additive) : additive;
  }
  return sum;
}

struct FusedMask {
  Tensor mask;  // undefined, bool (true: attend) or float (added to the scores)
  bool is_causal = false;
};

// Note [Attention masks] for the fused op: the masks as 4-D views (key_padding_mask
// [N, 1, 1, S]; attn_mask [1, 1, L, S] or [N, H, L, S]) merged into one, and is_causal.
FusedMask fused_mask(const MultiheadAttention::AttentionDims& dims, int64_t heads,
                     const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal,
                     DType dtype, Device device) {
  const int64_t n = dims.batch, target_len = dims.target_len, source_len = dims.source_len;
  const Tensor padding = key_padding_mask.defined()
                             ? kernels::reshape(key_padding_mask, {n, 1, 1, source_len})
                             : Tensor();
  Tensor attn;
  if (attn_mask.defined())
    attn = attn_mask.dim() == 2 ? kernels::reshape(attn_mask, {1, 1, target_len, source_len})
                                : kernels::reshape(attn_mask, {n, heads, target_len, source_len});
  if (is_causal && !attn.defined()) {
    if (!padding.defined()) return {Tensor(), true};  // the kernel's own causal path
    attn = kernels::reshape(causal_forbidden(target_len, source_len, device),
                            {1, 1, target_len, source_len});
  }
  return {merged_mask(padding, attn, dtype, device), false};
}

}  // namespace

// ------------------------------------------------------------------ MultiheadAttention

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, MultiheadAttentionOptions opt)
    : Module("MultiheadAttention"),
      embed_dim(e),
      num_heads(h),
      head_dim(h > 0 ? e / h : 0),
      options(opt) {
  LOOM_CHECK(e > 0, ValueError, "MultiheadAttention: embed_dim must be positive; got ", e);
  LOOM_CHECK(h > 0, ValueError, "MultiheadAttention: num_heads must be positive; got ", h);
  LOOM_CHECK(e % h == 0, ValueError, "MultiheadAttention: embed_dim (", e,
             ") must be divisible by num_heads (", h, ")");
  LOOM_CHECK(opt.dropout >= 0 && opt.dropout <= 1, ValueError,
             "MultiheadAttention: dropout must be in [0, 1]; got ", opt.dropout);
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * e, e}));
  in_proj_bias = register_parameter("in_proj_bias", opt.bias ? zeros({3 * e}) : Tensor());
  out_proj = register_module(
      "out_proj",
      std::static_pointer_cast<Linear>(make<NonDynamicallyQuantizableLinear>(e, e, opt.bias)));
  init::xavier_uniform_(in_proj_weight);
  if (opt.bias) init::zeros_(out_proj->bias);
}

// x [..., E] -> [..., E] through rows [block E, (block + 1) E) of the packed in-projection.
Tensor MultiheadAttention::project(const Tensor& x, int64_t block) const {
  const Tensor bias =
      in_proj_bias.defined() ? in_proj_bias.narrow(0, block * embed_dim, embed_dim) : Tensor();
  return linear(x, in_proj_weight.narrow(0, block * embed_dim, embed_dim), bias);
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask,
                                   bool is_causal) {
  const AttentionDims dims = check_arguments(query, key, value, key_padding_mask, attn_mask);
  const int64_t n = dims.batch, target_len = dims.target_len, source_len = dims.source_len;
  const bool batch_first = dims.batch_first;

  // The three projections, split into heads: [N, H, T, hd] views with a unit last stride.
  auto batch = [&](const Tensor& x) { return dims.batched ? x : x.unsqueeze(1); };
  auto split_heads = [&](const Tensor& x, int64_t len) {
    return batch_first ? x.reshape({n, len, num_heads, head_dim}).transpose(1, 2)
                       : x.reshape({len, n, num_heads, head_dim}).permute({1, 2, 0, 3});
  };
  Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {  // one product: [T, N, 3E] -> [3, N, H, T, hd]
    const Tensor qkv = linear(batch(query), in_proj_weight, in_proj_bias);
    const Tensor heads =
        batch_first ? qkv.reshape({n, target_len, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4})
                    : qkv.reshape({target_len, n, 3, num_heads, head_dim}).permute({2, 1, 3, 0, 4});
    q = heads.select(0, 0);
    k = heads.select(0, 1);
    v = heads.select(0, 2);
  } else {
    q = split_heads(project(batch(query), 0), target_len);
    k = split_heads(project(batch(key), 1), source_len);
    v = split_heads(project(batch(value), 2), source_len);
  }

  const FusedMask mask = fused_mask(dims, num_heads, key_padding_mask, attn_mask, is_causal,
                                    query.dtype(), query.device());
  // [N, H, L, hd], laid out as [N, L, H, hd] (Note [Fused attention]).
  const Tensor attended = scaled_dot_product_attention(
      q, k, v, mask.mask, is_training() ? options.dropout : 0.0, mask.is_causal);
  const Tensor merged = batch_first
                            ? attended.transpose(1, 2).reshape({n, target_len, embed_dim})
                            : attended.permute({2, 0, 1, 3}).reshape({target_len, n, embed_dim});
  const Tensor out = out_proj->forward(merged);
  return dims.batched ? out : out.squeeze(1);
}

MultiheadAttention::AttentionDims MultiheadAttention::check_arguments(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask,
    const Tensor& attn_mask) const {
  LOOM_CHECK((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() &&
                 value.dim() == query.dim(),
             ShapeError,
             "MultiheadAttention: expected query, key and value all 3-D (batched) or all 2-D "
             "(unbatched); got query=",
             query.sizes(), " key=", key.sizes(), " value=", value.sizes());
  LOOM_CHECK(
      query.size(-1) == embed_dim && key.size(-1) == embed_dim && value.size(-1) == embed_dim,
      ShapeError, "MultiheadAttention: expected embed_dim=", embed_dim,
      " features in the last dim of query, key and value (kdim and vdim other than "
      "embed_dim are not supported); got query=",
      query.sizes(), " key=", key.sizes(), " value=", value.sizes());
  LOOM_CHECK(key.sizes() == value.sizes(), ShapeError,
             "MultiheadAttention: key and value must have the same shape; got key=", key.sizes(),
             " value=", value.sizes());
  LOOM_CHECK(
      is_floating(query.dtype()) && key.dtype() == query.dtype() && value.dtype() == query.dtype(),
      DTypeError, "MultiheadAttention: expected floating query, key and value of one dtype; got ",
      query.dtype(), ", ", key.dtype(), ", ", value.dtype());

  // Unbatched inputs run as a batch of one in the [L, N, E] layout, whatever batch_first.
  AttentionDims dims;
  dims.batched = query.dim() == 3;
  dims.batch_first = dims.batched && options.batch_first;
  const int64_t batch_dim = dims.batch_first ? 0 : 1, seq_dim = dims.batch_first ? 1 : 0;
  LOOM_CHECK(!dims.batched || query.size(batch_dim) == key.size(batch_dim), ShapeError,
             "MultiheadAttention: query and key must have the same batch size (dim ", batch_dim,
             dims.batch_first ? ", batch_first" : "", "); got query=", query.sizes(),
             " key=", key.sizes());
  dims.batch = dims.batched ? query.size(batch_dim) : 1;
  dims.target_len = query.size(seq_dim);
  dims.source_len = key.size(seq_dim);

  if (key_padding_mask.defined()) {
    const Shape shape = dims.batched ? Shape{dims.batch, dims.source_len} : Shape{dims.source_len};
    check_mask("key_padding_mask", key_padding_mask, query, {shape},
               detail::str(dims.batched ? "[N, S] = " : "[S] = ", shape));
  }
  if (attn_mask.defined()) {
    const Shape two_d{dims.target_len, dims.source_len},
        three_d{dims.batched ? dims.batch * num_heads : num_heads, dims.target_len,
                dims.source_len};
    check_mask("attn_mask", attn_mask, query, {two_d, three_d},
               detail::str("[L, S] = ", two_d,
                           dims.batched ? " or [N*num_heads, L, S] = " : " or [num_heads, L, S] = ",
                           three_d));
  }
  return dims;
}

// ------------------------------------------------------------------ TransformerEncoderLayer

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d, int64_t h,
                                                 TransformerEncoderLayerOptions opt)
    : Module("TransformerEncoderLayer"), d_model(d), nhead(h), options(opt) {
  LOOM_CHECK(opt.dim_feedforward > 0, ValueError,
             "TransformerEncoderLayer: dim_feedforward must be positive; got ",
             opt.dim_feedforward);
  const MultiheadAttentionOptions attention{
      .dropout = opt.dropout, .bias = opt.bias, .batch_first = opt.batch_first};
  const LayerNormOptions norm{.eps = opt.layer_norm_eps, .bias = opt.bias};
  self_attn = register_module("self_attn", make<MultiheadAttention>(d, h, attention));
  linear1 = register_module("linear1", make<Linear>(d, opt.dim_feedforward, opt.bias));
  dropout = register_module("dropout", make<Dropout>(opt.dropout));
  linear2 = register_module("linear2", make<Linear>(opt.dim_feedforward, d, opt.bias));
  norm1 = register_module("norm1", make<LayerNorm>(d, norm));
  norm2 = register_module("norm2", make<LayerNorm>(d, norm));
  dropout1 = register_module("dropout1", make<Dropout>(opt.dropout));
  dropout2 = register_module("dropout2", make<Dropout>(opt.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return forward(src, Tensor()); }

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  LOOM_CHECK((src.dim() == 3 || src.dim() == 2) && src.size(-1) == d_model, ShapeError,
             "TransformerEncoderLayer: expected src [S, N, d_model] ([N, S, d_model] with "
             "batch_first) or unbatched [S, d_model], with d_model=",
             d_model, "; got src=", src.sizes());
  Tensor x = src;
  if (options.norm_first) {
    x = x + self_attention_block(norm1->forward(x), src_mask, src_key_padding_mask, is_causal);
    x = x + feed_forward_block(norm2->forward(x));
  } else {
    x = norm1->forward(x + self_attention_block(x, src_mask, src_key_padding_mask, is_causal));
    x = norm2->forward(x + feed_forward_block(x));
  }
  return x;
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& src_mask,
                                                     const Tensor& src_key_padding_mask,
                                                     bool is_causal) {
  return dropout1->forward(self_attn->forward(x, x, x, src_key_padding_mask, src_mask, is_causal));
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  const Tensor hidden = linear1->forward(x);
  const Tensor activated =
      options.activation == TransformerActivation::kGelu ? gelu(hidden) : relu(hidden);
  return dropout2->forward(linear2->forward(dropout->forward(activated)));
}

}  // namespace loom::nn
