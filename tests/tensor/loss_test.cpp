// tests/tensor/loss_test.cpp — softmax, log_softmax, cross_entropy, nll_loss, mse_loss: forward
// against plain loops (every reduction, ignore_index and label smoothing combination),
// gradcheck of every differentiable input, and every error path.

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;
using loom::test::values_are;
using In = std::vector<Tensor>;

namespace {

constexpr Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

// A float64 tensor of the values; an empty shape means 0-d.
Tensor from(const std::vector<double>& v, const Shape& shape) {
  return shape.empty() ? scalar_tensor(v.at(0), kFloat64) : tensor<double>(v, shape);
}

// x seen as [outer, n, inner] around dim.
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
};
Around around(const Shape& shape, int64_t dim) {
  Around a;
  for (int64_t i = 0; i < dim; ++i) a.outer *= shape[i];
  a.n = shape[dim];
  for (size_t i = dim + 1; i < shape.size(); ++i) a.inner *= shape[i];
  return a;
}

std::vector<double> ref_softmax(const Tensor& x, int64_t dim, bool log) {
  const std::vector<double> v = x.to_vector<double>();
  const Around a = around(x.sizes(), dim < 0 ? dim + x.dim() : dim);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      auto at = [&](int64_t j) { return (o * a.n + j) * a.inner + i; };
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < a.n; ++j) mx = std::max(mx, v[at(j)]);
      for (int64_t j = 0; j < a.n; ++j) sum += std::exp(v[at(j)] - mx);
      for (int64_t j = 0; j < a.n; ++j)
        out[at(j)] = log ? v[at(j)] - mx - std::log(sum) : std::exp(v[at(j)] - mx) / sum;
    }
  return out;
}

// Per position (b, s) of logits [N, C, S]: the loss; reduced as asked.
std::vector<double> reduce(const std::vector<double>& per_position, Reduction r, double divisor) {
  if (r == Reduction::None) return per_position;
  double total = 0;
  for (double v : per_position) total += v;
  return {r == Reduction::Mean ? total / divisor : total};
}

std::vector<double> ref_cross_entropy(const Tensor& logits, const Tensor& target, Reduction r,
                                      int64_t ignore_index, double ls) {
  const std::vector<double> x = logits.to_vector<double>();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  const int64_t n = logits.size(0), c = logits.size(1), s = logits.numel() / (n * c);
  std::vector<double> loss(n * s, 0.0);
  int64_t count = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < s; ++i) {
      const int64_t p = b * s + i;
      if (t[p] == ignore_index) continue;
      ++count;
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < c; ++k) mx = std::max(mx, x[(b * c + k) * s + i]);
      for (int64_t k = 0; k < c; ++k) sum += std::exp(x[(b * c + k) * s + i] - mx);
      auto log_p = [&](int64_t k) { return x[(b * c + k) * s + i] - mx - std::log(sum); };
      double smooth = 0;
      for (int64_t k = 0; k < c; ++k) smooth -= log_p(k);
      loss[p] = (1 - ls) * -log_p(t[p]) + ls * smooth / c;
    }
  return reduce(loss, r, static_cast<double>(count));
}

std::vector<double> ref_nll(const Tensor& log_probs, const Tensor& target,
                            const std::vector<double>& weight, Reduction r, int64_t ignore_index) {
  const std::vector<double> x = log_probs.to_vector<double>();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  const int64_t n = log_probs.size(0), c = log_probs.size(1), s = log_probs.numel() / (n * c);
  std::vector<double> loss(n * s, 0.0);
  double total_weight = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < s; ++i) {
      const int64_t p = b * s + i;
      if (t[p] == ignore_index) continue;
      const double w = weight.empty() ? 1.0 : weight[t[p]];
      total_weight += w;
      loss[p] = -w * x[(b * c + t[p]) * s + i];
    }
  return reduce(loss, r, total_weight);
}

Shape reduced_shape(const Tensor& target, Reduction r) {
  return r == Reduction::None ? target.sizes() : Shape{};
}

}  // namespace

// ---------------------------------------------------------------- softmax

TEST(Softmax, ForwardMatchesReferenceAlongEveryDim) {
  manual_seed(1);
  Tensor x = randn({3, 4, 5}, kFloat64);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    EXPECT_TRUE(
        tensors_close(softmax(x, dim), from(ref_softmax(x, dim, false), x.sizes()), 1e-12, 1e-14));
    EXPECT_TRUE(tensors_close(log_softmax(x, dim), from(ref_softmax(x, dim, true), x.sizes()),
                              1e-12, 1e-12));
  }
  // float32, a non-contiguous input, and more inner positions than one lane block.
  Tensor big = randn({2, 300, 7}).transpose(1, 2);
  EXPECT_TRUE(tensors_close(
      softmax(big, 1), from(ref_softmax(big, 1, false), big.sizes()).to(kFloat32), 1e-5, 1e-6));
  EXPECT_TRUE(tensors_close(log_softmax(big, 2),
                            from(ref_softmax(big, 2, true), big.sizes()).to(kFloat32), 1e-5, 1e-5));
  // A 0-d tensor is one element.
  EXPECT_TRUE(values_are(softmax(scalar_tensor(3.0, kFloat64), 0), {1.0}));
  EXPECT_TRUE(values_are(log_softmax(scalar_tensor(3.0, kFloat64), -1), {0.0}));
}

TEST(Softmax, IsStableForLargeInputs) {
  Tensor x = tensor<float>({1000, 1001, -1000, 0, 0, 0}, {2, 3});
  EXPECT_TRUE(values_are(
      softmax(x, 1),
      {1 / (1 + std::exp(1.0)), 1 / (1 + std::exp(-1.0)), 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-6));
  EXPECT_TRUE(values_are(log_softmax(x, 1).slice(1, 0, 1),
                         {-std::log1p(std::exp(1.0)), -std::log(3.0)}, 1e-5));
  EXPECT_TRUE(values_are(log_softmax(x, 0).select(0, 0), {0, 0, -1000}, 1e-3));
}

TEST(Softmax, Gradcheck) {
  manual_seed(2);
  Tensor x = dparam({2, 3, 4});
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_GRADCHECK([dim](In t) { return softmax(t[0], dim); }, {x});
    EXPECT_GRADCHECK([dim](In t) { return log_softmax(t[0], dim); }, {x});
  }
}

TEST(Softmax, Errors) {
  Tensor x = randn({2, 3});
  EXPECT_LOOM_ERROR(softmax(x, 2), IndexError, {"softmax"});
  EXPECT_LOOM_ERROR(log_softmax(x, -3), IndexError, {"log_softmax"});
  EXPECT_LOOM_ERROR(softmax(randint(0, 3, {2, 3}), 1), DTypeError, {"softmax", "int64"});
}

// ---------------------------------------------------------------- cross entropy

TEST(CrossEntropy, ForwardMatchesReferenceForEveryOption) {
  manual_seed(3);
  struct Case {
    Shape logits;
    Tensor target;
  };
  const std::vector<Case> cases = {
      {{5, 4}, tensor<int64_t>({0, 3, 1, 1, 2})},
      {{2, 3, 2, 2}, tensor<int64_t>({0, 2, 1, 1, 2, 0, 0, 1}, {2, 2, 2})},
      {{3, 4, 5}, randint(0, 4, {3, 5})},
  };
  for (const Case& c : cases) {
    Tensor logits = mul(randn(c.logits, kFloat64), full({}, 2.0, kFloat64));
    for (Reduction r : kReductions)
      for (int64_t ignore : {int64_t{-100}, int64_t{1}})
        for (double ls : {0.0, 0.2, 1.0}) {
          Tensor loss = cross_entropy(logits, c.target, r, ignore, ls);
          EXPECT_TRUE(tensors_close(
              loss,
              from(ref_cross_entropy(logits, c.target, r, ignore, ls), reduced_shape(c.target, r)),
              1e-10, 1e-12))
              << detail::str(c.logits) << " reduction " << static_cast<int>(r) << " ignore "
              << ignore << " ls " << ls;
          // float32 logits and int32 targets compute the same.
          Tensor loss32 = cross_entropy(logits.to(kFloat32), c.target.to(kInt32), r, ignore, ls);
          EXPECT_EQ(loss32.dtype(), kFloat32);
          EXPECT_TRUE(tensors_close(loss32, loss.to(kFloat32), 1e-4, 1e-5));
        }
  }
  // Logits of one sample [C] with a 0-d target.
  Tensor one = tensor<double>({1.0, 2.0, 0.5});
  const double want = -(0.5 - std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5)));
  EXPECT_TRUE(values_are(cross_entropy(one, scalar_tensor(2, kInt64)), {want}, 1e-12));
  EXPECT_EQ(cross_entropy(one, scalar_tensor(2, kInt64), Reduction::None).dim(), 0);
}

TEST(CrossEntropy, EveryTargetIgnored) {
  Tensor logits = randn({2, 3}, kFloat64).requires_grad_();
  Tensor target = tensor<int64_t>({-100, -100});
  Tensor mean = cross_entropy(logits, target, Reduction::Mean, -100, 0.1);
  EXPECT_TRUE(std::isnan(mean.item()));  // 0 / 0, as PyTorch
  EXPECT_TRUE(values_are(cross_entropy(logits, target, Reduction::Sum), {0}));
  cross_entropy(logits, target, Reduction::Sum, -100, 0.3).backward();
  EXPECT_TRUE(values_are(logits.grad(), {0, 0, 0, 0, 0, 0}));
}

TEST(CrossEntropy, Gradcheck) {
  manual_seed(4);
  Tensor logits = dparam({4, 3});
  Tensor target = tensor<int64_t>({2, 0, 1, 2});
  Tensor spatial = dparam({2, 3, 2});
  Tensor spatial_target = tensor<int64_t>({0, 2, 1, 0}, {2, 2});
  for (Reduction r : kReductions)
    for (int64_t ignore : {int64_t{-100}, int64_t{2}})
      for (double ls : {0.0, 0.25}) {
        EXPECT_GRADCHECK([=](In t) { return cross_entropy(t[0], target, r, ignore, ls); },
                         {logits});
        EXPECT_GRADCHECK([=](In t) { return cross_entropy(t[0], spatial_target, r, ignore, ls); },
                         {spatial});
      }
  // One sample: logits [C], 0-d target.
  Tensor one = dparam({4});
  EXPECT_GRADCHECK(
      [](In t) {
        return cross_entropy(t[0], scalar_tensor(1, kInt64), Reduction::None, -100, 0.1);
      },
      {one});
  EXPECT_GRADCHECK([](In t) { return nll_loss(t[0], scalar_tensor(3, kInt64)); }, {one});
}

TEST(CrossEntropy, Float32GradientStaysAccurateForLargeLogits) {
  // At 1e5 a float32 ulp is 0.008: an lse rounded to float32 would be off by that much in
  // every exponent. The same (float32-representable) logits in float64 give the reference.
  manual_seed(11);
  Tensor b = add(randn({4, 6}), full({}, 1e5)).requires_grad_();
  Tensor a = b.detach().to(kFloat64).requires_grad_();
  Tensor target = tensor<int64_t>({5, 0, 2, 2});
  cross_entropy(a, target, Reduction::Sum, -100, 0.1).backward();
  cross_entropy(b, target, Reduction::Sum, -100, 0.1).backward();
  EXPECT_TRUE(tensors_close(b.grad(), a.grad().to(kFloat32), 1e-4, 1e-6));
}

TEST(CrossEntropy, EqualsNllOfLogSoftmax) {
  manual_seed(5);
  Tensor logits = randn({6, 5, 3}, kFloat64);
  Tensor target = randint(0, 5, {6, 3});
  Tensor a = logits.clone().requires_grad_(), b = logits.clone().requires_grad_();
  Tensor ce = cross_entropy(a, target);
  Tensor nll = nll_loss(log_softmax(b, 1), target);
  EXPECT_TRUE(tensors_close(ce, nll, 1e-12, 1e-12));
  ce.backward();
  nll.backward();
  EXPECT_TRUE(tensors_close(a.grad(), b.grad(), 1e-10, 1e-12));
}

TEST(CrossEntropy, Errors) {
  Tensor logits = randn({2, 3});
  EXPECT_LOOM_ERROR(cross_entropy(logits, tensor<int64_t>({0, 3})), IndexError,
                    {"cross_entropy", "target 3", "[0, 3)", "[2, 3]", "[2]"});
  EXPECT_LOOM_ERROR(cross_entropy(logits, tensor<int64_t>({-1, 0})), IndexError,
                    {"cross_entropy", "target -1", "[2, 3]"});
  EXPECT_NO_THROW(cross_entropy(logits, tensor<int64_t>({-1, 0}), Reduction::Mean, -1));
  EXPECT_LOOM_ERROR(cross_entropy(logits, tensor<float>({0, 1})), DTypeError,
                    {"cross_entropy", "float32", "[2]"});
  EXPECT_LOOM_ERROR(cross_entropy(logits, tensor<int64_t>({0, 1, 2})), ShapeError,
                    {"cross_entropy", "[2, 3]", "[3]"});
  EXPECT_LOOM_ERROR(cross_entropy(randn({2, 3, 4}), zeros({2, 5}, kInt64)), ShapeError,
                    {"cross_entropy", "[2, 3, 4]", "[2, 5]"});
  EXPECT_LOOM_ERROR(cross_entropy(logits, tensor<int64_t>({0, 1}), Reduction::Mean, -100, 1.5),
                    ValueError, {"cross_entropy", "label_smoothing", "1.5"});
  EXPECT_LOOM_ERROR(cross_entropy(randn({3}), tensor<int64_t>({0})), ShapeError,
                    {"cross_entropy", "[3]", "[1]"});
  EXPECT_LOOM_ERROR(cross_entropy(randn({2, 3}).to(kFloat16), tensor<int64_t>({0, 1})), DTypeError,
                    {"cross_entropy"});
}

// ---------------------------------------------------------------- nll

TEST(NllLoss, ForwardMatchesReferenceWithWeights) {
  manual_seed(6);
  Tensor lp = randn({4, 3, 2}, kFloat64);
  Tensor target = tensor<int64_t>({0, 2, 1, 1, 2, 0, 1, 2}, {4, 2});
  const std::vector<double> w{0.5, 2.0, 1.5};
  Tensor weight = tensor<double>(w);
  for (Reduction r : kReductions)
    for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
      EXPECT_TRUE(tensors_close(nll_loss(lp, target, weight, r, ignore),
                                from(ref_nll(lp, target, w, r, ignore), reduced_shape(target, r)),
                                1e-12, 1e-12));
      EXPECT_TRUE(tensors_close(nll_loss(lp, target, Tensor(), r, ignore),
                                from(ref_nll(lp, target, {}, r, ignore), reduced_shape(target, r)),
                                1e-12, 1e-12));
    }
  Tensor flat = randn({5, 4}, kFloat64);
  Tensor flat_target = tensor<int64_t>({3, 0, 0, 2, 1});
  EXPECT_TRUE(tensors_close(
      nll_loss(flat, flat_target, tensor<double>({1, 2, 3, 4})),
      from(ref_nll(flat, flat_target, {1, 2, 3, 4}, Reduction::Mean, -100), {}), 1e-12, 1e-12));
}

TEST(NllLoss, Gradcheck) {
  manual_seed(7);
  Tensor lp = dparam({3, 4});
  Tensor target = tensor<int64_t>({3, 1, 1});
  Tensor spatial = dparam({2, 3, 2});
  Tensor spatial_target = tensor<int64_t>({2, 0, 1, 2}, {2, 2});
  Tensor weight3 = tensor<double>({0.3, 1.0, 2.5}), weight4 = tensor<double>({0.3, 1.0, 2.5, 4.0});
  for (Reduction r : kReductions)
    for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
      EXPECT_GRADCHECK([=](In t) { return nll_loss(t[0], target, weight4, r, ignore); }, {lp});
      EXPECT_GRADCHECK([=](In t) { return nll_loss(t[0], target, Tensor(), r, ignore); }, {lp});
      EXPECT_GRADCHECK([=](In t) { return nll_loss(t[0], spatial_target, weight3, r, ignore); },
                       {spatial});
    }
}

TEST(NllLoss, Errors) {
  Tensor lp = randn({2, 3}, kFloat64);
  Tensor target = tensor<int64_t>({0, 2});
  EXPECT_LOOM_ERROR(nll_loss(lp, target, ones({4}, kFloat64)), ShapeError,
                    {"nll_loss", "weight", "[4]", "[2, 3]"});
  EXPECT_LOOM_ERROR(nll_loss(lp, target, ones({3})), DTypeError, {"nll_loss", "weight"});
  EXPECT_LOOM_ERROR(nll_loss(lp, tensor<int64_t>({5, 0})), IndexError,
                    {"nll_loss", "target 5", "[2, 3]", "[2]"});
  EXPECT_LOOM_ERROR(nll_loss(lp, tensor<double>({0, 1})), DTypeError, {"nll_loss", "float64"});
  EXPECT_LOOM_ERROR(nll_loss(lp, zeros({3}, kInt64)), ShapeError, {"nll_loss", "[2, 3]", "[3]"});
}

// ---------------------------------------------------------------- mse

TEST(MseLoss, ForwardMatchesReference) {
  manual_seed(8);
  Tensor a = randn({3, 4}, kFloat64), b = randn({3, 4}, kFloat64);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> sq(av.size());
  for (size_t i = 0; i < av.size(); ++i) sq[i] = (av[i] - bv[i]) * (av[i] - bv[i]);
  EXPECT_TRUE(values_are(mse_loss(a, b, Reduction::None), sq, 1e-12));
  EXPECT_TRUE(values_are(mse_loss(a, b, Reduction::Sum), reduce(sq, Reduction::Sum, 1), 1e-12));
  EXPECT_TRUE(values_are(mse_loss(a, b), reduce(sq, Reduction::Mean, 12), 1e-12));
  EXPECT_EQ(mse_loss(a, b).dim(), 0);
  // Non-contiguous operands and float32.
  EXPECT_TRUE(tensors_close(mse_loss(a.t(), b.t(), Reduction::None), from(sq, {3, 4}).t(), 1e-12));
  EXPECT_TRUE(tensors_close(mse_loss(a.to(kFloat32), b.to(kFloat32)),
                            from(reduce(sq, Reduction::Mean, 12), {}).to(kFloat32), 1e-5));
}

TEST(MseLoss, Gradcheck) {
  manual_seed(9);
  Tensor a = dparam({2, 3}), b = dparam({2, 3});
  for (Reduction r : kReductions) {
    EXPECT_GRADCHECK([r](In t) { return mse_loss(t[0], t[1], r); }, {a, b});
    EXPECT_GRADCHECK([r, b](In t) { return mse_loss(t[0], b.detach(), r); }, {a});
  }
}

TEST(MseLoss, Errors) {
  EXPECT_LOOM_ERROR(mse_loss(randn({2, 3}), randn({3, 2})), ShapeError,
                    {"mse_loss", "[2, 3]", "[3, 2]"});
  EXPECT_LOOM_ERROR(mse_loss(randn({2, 3}), randn({2, 3}, kFloat64)), DTypeError,
                    {"mse_loss", "float32", "float64"});
  // The backward's dloss: one element for a reduced loss, one per element otherwise.
  const Tensor a = randn({2, 3}), b = randn({2, 3});
  EXPECT_LOOM_ERROR(kernels::mse_loss_backward(randn({2}), a, b, Reduction::Mean), ShapeError,
                    {"mse_loss_backward", "[2]"});
  EXPECT_LOOM_ERROR(kernels::mse_loss_backward(randn({5}), a, b, Reduction::None), ShapeError,
                    {"mse_loss_backward", "[5]"});
}
