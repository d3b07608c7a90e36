// tests/tensor/elementwise_test.cpp — elementwise ops: forward against std:: math on each
// element, broadcasting, dtype promotion, gradcheck of every differentiable op, the errors.

#include "tensor/elementwise.h"

#include <cmath>
#include <functional>

#include "test_util.h"

using namespace loom;
using loom::test::dparam;
using loom::test::tensors_close;
using loom::test::values_are;

namespace {

// Applies f to each element of x's values (the naive reference).
Tensor reference_unary(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v) e = f(e);
  return tensor<double>(v, x.sizes()).to(x.dtype());
}

double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST(Elementwise, UnaryMatchesReference) {
  manual_seed(1);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn({4, 5}, dt);
    Tensor pos = rand({4, 5}, dt) + 0.1;
    const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    EXPECT_TRUE(
        tensors_close(exp(x), reference_unary(x, [](double v) { return std::exp(v); }), tol));
    EXPECT_TRUE(
        tensors_close(log(pos), reference_unary(pos, [](double v) { return std::log(v); }), tol));
    EXPECT_TRUE(
        tensors_close(sqrt(pos), reference_unary(pos, [](double v) { return std::sqrt(v); }), tol));
    EXPECT_TRUE(tensors_close(
        rsqrt(pos), reference_unary(pos, [](double v) { return 1 / std::sqrt(v); }), tol));
    EXPECT_TRUE(
        tensors_close(abs(x), reference_unary(x, [](double v) { return std::fabs(v); }), tol));
    EXPECT_TRUE(tensors_close(neg(x), reference_unary(x, [](double v) { return -v; }), tol));
    EXPECT_TRUE(
        tensors_close(tanh(x), reference_unary(x, [](double v) { return std::tanh(v); }), tol));
    EXPECT_TRUE(tensors_close(
        sigmoid(x), reference_unary(x, [](double v) { return 1 / (1 + std::exp(-v)); }), tol));
    EXPECT_TRUE(
        tensors_close(relu(x), reference_unary(x, [](double v) { return v > 0 ? v : 0; }), tol));
    EXPECT_TRUE(tensors_close(gelu(x), reference_unary(x, gelu_erf), tol, tol));
    EXPECT_TRUE(tensors_close(gelu(x, "tanh"), reference_unary(x, gelu_tanh), tol, tol));
    EXPECT_TRUE(tensors_close(clamp(x, -0.5, 0.5),
                              reference_unary(x, [](double v) { return std::clamp(v, -0.5, 0.5); }),
                              tol));
    EXPECT_TRUE(tensors_close(
        pow(pos, 1.7), reference_unary(pos, [](double v) { return std::pow(v, 1.7); }), tol));
  }
}

TEST(Elementwise, BinaryBroadcastsAndPromotes) {
  Tensor a = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = tensor<float>({10, 20, 30});
  Tensor col = tensor<float>({100, 200}, {2, 1});
  EXPECT_TRUE(values_are(a + b, {11, 22, 33, 14, 25, 36}));
  EXPECT_TRUE(values_are(a - col, {-99, -98, -97, -196, -195, -194}));
  EXPECT_TRUE(values_are(a * b, {10, 40, 90, 40, 100, 180}));
  EXPECT_TRUE(values_are(b / a, {10, 10, 10, 2.5, 4, 5}, 1e-6));
  EXPECT_TRUE(values_are(add(a, b, 2.0), {21, 42, 63, 24, 45, 66}));
  EXPECT_EQ((col + b).sizes(), (Shape{2, 3}));
  // Promotion: int64 + float32 -> float32; float32 + float64 -> float64; int / int -> float.
  EXPECT_EQ((arange(3) + b).dtype(), kFloat32);
  EXPECT_EQ((b + tensor<double>({1})).dtype(), kFloat64);
  Tensor q = div(tensor<int64_t>({1, 3}), tensor<int64_t>({2, 2}));
  EXPECT_EQ(q.dtype(), kFloat32);
  EXPECT_TRUE(values_are(q, {0.5, 1.5}));
  EXPECT_TRUE(values_are(pow(tensor<int64_t>({2, 3}), tensor<int64_t>({3, 2})), {8, 9}));
  EXPECT_TRUE(values_are(maximum(a, tensor<float>({3})), {3, 3, 3, 4, 5, 6}));
  EXPECT_TRUE(values_are(minimum(a, tensor<float>({3})), {1, 2, 3, 3, 3, 3}));
  // Scalars keep the tensor's dtype.
  EXPECT_EQ((a * 2.0).dtype(), kFloat32);
  EXPECT_TRUE(values_are(1.0 - b, {-9, -19, -29}));
  EXPECT_TRUE(values_are(60.0 / b, {6, 3, 2}, 1e-6));
  // Non-contiguous operands.
  EXPECT_TRUE(values_are(a.t() + a.t(), {2, 8, 4, 10, 6, 12}));
}

TEST(Elementwise, LargeTensorsUseThreadsCorrectly) {
  manual_seed(3);
  Tensor a = randn({300, 257}, kFloat64), b = randn({257}, kFloat64);
  Tensor got = a * b + a;
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), gv = got.to_vector<double>();
  for (size_t i = 0; i < av.size(); ++i)
    ASSERT_NEAR(gv[i], av[i] * bv[i % 257] + av[i], 1e-14) << i;
  Tensor big = randn({100000}, kFloat64);
  EXPECT_TRUE(tensors_close(relu(big), maximum(big, zeros({1}, kFloat64)), 0, 0));
}

TEST(Elementwise, ComparisonsAndWhere) {
  Tensor a = tensor<float>({1, 2, 3});
  Tensor b = tensor<float>({3, 2, 1});
  EXPECT_EQ((a < b).dtype(), kBool);
  EXPECT_TRUE(values_are(a < b, {1, 0, 0}));
  EXPECT_TRUE(values_are(a <= b, {1, 1, 0}));
  EXPECT_TRUE(values_are(a > b, {0, 0, 1}));
  EXPECT_TRUE(values_are(a >= b, {0, 1, 1}));
  EXPECT_TRUE(values_are(a == b, {0, 1, 0}));
  EXPECT_TRUE(values_are(a != b, {1, 0, 1}));
  EXPECT_TRUE(values_are(where(a < b, a, b), {1, 2, 1}));
  EXPECT_TRUE(values_are(where(a < b, a, tensor<float>({-1})), {1, -1, -1}));
  EXPECT_LOOM_ERROR(where(a, a, b), DTypeError, {"where", "bool"});
}

TEST(Elementwise, InPlace) {
  Tensor a = tensor<float>({1, 2, 3, 4}, {2, 2});
  a.add_(tensor<float>({10, 20}));
  EXPECT_TRUE(values_are(a, {11, 22, 13, 24}));
  a.mul_(2.0);
  EXPECT_TRUE(values_are(a, {22, 44, 26, 48}));
  a.sub_(tensor<float>({1}), 2.0);
  EXPECT_TRUE(values_are(a, {20, 42, 24, 46}));
  a.div_(tensor<float>({2}));
  EXPECT_TRUE(values_are(a, {10, 21, 12, 23}));
  a.t().zero_();
  EXPECT_TRUE(values_are(a, {0, 0, 0, 0}));
  EXPECT_LOOM_ERROR(zeros({2}).add_(zeros({2, 2})), ShapeError, {"add_", "[2, 2]", "[2]"});
}

// Note [Overlapping operands]: an input that shares memory with the written-to tensor other than
// element for element is refused, as is a written-to tensor with repeated addresses; the same
// view, disjoint parts of one storage, and interleaved views are fine.
TEST(Elementwise, OverlappingOperandsAreRefused) {
  Tensor x = arange(0, 10, 1, kFloat32);
  const std::vector<std::string> shared = {"one memory location", "clone() the input first"};
  EXPECT_LOOM_ERROR(x.narrow(0, 1, 9).copy_(x.narrow(0, 0, 9)), ValueError,
                    {"copy_", "offset=0", "offset=1", shared[0], shared[1]});
  EXPECT_LOOM_ERROR(x.narrow(0, 0, 9).add_(x.narrow(0, 1, 9)), ValueError, {"add_", shared[0]});
  Tensor m = arange(0, 9, 1, kFloat32).reshape({3, 3});
  EXPECT_LOOM_ERROR(m.add_(m.t()), ValueError, {"add_", "strides=[1, 3]", shared[0]});
  EXPECT_LOOM_ERROR(m.mul_(m.select(0, 1)), ValueError, {"mul_", shared[0]});  // broadcast row
  EXPECT_LOOM_ERROR(kernels::addcmul_(m, ones({3, 3}), m.t()), ValueError, {"addcmul_"});
  EXPECT_TRUE(values_are(x, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));  // refused before any write
  EXPECT_TRUE(values_are(m, {0, 1, 2, 3, 4, 5, 6, 7, 8}));
  for (const auto& f : std::vector<std::function<void(Tensor)>>{
           [](Tensor t) { t.add_(ones({4})); }, [](Tensor t) { t.mul_(2.0); },
           [](Tensor t) { t.copy_(ones({4})); }})
    EXPECT_LOOM_ERROR(f(zeros({1}).expand({4})), ValueError,
                      {"more than one element of the written-to tensor", "strides=[0]"});

  // Allowed: the same view, disjoint halves, interleaved views, an empty expanded tensor.
  kernels::add_(zeros({0, 1}).expand({0, 3}), zeros({0, 3}));
  x.add_(x);
  EXPECT_TRUE(values_are(x, {0, 2, 4, 6, 8, 10, 12, 14, 16, 18}));
  x.narrow(0, 0, 5).copy_(x.narrow(0, 5, 5));
  EXPECT_TRUE(values_are(x, {10, 12, 14, 16, 18, 10, 12, 14, 16, 18}));
  x.slice(0, 0, 10, 2).sub_(x.slice(0, 1, 10, 2));
  EXPECT_TRUE(values_are(x, {-2, 12, -2, 16, 8, 10, -2, 14, -2, 18}));
}

TEST(Elementwise, Errors) {
  EXPECT_LOOM_ERROR(zeros({2, 3}) + zeros({4}), ShapeError, {"add", "[2, 3]", "[4]"});
  EXPECT_LOOM_ERROR(zeros({2, 3}) * zeros({3, 2}), ShapeError, {"mul", "[2, 3]", "[3, 2]"});
  EXPECT_LOOM_ERROR(exp(arange(3)), DTypeError, {"exp", "int64"});
  EXPECT_LOOM_ERROR(kernels::addcmul_(zeros({2}, kFloat16), zeros({2}), zeros({2})), DTypeError,
                    {"addcmul_", "float16"});
  EXPECT_LOOM_ERROR(clamp(zeros({2}), 1, 0), ValueError, {"clamp"});
  EXPECT_LOOM_ERROR(gelu(zeros({2}), "fast"), ValueError, {"gelu", "fast"});
}

// float16 and bfloat16 elements compute in float and round once (Note [16-bit arithmetic]): each
// op on 16-bit tensors equals the float32 op on the widened tensors rounded to 16 bits, bit for
// bit, whatever the layout; comparisons and where are exact.
TEST(Elementwise, SixteenBitOpsComputeInFloatAndRoundOnce) {
  manual_seed(5);
  using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Binary>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return kernels::add(a, b, -2.5); }},
      {"add broadcast", [](const Tensor& a, const Tensor& b) { return a + slice(b, 0, 2, 3); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"scalars", [](const Tensor& a, const Tensor&) { return kernels::mul_scalar(a, 2.5); }},
      {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }},
      {"neg", [](const Tensor& a, const Tensor&) { return -a; }},
      {"exp", [](const Tensor& a, const Tensor&) { return exp(a); }},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
      {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a); }},
      {"clamp", [](const Tensor& a, const Tensor&) { return clamp(a, -0.5, 0.25); }},
      {"relu_backward",
       [](const Tensor& a, const Tensor& b) { return kernels::relu_backward(a, b); }},
      {"where", [](const Tensor& a, const Tensor& b) { return where(a > b, a, b); }},
  };
  for (DType low : {kFloat16, kBFloat16}) {
    const Tensor a = randn({6, 4, 3, 5}).to(low), b = randn({6, 4, 3, 5}).to(low);
    for (const auto& [name, op] : ops) {
      for (bool channels_last : {false, true}) {
        SCOPED_TRACE(detail::str(name, " ", low, channels_last ? " channels-last" : ""));
        const MemoryFormat f =
            channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
        const Tensor x = a.contiguous(f), y = b.contiguous(f);
        const Tensor got = op(x, y);
        EXPECT_EQ(got.dtype(), low);
        EXPECT_TRUE(got.is_contiguous(f));
        EXPECT_TRUE(tensors_close(got, op(x.to(kFloat32), y.to(kFloat32)).to(low), 0, 0));
      }
    }
    // In place, with a float32 operand converted to self's dtype first (as for any dtype).
    Tensor c = a.clone();
    c.add_(b);
    EXPECT_TRUE(tensors_close(c, (a.to(kFloat32) + b.to(kFloat32)).to(low), 0, 0));
    // Comparisons with a scalar and between tensors; mixed 16-bit dtypes promote to float32.
    EXPECT_TRUE(
        tensors_close(kernels::gt_scalar(a, 0.5), kernels::gt_scalar(a.to(kFloat32), 0.5), 0, 0));
    EXPECT_TRUE(tensors_close(a < b, a.to(kFloat32) < b.to(kFloat32), 0, 0));
  }
  EXPECT_EQ((zeros({2}, kFloat16) + zeros({2}, kBFloat16)).dtype(), kFloat32);
  EXPECT_EQ((zeros({2}, kFloat16) + zeros({2})).dtype(), kFloat32);
}

TEST(ElementwiseGrad, Gradcheck) {
  manual_seed(5);
  Tensor a = dparam({2, 3}), b = dparam({3}), c = dparam({2, 1});
  Tensor pos = (rand({2, 3}, kFloat64) + 0.5).requires_grad_();
  using In = const std::vector<Tensor>&;
  EXPECT_GRADCHECK([](In t) { return add(t[0], t[1], 0.5); }, {a, b});
  EXPECT_GRADCHECK([](In t) { return sub(t[0], t[1], 2.0); }, {a, c});
  EXPECT_GRADCHECK([](In t) { return t[0] * t[1]; }, {a, b});
  EXPECT_GRADCHECK([](In t) { return t[0] / t[1]; }, {a, pos});
  EXPECT_GRADCHECK([](In t) { return pow(t[0], t[1]); }, {pos, b});
  EXPECT_GRADCHECK([](In t) { return pow(t[0], 3.0); }, {a});
  EXPECT_GRADCHECK([](In t) { return pow(t[0], 0.5); }, {pos});
  EXPECT_GRADCHECK([](In t) { return maximum(t[0], t[1]); }, {a, b});
  EXPECT_GRADCHECK([](In t) { return minimum(t[0], t[1]); }, {a, c});
  EXPECT_GRADCHECK([](In t) { return -t[0]; }, {a});
  EXPECT_GRADCHECK([](In t) { return exp(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return log(t[0]); }, {pos});
  EXPECT_GRADCHECK([](In t) { return sqrt(t[0]); }, {pos});
  EXPECT_GRADCHECK([](In t) { return rsqrt(t[0]); }, {pos});
  EXPECT_GRADCHECK([](In t) { return abs(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return tanh(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return sigmoid(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return relu(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return gelu(t[0]); }, {a});
  EXPECT_GRADCHECK([](In t) { return gelu(t[0], "tanh"); }, {a});
  EXPECT_GRADCHECK([](In t) { return clamp(t[0], -0.3, 0.4); }, {a});
  EXPECT_GRADCHECK([](In t) { return where(t[0] > t[1], t[0], t[1]); }, {a, b});
  EXPECT_GRADCHECK([](In t) { return 2.0 / t[0] + t[0] / 4.0 - 3.0 * t[0] + (1.0 - t[0]); }, {pos});
}

TEST(ElementwiseGrad, TiesSplitTheGradient) {
  Tensor a = tensor<double>({1, 2}).requires_grad_();
  Tensor b = tensor<double>({1, 3}).requires_grad_();
  sum(maximum(a, b)).backward();
  EXPECT_TRUE(values_are(a.grad(), {0.5, 0}));
  EXPECT_TRUE(values_are(b.grad(), {0.5, 1}));
}
