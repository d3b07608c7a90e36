// tests/autograd/attention_test.cpp — the fused scaled_dot_product_attention (Note [Fused
// attention]) against the same attention composed of matmul and softmax, against PyTorch 2.x's
// F.scaled_dot_product_attention (tests/golden/attention.safetensors, from
// tools/make_attention_golden.py), by gradcheck, and for the memory it holds.
#include "tensor/attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "autograd/autocast.h"
#include "tensor/elementwise.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// softmax(q k^T scale + mask) v from differentiable ops that hold the scores: the reference.
// mask: undefined, bool (attend where true) or additive; causal builds a bool lower triangle.
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, Tensor mask, bool causal,
                double scale) {
  const int64_t l = q.size(-2), s = k.size(-2);
  if (causal) {
    std::vector<uint8_t> keep(static_cast<size_t>(l * s));
    for (int64_t i = 0; i < l; ++i)
      for (int64_t j = 0; j < s; ++j) keep[static_cast<size_t>(i * s + j)] = j <= i;
    mask = tensor(std::vector<double>(keep.begin(), keep.end()), {l, s}).to(kBool);
  }
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;
  if (mask.defined() && mask.dtype() == kBool) {
    scores = where(mask, scores, full({1}, -kInf, scores.dtype()));
  } else if (mask.defined()) {
    scores = scores + mask;
  }
  return matmul(softmax(scores, -1), v);
}

struct Case {
  std::string name;
  Shape q, k, v;
  enum { kNone, kBool, kFloat } mask = kNone;
  Shape mask_shape;
  bool causal = false;
};

Tensor make_mask(const Case& c) {
  if (c.mask == Case::kNone) return Tensor();
  if (c.mask == Case::kFloat) return randn(c.mask_shape, kFloat64);
  // Key 0 always attends, so that no row is fully masked (a case of its own below).
  Tensor score = rand(c.mask_shape, kFloat64);
  score.narrow(-1, 0, 1).fill_(1.0);
  return kernels::gt_scalar(score, 0.3);
}

class AttentionMatchesComposed : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionMatchesComposed, ValuesAndGradients) {
  const Case& c = GetParam();
  manual_seed(3);
  Tensor q = test::dparam(c.q), k = test::dparam(c.k), v = test::dparam(c.v);
  const Tensor mask = make_mask(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.q.back()));
  const Tensor out = scaled_dot_product_attention(q, k, v, mask, 0.0, c.causal);
  const Tensor dout = randn(out.sizes(), kFloat64);
  out.backward(dout);
  const Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();
  for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  const Tensor ref = composed(q, k, v, mask, c.causal, scale);
  ref.backward(dout);
  EXPECT_TRUE(test::tensors_close(out, ref, 1e-12, 1e-12));
  EXPECT_TRUE(test::tensors_close(dq, q.grad(), 1e-11, 1e-11));
  EXPECT_TRUE(test::tensors_close(dk, k.grad(), 1e-11, 1e-11));
  EXPECT_TRUE(test::tensors_close(dv, v.grad(), 1e-11, 1e-11));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionMatchesComposed,
    ::testing::Values(
        Case{"plain", {2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, Case::kNone, {}},
        Case{"causal_long", {1, 2, 150, 8}, {1, 2, 150, 8}, {1, 2, 150, 8}, Case::kNone, {}, true},
        Case{
            "causal_more_keys", {2, 1, 33, 4}, {2, 1, 70, 4}, {2, 1, 70, 3}, Case::kNone, {}, true},
        Case{"keys_differ", {2, 2, 7, 6}, {2, 2, 130, 6}, {2, 2, 130, 5}, Case::kNone, {}},
        Case{"bool_mask_broadcast",
             {2, 3, 40, 8},
             {2, 3, 70, 8},
             {2, 3, 70, 8},
             Case::kBool,
             {40, 70}},
        Case{"float_mask_per_batch",
             {2, 3, 9, 8},
             {2, 3, 11, 8},
             {2, 3, 11, 4},
             Case::kFloat,
             {2, 1, 9, 11}},
        Case{"unbatched", {6, 4}, {9, 4}, {9, 2}, Case::kNone, {}},
        Case{"three_dims", {3, 6, 4}, {3, 6, 4}, {3, 6, 4}, Case::kNone, {}, true},
        Case{"five_dims_mask",
             {2, 2, 2, 5, 4},
             {2, 2, 2, 6, 4},
             {2, 2, 2, 6, 4},
             Case::kBool,
             {2, 1, 2, 5, 6}}),
    [](const auto& info) { return info.param.name; });

// A q, k, v that are views of one [N, L, 3, H, E] projection, as a Transformer makes them, are
// read in place; the result's [N, L, H, Ev] layout makes out.transpose(1, 2) contiguous.
TEST(Attention, ReadsTransposedProjectionsAndWritesTheHeadsInterleaved) {
  manual_seed(4);
  const int64_t n = 2, l = 9, h = 3, e = 4;
  const Tensor qkv = randn({n, l, 3, h, e}, kFloat64);
  const Tensor q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
               v = qkv.select(2, 2).transpose(1, 2);
  const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  EXPECT_EQ(out.sizes(), (Shape{n, h, l, e}));
  EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
  const Tensor ref = composed(q.contiguous(), k.contiguous(), v.contiguous(), Tensor(), true, 0.5);
  EXPECT_TRUE(test::tensors_close(out, ref, 1e-12, 1e-12));
}

// ---------------------------------------------------------------- against PyTorch 2.x

SafetensorsFile golden() {
  return load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/attention.safetensors");
}

void check_golden(const std::string& c) {
  const SafetensorsFile f = golden();
  Tensor q = f.at(c + ".q").clone().requires_grad_(), k = f.at(c + ".k").clone().requires_grad_(),
         v = f.at(c + ".v").clone().requires_grad_();
  const Tensor mask = f.contains(c + ".mask") ? f.at(c + ".mask") : Tensor();
  const bool causal = f.metadata.at(c + ".is_causal") == "true";
  const std::string scale_text = f.metadata.at(c + ".scale");
  const std::optional<double> scale =
      scale_text == "default" ? std::nullopt : std::optional<double>(std::stod(scale_text));
  const Tensor out = scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale);
  EXPECT_TRUE(test::tensors_close(out, f.at(c + ".output"), 1e-10, 1e-12)) << c;
  out.backward(f.at(c + ".grad_output"));
  EXPECT_TRUE(test::tensors_close(q.grad(), f.at(c + ".grad_q"), 1e-10, 1e-12)) << c;
  EXPECT_TRUE(test::tensors_close(k.grad(), f.at(c + ".grad_k"), 1e-10, 1e-12)) << c;
  EXPECT_TRUE(test::tensors_close(v.grad(), f.at(c + ".grad_v"), 1e-10, 1e-12)) << c;
}

TEST(AttentionGolden, Causal) { check_golden("causal"); }
TEST(AttentionGolden, BoolMask) { check_golden("bool_mask"); }
TEST(AttentionGolden, FloatMaskBroadcastOverHeads) { check_golden("float_mask"); }
TEST(AttentionGolden, ScaleAndThreeDims) { check_golden("scale_3d"); }

// ---------------------------------------------------------------- gradcheck

TEST(AttentionGradcheck, CausalWithMoreKeysThanABlock) {
  manual_seed(5);
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.0, true);
      },
      {test::dparam({1, 2, 3, 3}), test::dparam({1, 2, 67, 3}), test::dparam({1, 2, 67, 2})});
}

TEST(AttentionGradcheck, FloatMaskAndScale) {
  manual_seed(6);
  const Tensor mask = randn({3, 4}, kFloat64);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], mask, 0.0, false, 0.7);
      },
      {test::dparam({2, 3, 3}), test::dparam({2, 4, 3}), test::dparam({2, 4, 2})});
}

// The generator is reseeded before each evaluation, so every one drops the same weights.
TEST(AttentionGradcheck, Dropout) {
  manual_seed(7);
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& x) {
        manual_seed(99);
        return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.4, true);
      },
      {test::dparam({1, 2, 5, 3}), test::dparam({1, 2, 5, 3}), test::dparam({1, 2, 5, 3})});
}

// ---------------------------------------------------------------- dropout, dtypes, edges

// Weight (n, h, i, j) is dropped where rand([N, H, L, S]) after the same seed is below p.
TEST(Attention, DropoutDropsTheWeightsThatRandDrawsBelowP) {
  manual_seed(8);
  const Tensor q = randn({2, 2, 5, 4}, kFloat64), k = randn({2, 2, 6, 4}, kFloat64),
               v = randn({2, 2, 6, 3}, kFloat64);
  const double p = 0.3;
  manual_seed(11);
  const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), p);
  manual_seed(11);
  std::vector<double> keep_values;
  for (float u : rand({2, 2, 5, 6}, kFloat32).to_vector<float>()) keep_values.push_back(u >= p);
  const Tensor keep = tensor(keep_values, {2, 2, 5, 6});
  const Tensor weights = softmax(matmul(q, k.transpose(-2, -1)) * 0.5, -1);
  const Tensor ref = matmul(weights * keep / (1.0 - p), v);
  EXPECT_TRUE(test::tensors_close(out, ref, 1e-12, 1e-12));
}

TEST(Attention, Float32AndBFloat16FollowFloat64) {
  manual_seed(9);
  const Tensor q = randn({2, 2, 70, 16}, kFloat64), k = randn({2, 2, 70, 16}, kFloat64),
               v = randn({2, 2, 70, 16}, kFloat64);
  const Tensor ref = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  const Tensor f32 = scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32),
                                                  Tensor(), 0.0, true);
  EXPECT_EQ(f32.dtype(), kFloat32);
  EXPECT_TRUE(test::tensors_close(f32, ref, 1e-5, 1e-5));
  const Tensor b16 = scaled_dot_product_attention(q.to(kBFloat16), k.to(kBFloat16), v.to(kBFloat16),
                                                  Tensor(), 0.0, true);
  EXPECT_EQ(b16.dtype(), kBFloat16);
  EXPECT_TRUE(b16.transpose(1, 2).is_contiguous());
  EXPECT_TRUE(test::tensors_close(b16, ref, 3e-2, 3e-2));
}

TEST(Attention, AutocastRunsInTheRegionsDtype) {
  manual_seed(10);
  Tensor q = randn({1, 2, 8, 4}).requires_grad_(), k = randn({1, 2, 8, 4}).requires_grad_(),
         v = randn({1, 2, 8, 4}).requires_grad_();
  Tensor out;
  {
    const autocast::Guard region(kBFloat16);
    out = scaled_dot_product_attention(q, k, v, randn({8, 8}), 0.0, false);
  }
  EXPECT_EQ(out.dtype(), kBFloat16);
  out.to(kFloat32).sum().backward();
  EXPECT_EQ(q.grad().dtype(), kFloat32);
  EXPECT_EQ(v.grad().sizes(), v.sizes());
}

// A row that sees no key gives 0, not NaN, and passes no gradient.
TEST(Attention, FullyMaskedRowGivesZeros) {
  manual_seed(12);
  Tensor q = test::dparam({1, 3, 4}), k = test::dparam({1, 5, 4}), v = test::dparam({1, 5, 2});
  Tensor keep = ones({3, 5}, kFloat64);
  keep.select(0, 1).fill_(0.0);
  const Tensor out = scaled_dot_product_attention(q, k, v, kernels::gt_scalar(keep, 0.5));
  out.sum().backward();
  EXPECT_TRUE(test::values_are(out.select(1, 1), {0, 0}, 0.0));
  EXPECT_TRUE(test::values_are(q.grad().select(1, 1), {0, 0, 0, 0}, 0.0));
  for (double x : out.to_vector<double>()) EXPECT_FALSE(std::isnan(x));
}

TEST(Attention, NoKeysGivesZeros) {
  const Tensor out =
      scaled_dot_product_attention(randn({2, 3, 4}), randn({2, 0, 4}), randn({2, 0, 5}));
  EXPECT_EQ(out.sizes(), (Shape{2, 3, 5}));
  EXPECT_TRUE(test::values_are(out.sum(), {0.0}, 0.0));
}

TEST(Attention, BadArgumentsNameTheOpAndShapes) {
  const Tensor q = randn({2, 3, 4}), k = randn({2, 5, 4}), v = randn({2, 5, 6});
  const char* op = "scaled_dot_product_attention";
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(randn({4}), randn({4}), randn({4})), ShapeError,
                    {op, "[4]"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, randn({3, 5, 4}), v), ShapeError,
                    {op, "[3, 5, 4]", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, randn({2, 5, 3}), v), ShapeError,
                    {op, "[2, 5, 3]"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k, randn({2, 4, 6})), ShapeError,
                    {op, "[2, 4, 6]"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k.to(kFloat64), v), DTypeError,
                    {op, "float64"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k, v, randn({3, 5}).to(kInt64)), DTypeError,
                    {op, "int64"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k, v, randn({3, 4})), ShapeError,
                    {op, "[3, 4]", "[2, 3, 5]"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k, v, randn({3, 5}), 0.0, true), ValueError,
                    {op, "is_causal"});
  EXPECT_LOOM_ERROR(scaled_dot_product_attention(q, k, v, Tensor(), 1.0), ValueError,
                    {op, "dropout_p"});
}

// ---------------------------------------------------------------- memory

// Causal attention at T = 2048, 4 heads of 64: beyond its inputs, outputs and gradients, forward
// and backward together hold less than a tenth of one [T, T] float32 score matrix (16 MiB).
TEST(Attention, ForwardAndBackwardNeverHoldTheScores) {
  const int64_t t = 2048, h = 4, e = 64;
  manual_seed(13);
  Tensor q = randn({1, h, t, e}).requires_grad_(), k = randn({1, h, t, e}).requires_grad_(),
         v = randn({1, h, t, e}).requires_grad_();
  const Tensor dout = randn({1, h, t, e});
  const int64_t tensor_bytes = h * t * e * 4;
  reset_peak_memory(kCPU);
  const int64_t before = memory_stats(kCPU).current_bytes;
  {
    const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
    out.backward(dout);
  }
  const int64_t peak = memory_stats(kCPU).peak_bytes - before;
  // out and its lse, and the three gradients; the lse is [1, H, T] float32.
  const int64_t held = 4 * tensor_bytes + h * t * 4;
  const int64_t tenth_of_scores = t * t * 4 / 10;
  RecordProperty("peak_beyond_tensors_bytes", std::to_string(peak - held));
  EXPECT_LT(peak - held, tenth_of_scores) << "peak " << peak << " bytes";
}

}  // namespace
}  // namespace loom
