// tests/nn/transformer_test.cpp — nn::MultiheadAttention and nn::TransformerEncoderLayer against
// PyTorch: each case of tests/golden/transformer.safetensors (tools/make_transformer_golden.py)
// loads PyTorch's state dict into loom's module, runs forward and backward in float64, and
// compares the output and the gradients of the inputs and of some parameters. Then what the
// fixture cannot hold: the masks' equivalent forms, is_causal, unbatched and batch_first
// layouts, dropout in train and eval mode, initialisation, key lists, printed forms and errors.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "nn/nn.h"
#include "tensor/accelerator.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

// float64 against float64: only the order of summation differs from PyTorch's math path.
constexpr double kRtol = 1e-10;
constexpr double kAtol = 1e-12;

const SafetensorsFile& golden() {
  static const SafetensorsFile file =
      load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/transformer.safetensors");
  return file;
}

const std::string& setting(const std::string& c, const std::string& name) {
  return golden().metadata.at(c + "." + name);
}
bool flag(const std::string& c, const std::string& name) { return setting(c, name) == "true"; }

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

std::vector<std::string> keys(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(name);
  return out;
}

// The case's PyTorch state dict ("<case>.state.<key>" in the file).
NamedTensors state(const std::string& c) {
  const std::string prefix = c + ".state.";
  NamedTensors out;
  for (const auto& [name, t] : golden().tensors)
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

Tensor optional(const std::string& key) {
  return golden().contains(key) ? golden().at(key) : Tensor();
}

// A fresh leaf that requires grad, holding a copy of the fixture's tensor.
Tensor leaf(const std::string& key) {
  Tensor t = golden().at(key).clone();
  t.requires_grad_();
  return t;
}

::testing::AssertionResult matches(const Tensor& actual, const std::string& key,
                                   double rtol = kRtol, double atol = kAtol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << key << ": loom's is undefined";
  const auto result = tensors_close(actual, golden().at(key), rtol, atol);
  if (!result) return ::testing::AssertionFailure() << key << ": " << result.message();
  return result;
}

// The parameters whose gradients the fixture holds ("<case>.grad.<key>") against loom's.
void expect_parameter_grads(const Module& m, const std::string& c) {
  const std::string prefix = c + ".grad.";
  int checked = 0;
  for (const auto& [name, t] : golden().tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string key = name.substr(prefix.size());
    for (const auto& [param, p] : m.named_parameters())
      if (param == key) {
        EXPECT_TRUE(matches(p.grad(), name)) << c;
        ++checked;
      }
  }
  EXPECT_GE(checked, 2) << c;
}

// ------------------------------------------------------------------ the golden cases

// PyTorch's keys and printed form, then the case's state in float64, in eval mode.
void load_golden_state(Module& m, const std::string& c) {
  EXPECT_EQ(keys(m), split(setting(c, "state_keys"))) << c;
  EXPECT_EQ(m.repr(), setting(c, "repr")) << c;
  m.to(kFloat64);
  m.load_state_dict(state(c));
  m.eval();
}

std::shared_ptr<MultiheadAttention> golden_attention(const std::string& c) {
  auto mha = make<MultiheadAttention>(
      std::stoll(setting(c, "embed_dim")), std::stoll(setting(c, "num_heads")),
      MultiheadAttentionOptions{.dropout = std::stod(setting(c, "dropout")),
                                .bias = flag(c, "bias"),
                                .batch_first = flag(c, "batch_first")});
  load_golden_state(*mha, c);
  return mha;
}

void check_attention(const std::string& c) {
  ASSERT_EQ(setting(c, "module"), "MultiheadAttention");
  auto mha = golden_attention(c);
  const bool self_attention = flag(c, "self_attention");
  Tensor query = leaf(c + ".query");
  Tensor key = self_attention ? query : leaf(c + ".key");
  Tensor value = self_attention ? query : leaf(c + ".value");
  const Tensor out = mha->forward(query, key, value, optional(c + ".key_padding_mask"),
                                  optional(c + ".attn_mask"));
  EXPECT_TRUE(matches(out, c + ".output"));
  out.backward(golden().at(c + ".grad_output"));
  EXPECT_TRUE(matches(query.grad(), c + ".grad_query"));
  if (!self_attention) {
    EXPECT_TRUE(matches(key.grad(), c + ".grad_key"));
    EXPECT_TRUE(matches(value.grad(), c + ".grad_value"));
  }
  expect_parameter_grads(*mha, c);
}

TEST(MultiheadAttentionGolden, SelfAttention) { check_attention("mha_self"); }
TEST(MultiheadAttentionGolden, CrossAttentionBatchFirst) {
  check_attention("mha_cross_batch_first");
}
TEST(MultiheadAttentionGolden, WithoutBias) { check_attention("mha_no_bias"); }
TEST(MultiheadAttentionGolden, WithoutBiasBatchFirst) {
  check_attention("mha_no_bias_batch_first");
}
TEST(MultiheadAttentionGolden, BoolKeyPaddingMask) { check_attention("mha_key_padding"); }
TEST(MultiheadAttentionGolden, FloatKeyPaddingMask) { check_attention("mha_float_key_padding"); }
TEST(MultiheadAttentionGolden, BoolAttnMask) { check_attention("mha_bool_mask"); }
TEST(MultiheadAttentionGolden, FloatAttnMaskPerHead) { check_attention("mha_float_mask"); }
TEST(MultiheadAttentionGolden, BoolAttnMaskAndKeyPadding) { check_attention("mha_both_masks"); }
TEST(MultiheadAttentionGolden, FloatAttnMaskAndKeyPadding) {
  check_attention("mha_float_mask_key_padding");
}
TEST(MultiheadAttentionGolden, Unbatched) { check_attention("mha_unbatched"); }

std::shared_ptr<TransformerEncoderLayer> golden_encoder(const std::string& c) {
  const TransformerEncoderLayerOptions options{
      .dim_feedforward = std::stoll(setting(c, "dim_feedforward")),
      .dropout = std::stod(setting(c, "dropout")),
      .activation = setting(c, "activation") == "gelu" ? TransformerActivation::kGelu
                                                       : TransformerActivation::kRelu,
      .layer_norm_eps = std::stod(setting(c, "layer_norm_eps")),
      .batch_first = flag(c, "batch_first"),
      .norm_first = flag(c, "norm_first")};
  auto layer = make<TransformerEncoderLayer>(std::stoll(setting(c, "d_model")),
                                             std::stoll(setting(c, "nhead")), options);
  load_golden_state(*layer, c);
  return layer;
}

// Runs the case with the given src_mask and is_causal (the fixture's src_key_padding_mask, if any).
void check_encoder(const std::string& c, const Tensor& src_mask, bool is_causal = false) {
  ASSERT_EQ(setting(c, "module"), "TransformerEncoderLayer");
  auto layer = golden_encoder(c);
  Tensor src = leaf(c + ".src");
  const Tensor out =
      layer->forward(src, src_mask, optional(c + ".src_key_padding_mask"), is_causal);
  EXPECT_TRUE(matches(out, c + ".output"));
  out.backward(golden().at(c + ".grad_output"));
  EXPECT_TRUE(matches(src.grad(), c + ".grad_src"));
  expect_parameter_grads(*layer, c);
}

TEST(TransformerEncoderLayerGolden, PostNormRelu) { check_encoder("encoder_post_relu", Tensor()); }
TEST(TransformerEncoderLayerGolden, PreNormGeluBatchFirst) {
  check_encoder("encoder_pre_gelu", Tensor());
}
TEST(TransformerEncoderLayerGolden, KeyPaddingMask) {
  check_encoder("encoder_key_padding", Tensor());
}

// PyTorch ran the float causal mask (-inf above the diagonal); loom gives the same with that
// mask, with the boolean form (true above the diagonal), and with is_causal alone, which goes to
// the fused kernel's causal path.
TEST(TransformerEncoderLayerGolden, CausalMaskInEachForm) {
  const std::string c = "encoder_causal";
  ASSERT_TRUE(flag(c, "causal"));
  const Tensor float_mask = golden().at(c + ".src_mask");
  check_encoder(c, float_mask);
  check_encoder(c, float_mask == scalar_tensor(-std::numeric_limits<double>::infinity(), kFloat64));
  check_encoder(c, Tensor(), /*is_causal=*/true);
  check_encoder(c, float_mask, /*is_causal=*/true);  // with a mask, is_causal changes nothing
}

// The file's parameters in float32 (their dtype converted on load): the same numbers within
// float32's precision.
TEST(MultiheadAttentionGolden, Float32WithinItsPrecision) {
  const std::string c = "mha_float_mask_key_padding";
  auto mha = make<MultiheadAttention>(8, 2);
  mha->load_state_dict(state(c));
  mha->eval();
  const Tensor query = golden().at(c + ".query").to(kFloat32);
  const Tensor out = mha->forward(query, query, query, golden().at(c + ".key_padding_mask"),
                                  golden().at(c + ".attn_mask").to(kFloat32));
  EXPECT_EQ(out.dtype(), kFloat32);
  EXPECT_TRUE(matches(out, c + ".output", 1e-4, 1e-5));
}

// On a GPU (skipped without one) the module, its inputs and masks moved there give the fixture's
// numbers: the masks are merged by the device's kernels and attention runs on the CUDA kernel.
TEST(TransformerGoldenOnCuda, MatchesPyTorch) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Device gpu(DeviceType::CUDA, 0);
  auto on_gpu = [&](const std::string& key) {
    const Tensor t = optional(key);
    return t.defined() ? t.to(gpu) : Tensor();
  };
  for (const std::string c : {"mha_both_masks", "mha_float_mask_key_padding", "mha_unbatched"}) {
    auto mha = golden_attention(c);
    mha->to(gpu);
    Tensor query = on_gpu(c + ".query").requires_grad_();
    const bool self_attention = flag(c, "self_attention");
    const Tensor key = self_attention ? query : on_gpu(c + ".key");
    const Tensor value = self_attention ? query : on_gpu(c + ".value");
    const Tensor out =
        mha->forward(query, key, value, on_gpu(c + ".key_padding_mask"), on_gpu(c + ".attn_mask"));
    EXPECT_TRUE(matches(out.to(kCPU), c + ".output", 1e-9, 1e-11)) << c;
    out.backward(on_gpu(c + ".grad_output"));
    EXPECT_TRUE(matches(query.grad().to(kCPU), c + ".grad_query", 1e-9, 1e-11)) << c;
  }
  for (const std::string c : {"encoder_key_padding", "encoder_causal"}) {
    auto layer = golden_encoder(c);
    layer->to(gpu);
    Tensor src = on_gpu(c + ".src").requires_grad_();
    const Tensor out = layer->forward(src, Tensor(), on_gpu(c + ".src_key_padding_mask"),
                                      /*is_causal=*/flag(c, "causal"));
    EXPECT_TRUE(matches(out.to(kCPU), c + ".output", 1e-9, 1e-11)) << c;
    out.backward(on_gpu(c + ".grad_output"));
    EXPECT_TRUE(matches(src.grad().to(kCPU), c + ".grad_src", 1e-9, 1e-11)) << c;
  }
  auto mha = golden_attention("mha_key_padding");
  mha->to(gpu);
  const Tensor x = zeros({4, 2, 8}, kFloat64, gpu);
  EXPECT_LOOM_ERROR(mha->forward(x, x, x, zeros({2, 4}, kBool)), DeviceError,
                    {"MultiheadAttention", "key_padding_mask", "cpu", "cuda"});
}

// ------------------------------------------------------------------ masks in equivalent forms

Tensor minus_inf_where(const Tensor& forbidden) {
  return where(forbidden, scalar_tensor(-std::numeric_limits<double>::infinity(), kFloat64),
               scalar_tensor(0.0, kFloat64));
}

TEST(MultiheadAttention, ABoolMaskEqualsItsFloatForm) {
  for (const std::string c : {"mha_key_padding", "mha_bool_mask", "mha_both_masks"}) {
    auto mha = golden_attention(c);
    const Tensor query = golden().at(c + ".query"), key = golden().at(c + ".key"),
                 value = golden().at(c + ".value");
    const Tensor padding = optional(c + ".key_padding_mask"), attn = optional(c + ".attn_mask");
    const Tensor as_float =
        mha->forward(query, key, value, padding.defined() ? minus_inf_where(padding) : Tensor(),
                     attn.defined() ? minus_inf_where(attn) : Tensor());
    EXPECT_TRUE(matches(as_float, c + ".output")) << c;
    if (padding.defined() && attn.defined()) {  // one boolean, one float: mixed forms merge too
      const Tensor mixed = mha->forward(query, key, value, padding, minus_inf_where(attn));
      EXPECT_TRUE(matches(mixed, c + ".output")) << c;
    }
  }
}

// Float masks add: a float key_padding_mask with a float attn_mask (which torch 1.13 cannot
// combine) equals one per-head attn_mask [N*H, L, S] holding their sum.
TEST(MultiheadAttention, FloatMasksAdd) {
  manual_seed(31);
  const int64_t n = 2, heads = 2, target_len = 3, source_len = 4, e = 8;
  MultiheadAttention mha(e, heads);
  mha.to(kFloat64);
  const Tensor query = randn({target_len, n, e}, kFloat64),
               key = randn({source_len, n, e}, kFloat64);
  const Tensor padding = randn({n, source_len}, kFloat64);
  const Tensor attn = randn({target_len, source_len}, kFloat64);
  const Tensor sum =
      (attn.reshape({1, 1, target_len, source_len}) + padding.reshape({n, 1, 1, source_len}))
          .expand({n, heads, target_len, source_len})
          .reshape({n * heads, target_len, source_len});
  EXPECT_TRUE(tensors_close(mha.forward(query, key, key, padding, attn),
                            mha.forward(query, key, key, Tensor(), sum), 1e-12, 1e-12));
}

// is_causal with a key_padding_mask forms the causal mask and merges it with the padding: the same
// as the explicit boolean causal mask with the padding.
TEST(MultiheadAttention, CausalWithKeyPadding) {
  manual_seed(32);
  const int64_t n = 2, len = 5, e = 8;
  MultiheadAttention mha(e, 4, {.batch_first = true});
  mha.to(kFloat64);
  const Tensor x = randn({n, len, e}, kFloat64);
  const Tensor padding =
      tensor(std::vector<uint8_t>{0, 0, 1, 0, 1, 0, 1, 0, 0, 0}, {n, len}).to(kBool);
  const Tensor causal = gt(arange(0, len, 1, kInt64), arange(0, len, 1, kInt64).reshape({len, 1}));
  const Tensor expected = mha.forward(x, x, x, padding, causal);
  EXPECT_TRUE(tensors_close(mha.forward(x, x, x, padding, Tensor(), true), expected, 1e-12, 1e-12));
  // Without the padding the kernel's own causal path gives the explicit mask's numbers.
  EXPECT_TRUE(tensors_close(mha.forward(x, x, x, Tensor(), Tensor(), true),
                            mha.forward(x, x, x, Tensor(), causal), 1e-12, 1e-12));
}

// ------------------------------------------------------------------ layouts

// Unbatched input is a batch of one, whatever batch_first; the masks lose their batch dim.
TEST(MultiheadAttention, UnbatchedIsABatchOfOne) {
  const std::string c = "mha_unbatched";
  const Tensor query = golden().at(c + ".query"), key = golden().at(c + ".key"),
               value = golden().at(c + ".value");
  const Tensor padding = golden().at(c + ".key_padding_mask"), attn = golden().at(c + ".attn_mask");
  auto mha = golden_attention(c);
  const Tensor batched = mha->forward(query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1),
                                      padding.unsqueeze(0), attn);
  EXPECT_TRUE(matches(batched.squeeze(1), c + ".output"));
  auto batch_first = make<MultiheadAttention>(8, 4, MultiheadAttentionOptions{.batch_first = true});
  batch_first->to(kFloat64);
  batch_first->load_state_dict(state(c));
  EXPECT_TRUE(matches(batch_first->forward(query, key, value, padding, attn), c + ".output"));
}

// The same weights give the same numbers in both layouts.
TEST(MultiheadAttention, BatchFirstIsATranspose) {
  const std::string c = "mha_both_masks";
  ASSERT_TRUE(flag(c, "batch_first"));
  auto seq_first = make<MultiheadAttention>(8, 4);
  seq_first->to(kFloat64);
  seq_first->load_state_dict(state(c));
  const Tensor out = seq_first->forward(
      golden().at(c + ".query").transpose(0, 1), golden().at(c + ".key").transpose(0, 1),
      golden().at(c + ".value").transpose(0, 1), golden().at(c + ".key_padding_mask"),
      golden().at(c + ".attn_mask"));
  EXPECT_TRUE(matches(out.transpose(0, 1), c + ".output"));
}

TEST(TransformerEncoderLayer, UnbatchedIsABatchOfOne) {
  const std::string c = "encoder_post_relu";
  auto layer = golden_encoder(c);
  const Tensor src = golden().at(c + ".src");  // [S, N, E]
  const Tensor expected = golden().at(c + ".output");
  for (int64_t b = 0; b < src.size(1); ++b) {
    EXPECT_TRUE(
        tensors_close(layer->forward(src.select(1, b)), expected.select(1, b), kRtol, kAtol))
        << b;
  }
  // The single-input forward is the one without masks.
  EXPECT_TRUE(
      tensors_close(layer->forward(src), layer->forward(src, Tensor(), Tensor(), false), 0, 0));
}

// ------------------------------------------------------------------ dropout

TEST(MultiheadAttention, DropoutOnlyInTraining) {
  manual_seed(41);
  const Tensor x = randn({5, 2, 8}, kFloat64);
  MultiheadAttention with_dropout(8, 2, {.dropout = 0.5});
  with_dropout.to(kFloat64);
  MultiheadAttention without(8, 2);
  without.to(kFloat64);
  without.load_state_dict(with_dropout.state_dict());
  ASSERT_TRUE(with_dropout.is_training());
  manual_seed(42);
  const Tensor first = with_dropout.forward(x, x, x);
  manual_seed(42);
  const Tensor again = with_dropout.forward(x, x, x);
  const Tensor plain = without.forward(x, x, x);  // training mode, p = 0
  EXPECT_TRUE(tensors_close(first, again, 0, 0)) << "same seed, same dropped weights";
  EXPECT_FALSE(tensors_close(first, plain, 1e-3, 1e-3)) << "dropout had no effect in training";
  with_dropout.eval();
  EXPECT_TRUE(tensors_close(with_dropout.forward(x, x, x), plain, 1e-12, 1e-12));
}

TEST(TransformerEncoderLayer, DropoutOnlyInTraining) {
  manual_seed(43);
  TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32, .dropout = 0.3});
  layer.to(kFloat64);
  TransformerEncoderLayer plain(16, 4, {.dim_feedforward = 32, .dropout = 0.0});
  plain.to(kFloat64);
  plain.load_state_dict(layer.state_dict());
  const Tensor src = randn({5, 2, 16}, kFloat64);
  EXPECT_FALSE(tensors_close(layer.forward(src), plain.forward(src), 1e-3, 1e-3));
  layer.eval();
  EXPECT_TRUE(tensors_close(layer.forward(src), plain.forward(src), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(layer.forward(src), layer.forward(src), 0, 0));
}

// ------------------------------------------------------------------ construction

TEST(MultiheadAttention, PyTorchsInitialisation) {
  manual_seed(51);
  const int64_t e = 64;
  MultiheadAttention mha(e, 8);
  EXPECT_EQ(mha.head_dim, 8);
  EXPECT_EQ(mha.in_proj_weight.sizes(), (Shape{3 * e, e}));
  const double xavier = std::sqrt(6.0 / (e + 3 * e));  // fan_in E, fan_out 3E
  const double linear = 1.0 / std::sqrt(static_cast<double>(e));
  EXPECT_LE(max(abs(mha.in_proj_weight)).item<double>(), xavier);
  EXPECT_GT(max(abs(mha.in_proj_weight)).item<double>(), 0.95 * xavier);
  EXPECT_LE(max(abs(mha.out_proj->weight)).item<double>(), linear);
  EXPECT_GT(max(abs(mha.out_proj->weight)).item<double>(), 0.95 * linear);
  EXPECT_TRUE(tensors_close(mha.in_proj_bias, zeros({3 * e}), 0, 0));
  EXPECT_TRUE(tensors_close(mha.out_proj->bias, zeros({e}), 0, 0));
  for (const Tensor& p : mha.parameters()) EXPECT_TRUE(p.requires_grad());
}

// bias=False removes every bias, as PyTorch 2.1's TransformerEncoderLayer(bias=False).
TEST(TransformerEncoderLayer, WithoutBiasKeys) {
  TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32, .bias = false});
  EXPECT_EQ(keys(layer), (std::vector<std::string>{
                             "self_attn.in_proj_weight", "self_attn.out_proj.weight",
                             "linear1.weight", "linear2.weight", "norm1.weight", "norm2.weight"}));
  MultiheadAttention mha(8, 2, {.bias = false});
  EXPECT_EQ(keys(mha), (std::vector<std::string>{"in_proj_weight", "out_proj.weight"}));
  EXPECT_FALSE(mha.in_proj_bias.defined());
  manual_seed(52);
  const Tensor src = randn({3, 2, 16});
  EXPECT_EQ(layer.forward(src).sizes(), (Shape{3, 2, 16}));
}

// ------------------------------------------------------------------ errors

TEST(MultiheadAttention, RefusesBadConstruction) {
  EXPECT_LOOM_ERROR(MultiheadAttention(0, 1), ValueError, {"MultiheadAttention", "embed_dim", "0"});
  EXPECT_LOOM_ERROR(MultiheadAttention(8, 0), ValueError, {"MultiheadAttention", "num_heads"});
  EXPECT_LOOM_ERROR(MultiheadAttention(8, 3), ValueError,
                    {"MultiheadAttention", "embed_dim (8) must be divisible by num_heads (3)"});
  EXPECT_LOOM_ERROR(MultiheadAttention(8, 2, {.dropout = 1.5}), ValueError,
                    {"MultiheadAttention", "dropout", "[0, 1]", "1.5"});
  EXPECT_LOOM_ERROR(TransformerEncoderLayer(16, 4, {.dim_feedforward = 0}), ValueError,
                    {"TransformerEncoderLayer", "dim_feedforward", "0"});
  EXPECT_LOOM_ERROR(TransformerEncoderLayer(16, 3), ValueError,
                    {"embed_dim (16) must be divisible by num_heads (3)"});
  EXPECT_LOOM_ERROR(TransformerEncoderLayer(16, 4, {.layer_norm_eps = 0}), ValueError,
                    {"LayerNorm", "eps"});
}

TEST(MultiheadAttention, RefusesBadInputs) {
  MultiheadAttention mha(8, 2);
  const Tensor q = zeros({4, 2, 8}), kv = zeros({5, 2, 8});
  EXPECT_LOOM_ERROR(mha.forward(q, zeros({5, 8}), zeros({5, 8})), ShapeError,
                    {"MultiheadAttention", "3-D", "[4, 2, 8]", "[5, 8]"});
  EXPECT_LOOM_ERROR(mha.forward(zeros({8}), zeros({8}), zeros({8})), ShapeError,
                    {"MultiheadAttention", "query=[8]"});
  EXPECT_LOOM_ERROR(mha.forward(zeros({4, 2, 6}), kv, kv), ShapeError,
                    {"MultiheadAttention", "embed_dim=8", "kdim", "[4, 2, 6]"});
  EXPECT_LOOM_ERROR(mha.forward(q, zeros({5, 2, 6}), zeros({5, 2, 6})), ShapeError,
                    {"embed_dim=8", "key=[5, 2, 6]"});
  EXPECT_LOOM_ERROR(mha.forward(q, kv, zeros({6, 2, 8})), ShapeError,
                    {"MultiheadAttention", "key and value", "[5, 2, 8]", "[6, 2, 8]"});
  EXPECT_LOOM_ERROR(mha.forward(q, zeros({5, 3, 8}), zeros({5, 3, 8})), ShapeError,
                    {"MultiheadAttention", "batch size", "[4, 2, 8]", "[5, 3, 8]"});
  EXPECT_LOOM_ERROR(mha.forward(q, kv.to(kFloat64), kv), DTypeError,
                    {"MultiheadAttention", "float32", "float64"});
  EXPECT_LOOM_ERROR(
      mha.forward(zeros({4, 2, 8}, kInt64), zeros({5, 2, 8}, kInt64), zeros({5, 2, 8}, kInt64)),
      DTypeError, {"MultiheadAttention", "floating", "int64"});
  // batch_first reads the batch from dim 0.
  MultiheadAttention batch_first(8, 2, {.batch_first = true});
  EXPECT_LOOM_ERROR(batch_first.forward(q, kv, kv), ShapeError,
                    {"batch size (dim 0, batch_first)", "[4, 2, 8]", "[5, 2, 8]"});
  // The single-input forward of Module does not apply.
  EXPECT_LOOM_ERROR(static_cast<Module&>(mha).forward(q), NotImplementedError,
                    {"MultiheadAttention", "forward(Tensor)"});
}

TEST(MultiheadAttention, RefusesBadMasks) {
  MultiheadAttention mha(8, 4);
  const Tensor q = zeros({4, 2, 8}), kv = zeros({5, 2, 8});
  EXPECT_LOOM_ERROR(mha.forward(q, kv, kv, zeros({2, 4}, kBool)), ShapeError,
                    {"MultiheadAttention", "key_padding_mask must be [N, S] = [2, 5]",
                     "got key_padding_mask=[2, 4]"});
  EXPECT_LOOM_ERROR(
      mha.forward(q, kv, kv, zeros({2, 5}, kInt64)), DTypeError,
      {"MultiheadAttention", "key_padding_mask", "bool or of the query's dtype float32", "int64"});
  EXPECT_LOOM_ERROR(mha.forward(q, kv, kv, zeros({2, 5}, kFloat64)), DTypeError,
                    {"key_padding_mask", "float32", "got float64"});
  EXPECT_LOOM_ERROR(
      mha.forward(q, kv, kv, Tensor(), zeros({4, 4}, kBool)), ShapeError,
      {"MultiheadAttention", "attn_mask must be [L, S] = [4, 5] or [N*num_heads, L, S] = [8, 4, 5]",
       "got attn_mask=[4, 4]"});
  EXPECT_LOOM_ERROR(mha.forward(q, kv, kv, Tensor(), zeros({4, 4, 5})), ShapeError,
                    {"attn_mask", "[8, 4, 5]", "got attn_mask=[4, 4, 5]"});
  EXPECT_LOOM_ERROR(mha.forward(q, kv, kv, Tensor(), zeros({4, 5}, kInt64)), DTypeError,
                    {"MultiheadAttention", "attn_mask", "int64"});
  // Unbatched: the masks lose their batch dim.
  const Tensor uq = zeros({4, 8}), ukv = zeros({5, 8});
  EXPECT_LOOM_ERROR(mha.forward(uq, ukv, ukv, zeros({1, 5}, kBool)), ShapeError,
                    {"key_padding_mask must be [S] = [5]", "got key_padding_mask=[1, 5]"});
  EXPECT_LOOM_ERROR(mha.forward(uq, ukv, ukv, Tensor(), zeros({8, 4, 5}, kBool)), ShapeError,
                    {"[num_heads, L, S] = [4, 4, 5]", "got attn_mask=[8, 4, 5]"});
}

TEST(TransformerEncoderLayer, RefusesBadSrc) {
  TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32});
  EXPECT_LOOM_ERROR(layer.forward(zeros({5, 2, 8})), ShapeError,
                    {"TransformerEncoderLayer", "d_model=16", "got src=[5, 2, 8]"});
  EXPECT_LOOM_ERROR(layer.forward(zeros({16})), ShapeError,
                    {"TransformerEncoderLayer", "got src=[16]"});
  // Its masks are self_attn's, checked there.
  EXPECT_LOOM_ERROR(layer.forward(zeros({5, 2, 16}), Tensor(), zeros({2, 4}, kBool)), ShapeError,
                    {"key_padding_mask must be [N, S] = [2, 5]"});
}

}  // namespace
}  // namespace loom::nn
