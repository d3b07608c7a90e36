// tests/autograd/autocast_test.cpp — autocast regions: the policy table of Note [Autocast
// policy] op by op, the 16-bit products' numbers (float32 accumulation, one rounding), master
// weights that stay float32, the cast cache, nesting, and what happens outside a region.

#include "autograd/autocast.h"

#include <gtest/gtest.h>

#include <functional>

#include "autograd/graph.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/linalg.h"
#include "tensor/reduce.h"
#include "test_util.h"

namespace loom {
namespace {

using test::tensors_close;

Tensor param(const Shape& shape, uint64_t seed) {
  manual_seed(seed);
  return randn(shape).requires_grad_();
}

class Autocast : public ::testing::TestWithParam<DType> {};

TEST_P(Autocast, ProductsRunInTheRegionsDtypeAndTheRestInFloat32OnTheCpu) {
  const DType low = GetParam();
  const Tensor x = param({4, 3, 6, 6}, 1), w = param({5, 3, 3, 3}, 2), b = param({5}, 3);
  const Tensor lw = param({7, 5 * 4 * 4}, 4);
  const Tensor target = tensor<int64_t>({0, 3, 6, 2}, {4});
  autocast::Guard amp(low);
  const Tensor y = conv2d(x, w, b);
  EXPECT_EQ(y.dtype(), low);
  const Tensor bn = batch_norm(y, Tensor(), Tensor(), Tensor(), Tensor(), true);
  // Batch norm, ReLU, the residual add: 16-bit on a GPU (tests/cuda/amp_cuda_test.cpp). On the
  // CPU, batch norm keeps a bfloat16 x (its loops read bfloat16 directly); the rest is widened.
  EXPECT_EQ(bn.dtype(), low == kBFloat16 ? kBFloat16 : kFloat32);
  EXPECT_EQ(relu(y).dtype(), kFloat32);
  EXPECT_EQ(add(y, y).dtype(), kFloat32);
  EXPECT_EQ(exp(y).dtype(), kFloat32);
  EXPECT_EQ(sum(y).dtype(), kFloat32);
  EXPECT_EQ(max_pool2d(y, {2, 2}).dtype(), kFloat32);
  EXPECT_EQ(reshape(y, {4, -1}).dtype(), low);  // views keep their dtype
  const Tensor logits = linear(reshape(y, {4, -1}), lw);
  EXPECT_EQ(logits.dtype(), low);
  EXPECT_EQ(matmul(logits, transpose(logits, 0, 1)).dtype(), low);
  EXPECT_EQ(softmax(logits, 1).dtype(), kFloat32);
  EXPECT_EQ(log_softmax(logits, 1).dtype(), kFloat32);
  EXPECT_EQ(cross_entropy(logits, target).dtype(), kFloat32);
  EXPECT_EQ(layer_norm(logits, {7}).dtype(), kFloat32);
  EXPECT_EQ(cat({logits, zeros({1, 7})}, 0).dtype(), kFloat32);  // mixed: widened
  EXPECT_EQ(cat({logits, logits}, 0).dtype(), low);              // one dtype: as it is
  EXPECT_EQ(argmax(logits, 1).dtype(), kInt64);
}

TEST_P(Autocast, AProductEqualsTheFloat32ProductOfRoundedOperandsRoundedOnce) {
  const DType low = GetParam();
  const Tensor a = param({33, 70}, 5), b = param({70, 19}, 6);
  Tensor y;
  {
    autocast::Guard amp(low);
    y = matmul(a, b);
  }
  const Tensor a16 = kernels::to_dtype(kernels::to_dtype(a, low), kFloat32);
  const Tensor b16 = kernels::to_dtype(kernels::to_dtype(b, low), kFloat32);
  const Tensor expected = kernels::to_dtype(kernels::mm(a16, b16), low);
  ASSERT_EQ(y.dtype(), low);
  EXPECT_EQ(kernels::to_dtype(y, kFloat64).to_vector<double>(),
            kernels::to_dtype(expected, kFloat64).to_vector<double>());
}

TEST_P(Autocast, ConvolutionForwardAndBackwardMatchTheirFloat32ValuesWithinRounding) {
  const DType low = GetParam();
  Tensor x = param({2, 4, 9, 9}, 7), w = param({6, 4, 3, 3}, 8), b = param({6}, 9);
  const Tensor dy = randn({2, 6, 9, 9});
  const Tensor ref = conv2d(x, w, b, {1, 1}, {1, 1});
  ref.backward(dy);
  const Tensor dx = x.grad(), dw = w.grad(), db = b.grad();
  x.set_grad(Tensor()), w.set_grad(Tensor()), b.set_grad(Tensor());
  Tensor y;
  {
    autocast::Guard amp(low);
    y = conv2d(x, w, b, {1, 1}, {1, 1});
  }
  y.backward(dy);
  // 8 (bf16) or 11 (fp16) significant bits in the operands: relative errors of a few 1e-3.
  const double tol = low == kBFloat16 ? 4e-2 : 5e-3;
  EXPECT_TRUE(tensors_close(y.to(kFloat32), ref, tol, tol));
  for (const auto& [got, want] : {std::pair{x.grad(), dx}, {w.grad(), dw}, {b.grad(), db}}) {
    ASSERT_TRUE(got.defined());
    EXPECT_EQ(got.dtype(), kFloat32);  // master weights and inputs get float32 gradients
    EXPECT_TRUE(tensors_close(got, want, tol, tol * 10));
  }
}

TEST_P(Autocast, AModelTrainsWithFloat32MasterWeights) {
  const DType low = GetParam();
  manual_seed(10);
  auto model = nn::resnet18({.width = 4, .in_channels = 1, .num_classes = 5});
  const Tensor x = randn({2, 1, 16, 16});
  const Tensor y = tensor<int64_t>({1, 4}, {2});
  Tensor loss;
  {
    autocast::Guard amp(low);
    loss = cross_entropy(model->forward(x), y);
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  loss.backward();
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.dtype(), kFloat32) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), kFloat32) << name;
    EXPECT_TRUE(std::isfinite(kernels::sum(kernels::abs(p.grad())).item())) << name;
  }
}

TEST_P(Autocast, AWeightUsedTwiceIsCastOnceAndGetsBothGradients) {
  const DType low = GetParam();
  Tensor w = param({8, 8}, 12);
  const Tensor x = randn({3, 8});  // an activation: not cached
  Tensor once, twice;
  {
    autocast::Guard amp(low);
    once = sum(linear(x, w));
    EXPECT_EQ(autocast::cached_casts(), 1u);
  }
  EXPECT_EQ(autocast::cached_casts(), 0u);  // cleared when the region ends
  {
    autocast::Guard amp(low);
    twice = add(sum(linear(x, w)), sum(linear(x, w)));
    EXPECT_EQ(autocast::cached_casts(), 1u);  // one cast of w serves both products
  }
  once.backward();
  const Tensor g1 = kernels::clone(w.grad());
  w.set_grad(Tensor());
  twice.backward();
  EXPECT_TRUE(tensors_close(w.grad(), kernels::mul_scalar(g1, 2.0), 1e-6, 1e-6));
}

TEST_P(Autocast, AParameterChangedInPlaceIsCastAgain) {
  const DType low = GetParam();
  const Tensor w = param({4, 4}, 13);
  const Tensor x = randn({2, 4});
  autocast::Guard amp(low);
  const Tensor before = linear(x, w);
  {
    NoGradGuard no_grad;
    kernels::mul_scalar_(w, 2.0);  // bumps w's version
  }
  const Tensor after = linear(x, w);
  EXPECT_TRUE(
      tensors_close(after.to(kFloat32), kernels::mul_scalar(before.to(kFloat32), 2.0), 1e-2, 1e-2));
}

// Every op of the float32 class (Note [Autocast policy]) takes a 16-bit input inside a region,
// returns float32 and sends a gradient back through the cast to the float32 leaf.
TEST_P(Autocast, EveryFloat32OpTakesA16BitInputAndSendsItsGradientBack) {
  const DType low = GetParam();
  using Op = std::function<Tensor(const Tensor&)>;
  const Tensor idx = tensor<int64_t>({2, 0, 1}, {3});
  const Tensor idx2 = tensor<int64_t>({0, 2, 1, 1, 0, 2, 3, 3, 0, 1, 2, 3}, {3, 4});
  const std::vector<std::pair<std::string, Op>> ops = {
      {"pow", [](const Tensor& h) { return pow(h, 2.0); }},
      {"exp", [](const Tensor& h) { return exp(h); }},
      {"log", [](const Tensor& h) { return log(abs(h) + 1.0); }},
      {"sqrt", [](const Tensor& h) { return sqrt(abs(h) + 1.0); }},
      {"sum", [](const Tensor& h) { return sum(h, {1}); }},
      {"mean", [](const Tensor& h) { return mean(h); }},
      {"var", [](const Tensor& h) { return var(h, {0}); }},
      {"amax", [](const Tensor& h) { return amax(h, {1}); }},
      {"max(dim)", [](const Tensor& h) { return max(h, 1).first; }},
      {"logsumexp", [](const Tensor& h) { return logsumexp(h, {1}); }},
      {"softmax", [](const Tensor& h) { return softmax(h, 1); }},
      {"log_softmax", [](const Tensor& h) { return log_softmax(h, 1); }},
      {"cross_entropy", [&](const Tensor& h) { return cross_entropy(h, idx); }},
      {"mse_loss",
       [](const Tensor& h) {
         return mse_loss(h, zeros({3, 4}));
       }},
      {"layer_norm", [](const Tensor& h) { return layer_norm(h, {4}); }},
      {"max_pool2d",
       [](const Tensor& h) {
         return max_pool2d(reshape(h, {1, 1, 3, 4}), {1, 2});
       }},
      {"avg_pool2d",
       [](const Tensor& h) {
         return avg_pool2d(reshape(h, {1, 1, 3, 4}), {1, 2});
       }},
      {"dropout", [](const Tensor& h) { return dropout(h, 0.5); }},
      {"index_select", [&](const Tensor& h) { return index_select(h, 0, idx); }},
      {"gather", [&](const Tensor& h) { return gather(h, 1, idx2); }},
      {"scatter_add",
       [&](const Tensor& h) {
         return scatter_add(zeros({3, 4}), 1, idx2, h);
       }},
      {"cat (mixed)",
       [](const Tensor& h) {
         return cat({h, zeros({1, 4})}, 0);
       }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor w = param({3, 4}, 20);
    Tensor out;
    {
      autocast::Guard amp(low);
      const Tensor h = matmul(w, eye(4));  // a 16-bit product
      ASSERT_EQ(h.dtype(), low) << name;
      out = op(h);
    }
    EXPECT_EQ(out.dtype(), kFloat32) << name;
    sum(out).backward();
    ASSERT_TRUE(w.grad().defined()) << name;
    EXPECT_EQ(w.grad().dtype(), kFloat32) << name;
  }
}

// Every elementwise op of the "as is" class widens a 16-bit CPU input inside a region (on a GPU
// it keeps the input's dtype: tests/cuda/amp_cuda_test.cpp), computes the float32 op's value
// and sends a float32 gradient to the float32 leaf.
TEST_P(Autocast, OnTheCpuEveryAsIsOpWidensA16BitInputAndSendsItsGradientBack) {
  const DType low = GetParam();
  using Op = std::function<Tensor(const Tensor&)>;
  const Tensor other = randn({3, 4}).to(low).to(kFloat32);  // exact in 16 bits
  const Tensor gamma = randn({4}), beta = randn({4});
  const std::vector<std::pair<std::string, Op>> ops = {
      {"add", [](const Tensor& h) { return add(h, h); }},
      {"sub", [&](const Tensor& h) { return sub(h, other.to(h.dtype())); }},
      {"mul", [](const Tensor& h) { return mul(h, h); }},
      {"div", [](const Tensor& h) { return div(h, abs(h) + 1.0); }},
      {"maximum", [&](const Tensor& h) { return maximum(h, other.to(h.dtype())); }},
      {"scalar ops", [](const Tensor& h) { return (h * 2.0 + 1.0) / 3.0 - 1.0; }},
      {"neg", [](const Tensor& h) { return neg(h); }},
      {"tanh", [](const Tensor& h) { return tanh(h); }},
      {"sigmoid", [](const Tensor& h) { return sigmoid(h); }},
      {"relu", [](const Tensor& h) { return relu(h); }},
      {"gelu", [](const Tensor& h) { return gelu(h); }},
      {"clamp", [](const Tensor& h) { return clamp(h, -0.5, 0.5); }},
      {"where", [](const Tensor& h) { return where(gt(h, zeros({})), h, h * 0.5); }},
      {"broadcast add",  // its backward sums the 16-bit gradient over the broadcast dim
       [](const Tensor& h) { return add(h, slice(h, 0, 0, 1)); }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor w = param({3, 4}, 20);
    Tensor out, h32;
    {
      autocast::Guard amp(low);
      const Tensor h = matmul(w, eye(4));  // a 16-bit product
      ASSERT_EQ(h.dtype(), low) << name;
      out = op(h);
      h32 = h.detach().to(kFloat32);
    }
    EXPECT_EQ(out.dtype(), kFloat32) << name;
    EXPECT_TRUE(tensors_close(out, op(h32), 1e-6, 1e-6)) << name;
    sum(out).backward();
    ASSERT_TRUE(w.grad().defined()) << name;
    EXPECT_EQ(w.grad().dtype(), kFloat32) << name;
  }
}

// Batch norm in a region keeps a bfloat16 CPU x as it is (Note [Batch norm on bfloat16]) and
// widens a float16 one; either way its values are the float32 batch norm's of the widened x
// (rounded once where the output is bfloat16), and the float32 leaf gets a float32 gradient.
TEST_P(Autocast, OnTheCpuBatchNormKeepsBFloat16AndWidensFloat16) {
  const DType low = GetParam();
  const Tensor gamma = randn({4}).requires_grad_(), beta = randn({4});
  const Tensor w = param({6, 4}, 21);
  Tensor out, h32;
  {
    autocast::Guard amp(low);
    const Tensor h = matmul(w, eye(4));  // a 16-bit product
    out = batch_norm(h, zeros({4}), ones({4}), gamma, beta, /*training=*/true);
    h32 = h.detach().to(kFloat32);
  }
  const DType kept = low == kBFloat16 ? kBFloat16 : kFloat32;
  EXPECT_EQ(out.dtype(), kept);
  const Tensor expected = batch_norm(h32, zeros({4}), ones({4}), gamma, beta, true).to(kept);
  EXPECT_TRUE(tensors_close(out, expected, 0, 0));
  sum(out.to(kFloat32)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(gamma.grad().dtype(), kFloat32);
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, Autocast, ::testing::Values(kBFloat16, kFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(AutocastRegion, Float64IsNeverCastAndNestedRegionsRestoreTheirState) {
  const Tensor a = randn({3, 3}, kFloat64);
  autocast::Guard amp(kFloat16);
  EXPECT_EQ(matmul(a, a).dtype(), kFloat64);
  EXPECT_TRUE(autocast::is_enabled());
  {
    autocast::Guard off(kBFloat16, /*enabled=*/false);
    EXPECT_FALSE(autocast::is_enabled());
    EXPECT_EQ(matmul(randn({2, 2}), randn({2, 2})).dtype(), kFloat32);
    {
      autocast::Guard inner(kBFloat16);
      EXPECT_EQ(matmul(randn({2, 2}), randn({2, 2})).dtype(), kBFloat16);
    }
    EXPECT_FALSE(autocast::is_enabled());
  }
  EXPECT_TRUE(autocast::is_enabled());
  EXPECT_EQ(autocast::dtype(), kFloat16);
  EXPECT_EQ(matmul(randn({2, 2}), randn({2, 2})).dtype(), kFloat16);
}

TEST(AutocastRegion, CatAndStackPromoteDtypesThatDifferOnceThe16BitOnesAreWidened) {
  const Tensor d = randn({2, 3}, kFloat64), f = randn({2, 3}), h = randn({2, 3}).to(kBFloat16);
  autocast::Guard amp(kBFloat16);
  EXPECT_EQ(cat({f, d}).dtype(), kFloat64);
  EXPECT_EQ(cat({h, d}).dtype(), kFloat64);  // h widened to float32, then promoted with d
  EXPECT_EQ(stack({h, f, d}).dtype(), kFloat64);
  EXPECT_EQ(stack({h, f}).dtype(), kFloat32);
}

TEST(AutocastRegion, OutsideARegionNothingIsCastAndSums16BitAreRefused) {
  EXPECT_FALSE(autocast::is_enabled());
  const Tensor h = randn({2, 3}).to(kBFloat16);
  EXPECT_EQ(matmul(h, transpose(h, 0, 1)).dtype(), kBFloat16);  // the products take 16 bits
  EXPECT_EQ(relu(h).dtype(), kBFloat16);                        // so do elementwise ops
  EXPECT_LOOM_ERROR(softmax(h, 1), DTypeError, {"softmax", "bfloat16"});
  EXPECT_LOOM_ERROR(matmul(h, randn({3, 2})), DTypeError, {"mm", "bfloat16", "float32"});
  EXPECT_LOOM_ERROR({ autocast::Guard bad(kFloat32); }, ValueError, {"autocast", "float32"});
}

}  // namespace
}  // namespace loom
