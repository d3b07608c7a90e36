// tests/autograd/engine_test.cpp — the autograd engine: accumulation, broadcasting reduced in
// one place, retain_graph and freed graphs, non-scalar backward, no-grad, detach, hooks, the
// order nodes run in, retain_grad, in-place rules and the version check.

#include <vector>

#include "test_util.h"

using namespace loom;
using loom::test::tensors_close;
using loom::test::values_are;

TEST(Engine, SimpleChainRule) {
  Tensor x = tensor<double>({1, 2, 3}).requires_grad_();
  Tensor y = sum(x * x * 3.0);  // dy/dx = 6x
  y.backward();
  EXPECT_TRUE(values_are(x.grad(), {6, 12, 18}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn_name(), "sumBackward");
}

TEST(Engine, GradientsAccumulateAcrossBackwards) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  sum(x * 2.0).backward();
  sum(x * 3.0).backward();
  EXPECT_TRUE(values_are(x.grad(), {5, 5}));
}

TEST(Engine, SharedSubexpressionSumsBothPaths) {
  Tensor x = tensor<double>({2}).requires_grad_();
  Tensor a = x * x;           // 2x
  Tensor y = sum(a + a * x);  // x^2 + x^3 -> 2x + 3x^2 = 4 + 12
  y.backward();
  EXPECT_TRUE(values_are(x.grad(), {16}));
}

TEST(Engine, BroadcastGradientReducedToInputShape) {
  Tensor a = ones({2, 3}, kFloat64).requires_grad_();
  Tensor b = tensor<double>({1, 2, 3}).requires_grad_();
  Tensor c = tensor<double>({5}, {1, 1}).requires_grad_();
  sum((a + b) * c).backward();
  EXPECT_EQ(b.grad().sizes(), (Shape{3}));
  EXPECT_TRUE(values_are(b.grad(), {10, 10, 10}));
  EXPECT_EQ(c.grad().sizes(), (Shape{1, 1}));
  EXPECT_TRUE(values_are(c.grad(), {18}));  // sum of (1 + b) over 2 rows
  EXPECT_TRUE(values_are(a.grad(), {5, 5, 5, 5, 5, 5}));
}

TEST(Engine, NonScalarNeedsGradient) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_LOOM_ERROR(y.backward(), AutogradError, {"scalar", "[2]"});
  y.backward(tensor<double>({1, 10}));
  EXPECT_TRUE(values_are(x.grad(), {2, 20}));
  Tensor z = x * 3.0;
  EXPECT_LOOM_ERROR(z.backward(ones({3}, kFloat64)), ShapeError, {"[3]", "[2]"});
}

TEST(Engine, LeafGradNeverAliasesTheCallersGradient) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor seed = tensor<double>({5, 7});
  (x + 0.0).backward(seed);  // add's backward passes dout through unchanged
  (x + 0.0).backward(seed);  // accumulates into .grad in place
  EXPECT_TRUE(values_are(x.grad(), {10, 14}));
  EXPECT_TRUE(values_are(seed, {5, 7}));
  EXPECT_FALSE(x.grad().is_alias_of(seed));
}

TEST(Engine, FreedGraphRaisesUnlessRetained) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();  // second pass allowed: the first retained the graph
  EXPECT_TRUE(tensors_close(x.grad(), exp(x.detach()) * 2.0));
  EXPECT_LOOM_ERROR(y.backward(), AutogradError, {"second time", "retain_graph"});
}

TEST(Engine, NoGradAndDetachRecordNothing) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  {
    NoGradGuard guard;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_alias_of(x));
  Tensor y = x * d;  // d is a constant: dy/dx = d
  sum(y).backward();
  EXPECT_TRUE(values_are(x.grad(), {1, 2}));
  EXPECT_LOOM_ERROR(sum(d).backward(), AutogradError, {"does not require grad"});
}

TEST(Engine, RequiresGradOnlyForFloats) {
  EXPECT_LOOM_ERROR(zeros({2}, kInt64).requires_grad_(), DTypeError, {"int64"});
}

TEST(Engine, PostAccumulateHooksFireAfterGradIsWritten) {
  Tensor w = tensor<double>({1, 2}).requires_grad_();
  std::vector<double> seen;
  int handle = w.register_post_accumulate_grad_hook(
      [&](Tensor& leaf) { seen.push_back(leaf.grad().to_vector<double>()[1]); });
  sum(w * 3.0).backward();
  sum(w * 3.0).backward();
  EXPECT_EQ(seen, (std::vector<double>{3, 6}));
  w.remove_post_accumulate_grad_hook(handle);
  sum(w).backward();
  EXPECT_EQ(seen.size(), 2u);
  Tensor y = w * 2.0;
  EXPECT_LOOM_ERROR(y.register_post_accumulate_grad_hook([](Tensor&) {}), AutogradError, {"leaf"});
}

TEST(Engine, LeavesReceiveGradientsInReverseOrderOfUse) {
  // A chain of layers: gradients reach the last-used parameter first (what DDP buckets expect).
  std::vector<Tensor> params;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) {
    params.push_back(tensor<double>({1.0 + i}).requires_grad_());
    params.back().register_post_accumulate_grad_hook([&order, i](Tensor&) { order.push_back(i); });
  }
  Tensor h = ones({1}, kFloat64);
  for (auto& p : params) h = tanh(h * p);
  sum(h).backward();
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1, 0}));
}

TEST(Engine, UnreachedLeafKeepsNoGrad) {
  Tensor a = tensor<double>({1}).requires_grad_();
  Tensor b = tensor<double>({1}).requires_grad_();
  int fired = 0;
  b.register_post_accumulate_grad_hook([&](Tensor&) { ++fired; });
  sum(a * 2.0).backward();
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(fired, 0);
}

TEST(Engine, RetainGradOnNonLeaf) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = x * 3.0;
  y.retain_grad();
  sum(y * y).backward();
  EXPECT_TRUE(values_are(y.grad(), {6, 12}));
  EXPECT_TRUE(values_are(x.grad(), {18, 36}));
}

TEST(Engine, InPlaceOnLeafThatRequiresGradIsRefused) {
  Tensor w = ones({2}, kFloat64).requires_grad_();
  EXPECT_LOOM_ERROR(w.add_(ones({2}, kFloat64)), AutogradError, {"add_", "leaf", "[2]"});
  NoGradGuard guard;
  w.add_(ones({2}, kFloat64));  // what an optimizer does
  EXPECT_TRUE(values_are(w, {2, 2}));
}

TEST(Engine, InPlaceChangeOfSavedTensorIsDetected) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = exp(x);  // saves its output
  Tensor z = sum(y);
  y.mul_(2.0);  // changes what exp's backward needs
  EXPECT_LOOM_ERROR(z.backward(), AutogradError, {"exp", "modified by an in-place", "[2]"});
}

TEST(Engine, InPlaceOnNonLeafIsRecorded) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = x * 2.0;
  y.mul_(x);  // y = 2x^2 -> dy/dx = 4x
  sum(y).backward();
  EXPECT_TRUE(values_are(x.grad(), {4, 8}));
  Tensor a = tensor<double>({3}).requires_grad_();
  Tensor b = a * 1.0;
  b.add_(a * a);  // b = a + a^2 -> 1 + 2a = 7
  sum(b).backward();
  EXPECT_TRUE(values_are(a.grad(), {7}));
}

TEST(Engine, InPlaceOnViewOfGradTensorIsRefused) {
  Tensor x = tensor<double>({1, 2, 3, 4}).requires_grad_();
  Tensor y = x * 1.0;
  Tensor v = y.view({2, 2});
  EXPECT_LOOM_ERROR(v.mul_(2.0), AutogradError, {"mul_", "view"});
}

TEST(Engine, GradFlowsThroughViews) {
  Tensor x = arange(0, 6, 1, kFloat64).reshape({2, 3}).requires_grad_();
  Tensor y = x.t().reshape({6}).slice(0, 0, 6, 2) * tensor<double>({1, 10, 100});
  sum(y).backward();
  // x.t() flattened: [0, 3, 1, 4, 2, 5]; every second element: x[0][0], x[0][1], x[0][2]
  EXPECT_TRUE(values_are(x.grad(), {1, 10, 100, 0, 0, 0}));
  Tensor z = tensor<double>({1, 2}).requires_grad_();
  sum(z.unsqueeze(1).expand({2, 3}) * 2.0).backward();
  EXPECT_TRUE(values_are(z.grad(), {6, 6}));
  Tensor s = tensor<double>({1, 2, 3, 4}, {2, 2}).requires_grad_();
  sum(s.select(1, 1) * s.select(0, 0)).backward();  // s01 s00 + s11 s01
  EXPECT_TRUE(values_are(s.grad(), {2, 5, 0, 2}));
}

TEST(Engine, DtypeConversionGradient) {
  Tensor x = tensor<float>({1, 2}).requires_grad_();
  Tensor y = sum(x.to(kFloat64) * tensor<double>({3, 4}));
  y.backward();
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_TRUE(values_are(x.grad(), {3, 4}));
}

TEST(Gradcheck, DetectsAWrongGradient) {
  // A wrong backward must fail: detaching one factor of x * x halves the gradient.
  Tensor x = loom::test::dparam({3});
  auto right = [](const std::vector<Tensor>& in) { return in[0] * in[0]; };
  EXPECT_TRUE(gradcheck(right, {x}).ok);
  auto half = [](const std::vector<Tensor>& in) { return in[0] * in[0].detach(); };
  auto result = gradcheck(half, {x});
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.message.find("analytical"), std::string::npos);
}

TEST(Engine, InPlaceOnSplitPieceIsRefused) {
  Tensor x = tensor<double>({1, 2, 3, 4}).requires_grad_();
  std::vector<Tensor> pieces = split(x * 1.0, 2);
  EXPECT_LOOM_ERROR(pieces[1].mul_(2.0), AutogradError, {"mul_", "view"});
}

TEST(Engine, QueuedCallbacksRunAfterTheWholeGraph) {
  // Two leaves; the hook of the first one reached queues a callback, which must see both
  // gradients (it runs after the last node), and run once per backward.
  Tensor a = tensor<double>({1, 2}).requires_grad_();
  Tensor b = tensor<double>({3, 4}).requires_grad_();
  int calls = 0;
  bool queued = false, saw_both = false;
  auto hook = [&](Tensor&) {
    if (queued) return;
    queued = true;
    autograd::queue_callback([&] {
      ++calls;
      saw_both = a.grad().defined() && b.grad().defined();
    });
    EXPECT_EQ(calls, 0);  // not run yet
  };
  a.register_post_accumulate_grad_hook(hook);
  b.register_post_accumulate_grad_hook(hook);
  sum(a * b).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(saw_both);
  EXPECT_LOOM_ERROR(autograd::queue_callback([] {}), AutogradError,
                    {"queue_callback", "no backward"});
  // A callback that throws ends backward with its exception.
  Tensor c = tensor<double>({1}).requires_grad_();
  c.register_post_accumulate_grad_hook(
      [](Tensor&) { autograd::queue_callback([] { throw DistError("reducer failed"); }); });
  EXPECT_THROW(sum(c * 2.0).backward(), DistError);
}
