// tests/cuda/elementwise_cuda_test.cpp — the CUDA elementwise kernels against the CPU ones: every
// op of tensor/elementwise.h on contiguous, transposed, sliced, broadcast and misaligned inputs,
// odd sizes, float32/float64 and the integer dtypes, in-place ops on views, more dims than one
// launch holds, 64-bit indexing, and the errors. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/view.h"

using namespace loom;
using loom::test::cuda_matches_cpu;
using loom::test::kCuda0;
namespace k = loom::kernels;

namespace {

using View = std::function<Tensor(const Tensor&)>;
const View kSame = [](const Tensor& t) { return t; };
const View kTransposed = [](const Tensor& t) { return t.t(); };
const View kStepped = [](const Tensor& t) { return t.slice(1, 1, 10, 2); };   // [8, 19] -> [8, 5]
const View kOffsetOne = [](const Tensor& t) { return t.slice(0, 1, 1001); };  // misaligned
const View kExpanded = [](const Tensor& t) { return t.expand({4, 11}); };     // stride 0

// Two operands in one layout: base shapes (made on the CPU, copied to the GPU) and the view
// taken of each on both devices.
struct Layout {
  std::string name;
  Shape a_shape, b_shape;
  View a_view = kSame, b_view = kSame;
};

// with_large adds a 1000003-element pair (the vector path and its tail); it costs the CPU side
// most of a test's time, so only some dtypes take it.
std::vector<Layout> binary_layouts(bool with_large) {
  std::vector<Layout> layouts = {
      {"contiguous", {7, 13}, {7, 13}},
      {"one element", {1}, {1}},
      {"seven", {7}, {7}},
      {"broadcast both", {4, 1, 5}, {3, 1}},
      {"broadcast row", {6, 33}, {33}},
      {"0-d operand", {5, 3}, {}},
      {"transposed", {9, 6}, {6, 9}, kTransposed},
      {"stepped slice", {8, 19}, {8, 5}, kStepped},
      {"misaligned (offset 1)", {1001}, {1000}, kOffsetOne},
      {"expanded", {1, 11}, {4, 11}, kExpanded},
  };
  if (with_large) layouts.push_back({"odd large (vector tail)", {1000003}, {1000003}});
  return layouts;
}

double tol_for(DType dt) { return dt == kFloat32 ? 1e-5 : 1e-12; }

// op on the GPU (inputs copied there, then viewed) against op on the CPU.
void expect_binary(const std::string& what, const Tensor& a, const Tensor& b, const Layout& l,
                   double rtol, double atol, const std::function<Tensor(Tensor, Tensor)>& op) {
  const Tensor on_cpu = op(l.a_view(a), l.b_view(b));
  const Tensor on_cuda = op(l.a_view(a.to(kCuda0)), l.b_view(b.to(kCuda0)));
  EXPECT_TRUE(cuda_matches_cpu(on_cuda, on_cpu, rtol, atol))
      << what << " on " << l.name << " (" << a.dtype() << ", " << b.dtype() << ")";
}

void expect_unary(const std::string& what, const Tensor& x, const View& view, double rtol,
                  double atol, const std::function<Tensor(Tensor)>& op) {
  EXPECT_TRUE(cuda_matches_cpu(op(view(x.to(kCuda0))), op(view(x)), rtol, atol))
      << what << " (" << x.dtype() << ", shape " << detail::str(x.sizes()) << ")";
}

}  // namespace

TEST(CudaElementwise, BinaryOpsMatchCpuOnEveryLayout) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(1);
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = tol_for(dt);
    for (const Layout& l : binary_layouts(dt == kFloat32)) {
      const Tensor a = randn(l.a_shape, dt);
      const Tensor b = rand(l.b_shape, dt) + 0.5;  // positive: a safe divisor and pow base
      expect_binary("a + b", a, b, l, tol, tol, [](Tensor x, Tensor y) { return x + y; });
      expect_binary("add alpha", a, b, l, tol, tol,
                    [](Tensor x, Tensor y) { return k::add(x, y, -2.5); });
      expect_binary("a - b", a, b, l, tol, tol, [](Tensor x, Tensor y) { return x - y; });
      expect_binary("sub alpha", a, b, l, tol, tol,
                    [](Tensor x, Tensor y) { return k::sub(x, y, 0.25); });
      expect_binary("a * b", a, b, l, tol, tol, [](Tensor x, Tensor y) { return x * y; });
      expect_binary("a / b", a, b, l, tol, tol, [](Tensor x, Tensor y) { return x / y; });
      expect_binary("pow(b, a)", a, b, l, tol, tol, [](Tensor x, Tensor y) { return pow(y, x); });
      expect_binary("maximum", a, b, l, 0, 0, [](Tensor x, Tensor y) { return maximum(x, y); });
      expect_binary("minimum", a, b, l, 0, 0, [](Tensor x, Tensor y) { return minimum(x, y); });
    }
  }
}

TEST(CudaElementwise, PromotesLikeTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(2);
  const Layout l{"broadcast", {4, 6}, {6}};
  const Tensor f32 = randn({4, 6}), f64 = randn({6}, kFloat64);
  const Tensor i32 = randint(-50, 50, {4, 6}, kInt32), i64 = randint(1, 50, {6}, kInt64);
  const Tensor u8 = randint(0, 256, {4, 6}, kUInt8), u8b = randint(0, 256, {6}, kUInt8);
  const auto add = [](Tensor x, Tensor y) { return x + y; };
  const auto mul = [](Tensor x, Tensor y) { return x * y; };
  const auto div = [](Tensor x, Tensor y) { return x / y; };
  expect_binary("int32 + float64", i32, f64, l, 1e-12, 1e-12, add);
  expect_binary("float32 * float64", f32, f64, l, 1e-12, 1e-12, mul);
  expect_binary("int32 + int64", i32, i64, l, 0, 0, add);
  expect_binary("int32 * int64", i32, i64, l, 0, 0, mul);
  expect_binary("uint8 + uint8 (wraps)", u8, u8b, l, 0, 0, add);
  expect_binary("uint8 * uint8 (wraps)", u8, u8b, l, 0, 0, mul);
  expect_binary("int32 / int64 (true division)", i32, i64, l, 1e-6, 1e-6, div);
  expect_binary("int64 pow int64", randint(-3, 4, {4, 6}, kInt64), randint(0, 5, {6}, kInt64), l, 0,
                0, [](Tensor x, Tensor y) { return pow(x, y); });
  expect_binary("maximum int32, uint8", i32, u8b, l, 0, 0,
                [](Tensor x, Tensor y) { return maximum(x, y); });
  // float16 + bfloat16 compute in float32 (both converted on the device first).
  expect_binary("float16 + bfloat16", f32.to(kFloat16), f64.to(kBFloat16), l, 0, 0, add);
}

// float16 and bfloat16: widened to float element by element on the device, rounded once on
// store, as the CPU widens them (Note [16-bit arithmetic]). + - * / and the selections give the
// CPU's bits on every layout; the transcendental ops agree within a rounding.
TEST(CudaElementwise, SixteenBitOpsMatchCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(13);
  for (DType dt : {kFloat16, kBFloat16}) {
    for (const Layout& l : binary_layouts(dt == kFloat16)) {
      const Tensor a = randn(l.a_shape).to(dt);
      const Tensor b = (rand(l.b_shape) + 0.5).to(dt);
      const auto exact = [&](const std::string& what,
                             const std::function<Tensor(Tensor, Tensor)>& op) {
        expect_binary(what, a, b, l, 0, 0, op);
      };
      exact("a + b", [](Tensor x, Tensor y) { return x + y; });
      exact("add alpha", [](Tensor x, Tensor y) { return k::add(x, y, -2.5); });
      exact("a - b", [](Tensor x, Tensor y) { return x - y; });
      exact("a * b", [](Tensor x, Tensor y) { return x * y; });
      exact("a / b", [](Tensor x, Tensor y) { return x / y; });
      exact("maximum", [](Tensor x, Tensor y) { return maximum(x, y); });
      exact("a < b", [](Tensor x, Tensor y) { return x < y; });
      exact("where", [](Tensor x, Tensor y) { return where(x > y, x, y); });
      exact("relu_backward", [](Tensor x, Tensor y) { return k::relu_backward(y, x); });
      expect_unary("relu", a, l.a_view, 0, 0, [](Tensor x) { return relu(x); });
      expect_unary("a * 2.5 + 1", a, l.a_view, 0, 0, [](Tensor x) { return x * 2.5 + 1.0; });
      expect_unary("gt_scalar", a, l.a_view, 0, 0, [](Tensor x) { return k::gt_scalar(x, 0.25); });
      const double tol = dt == kFloat16 ? 1e-3 : 8e-3;  // one rounding of a float ulp apart
      expect_unary("exp", a, l.a_view, tol, tol, [](Tensor x) { return exp(x); });
      expect_unary("tanh", a, l.a_view, tol, tol, [](Tensor x) { return tanh(x); });
      expect_unary("gelu", a, l.a_view, tol, tol, [](Tensor x) { return gelu(x); });
    }
    // In place into a strided 16-bit view, with a broadcast operand.
    const Tensor self = randn({8, 6}).to(dt), other = randn({8}).to(dt);
    const Tensor gself = self.to(kCuda0);
    k::add_(self.t().slice(0, 1, 5), other);
    k::add_(gself.t().slice(0, 1, 5), other.to(kCuda0));
    EXPECT_TRUE(cuda_matches_cpu(gself, self, 0, 0));
  }
}

TEST(CudaElementwise, ComparisonsReturnBoolWithTies) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  for (DType dt : {kFloat32, kFloat64, kInt64, kInt32, kUInt8}) {
    for (const Layout& l : binary_layouts(dt == kFloat32)) {
      const Tensor a = randint(0, 4, l.a_shape, dt), b = randint(0, 4, l.b_shape, dt);
      expect_binary("==", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x == y; });
      expect_binary("!=", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x != y; });
      expect_binary("<", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x < y; });
      expect_binary("<=", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x <= y; });
      expect_binary(">", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x > y; });
      expect_binary(">=", a, b, l, 0, 0, [](Tensor x, Tensor y) { return x >= y; });
      for (double s : {1.0, 2.5}) {
        expect_unary("eq_scalar", a, l.a_view, 0, 0, [s](Tensor x) { return k::eq_scalar(x, s); });
        expect_unary("gt_scalar", a, l.a_view, 0, 0, [s](Tensor x) { return k::gt_scalar(x, s); });
        expect_unary("lt_scalar", a, l.a_view, 0, 0, [s](Tensor x) { return k::lt_scalar(x, s); });
      }
    }
  }
  // Mixed dtypes compare in the promoted type.
  const Layout l{"broadcast", {3, 4}, {4}};
  expect_binary("int64 < float32", randint(-2, 3, {3, 4}, kInt64), randn({4}), l, 0, 0,
                [](Tensor x, Tensor y) { return x < y; });
}

TEST(CudaElementwise, ScalarOperands) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(4);
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = tol_for(dt);
    for (const Layout& l : binary_layouts(dt == kFloat64)) {
      const Tensor x = randn(l.a_shape, dt), pos = rand(l.a_shape, dt) + 0.1;
      expect_unary("x + 1.5", x, l.a_view, tol, tol, [](Tensor t) { return t + 1.5; });
      expect_unary("x * -3", x, l.a_view, tol, tol, [](Tensor t) { return t * -3.0; });
      expect_unary("2 - x", x, l.a_view, tol, tol, [](Tensor t) { return 2.0 - t; });
      expect_unary("x / 7", x, l.a_view, tol, tol, [](Tensor t) { return t / 7.0; });
      expect_unary("pow 2", x, l.a_view, tol, tol, [](Tensor t) { return pow(t, 2.0); });
      expect_unary("pow 0.5", pos, l.a_view, tol, tol, [](Tensor t) { return pow(t, 0.5); });
      expect_unary("pow 3", x, l.a_view, tol, tol, [](Tensor t) { return pow(t, 3.0); });
      expect_unary("pow -1.5", pos, l.a_view, tol, tol, [](Tensor t) { return pow(t, -1.5); });
    }
  }
  // Integer tensors: whole scalars keep the dtype, fractional ones and division give float32.
  const Tensor i = randint(-9, 10, {5, 7}, kInt32), u = randint(0, 256, {5, 7}, kUInt8);
  for (const Tensor& t : {i, u, i.to(kInt64)}) {
    expect_unary("int + 3", t, kSame, 0, 0, [](Tensor x) { return k::add_scalar(x, 3.0); });
    expect_unary("int + 2.5", t, kSame, 0, 0, [](Tensor x) { return k::add_scalar(x, 2.5); });
    expect_unary("int * 4", t, kSame, 0, 0, [](Tensor x) { return k::mul_scalar(x, 4.0); });
    expect_unary("5 - int", t, kSame, 0, 0, [](Tensor x) { return k::rsub_scalar(x, 5.0); });
    expect_unary("int / 2", t, kSame, 1e-6, 0, [](Tensor x) { return k::div_scalar(x, 2.0); });
    expect_unary("int ^ 3", t, kSame, 0, 0, [](Tensor x) { return k::pow_scalar(x, 3.0); });
    expect_unary("int ^ 2", t, kSame, 0, 0, [](Tensor x) { return k::pow_scalar(x, 2.0); });
    expect_unary("int ^ 0.5", t, kSame, 1e-6, 1e-6,
                 [](Tensor x) { return k::pow_scalar(x.abs(), 0.5); });
  }
  expect_unary("int ^ -1", i, kSame, 0, 0, [](Tensor x) { return k::pow_scalar(x, -1.0); });
}

TEST(CudaElementwise, UnaryOpsMatchCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  const std::vector<std::pair<Shape, View>> layouts = {
      {{1}, kSame},         {{7}, kSame},       {{9, 6}, kTransposed}, {{8, 19}, kStepped},
      {{1001}, kOffsetOne}, {{1000003}, kSame}, {{}, kSame},
  };
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = tol_for(dt);
    for (const auto& [shape, view] : layouts) {
      if (dt == kFloat64 && shape == Shape{1000003}) continue;  // float32 covers the long vector
      const Tensor x = randn(shape, dt) * 3.0;  // some values where tanh and erf saturate
      const Tensor pos = rand(shape, dt) + 0.05;
      expect_unary("-x", x, view, 0, 0, [](Tensor t) { return -t; });
      expect_unary("exp", x, view, tol, tol, [](Tensor t) { return exp(t); });
      expect_unary("log", pos, view, tol, tol, [](Tensor t) { return log(t); });
      expect_unary("log of negatives (NaN)", x, view, tol, tol, [](Tensor t) { return log(t); });
      expect_unary("sqrt", pos, view, tol, tol, [](Tensor t) { return sqrt(t); });
      expect_unary("rsqrt", pos, view, tol, tol, [](Tensor t) { return rsqrt(t); });
      expect_unary("abs", x, view, 0, 0, [](Tensor t) { return abs(t); });
      expect_unary("sign", x, view, 0, 0, [](Tensor t) { return k::sign(t); });
      expect_unary("tanh", x, view, tol, tol, [](Tensor t) { return tanh(t); });
      expect_unary("sigmoid", x, view, tol, tol, [](Tensor t) { return sigmoid(t); });
      expect_unary("relu", x, view, 0, 0, [](Tensor t) { return relu(t); });
      expect_unary("gelu erf", x, view, tol, tol, [](Tensor t) { return gelu(t); });
      expect_unary("gelu tanh", x, view, tol, tol, [](Tensor t) { return gelu(t, "tanh"); });
      expect_unary("clamp", x, view, 0, 0, [](Tensor t) { return clamp(t, -0.5, 0.75); });
      expect_unary("clamp one-sided", x, view, 0, 0,
                   [](Tensor t) { return clamp(t, 0.0, INFINITY); });
      expect_unary("clamp NaN", x, view, tol, tol,
                   [](Tensor t) { return clamp(log(t), -1.0, 1.0); });
    }
  }
  // The numeric ones on integers.
  for (DType dt : {kInt64, kInt32, kUInt8}) {
    const Tensor x = dt == kUInt8 ? randint(0, 256, {5, 9}, dt) : randint(-20, 20, {5, 9}, dt);
    const View t = [](const Tensor& v) { return v.t(); };
    expect_unary("neg", x, t, 0, 0, [](Tensor v) { return k::neg(v); });
    expect_unary("abs", x, t, 0, 0, [](Tensor v) { return k::abs(v); });
    expect_unary("sign", x, t, 0, 0, [](Tensor v) { return k::sign(v); });
    expect_unary("relu", x, t, 0, 0, [](Tensor v) { return k::relu(v); });
    expect_unary("clamp", x, t, 0, 0, [](Tensor v) { return k::clamp(v, 3.0, 12.0); });
  }
}

TEST(CudaElementwise, WhereBroadcastsAndPromotes) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  const Tensor condition = randn({4, 1}) > randn({4, 1});
  const Tensor a = randn({1, 5}), b = randn({4, 5}, kFloat64), ai = randint(-5, 5, {5}, kInt32);
  const auto on_cuda = [](const Tensor& t) { return t.to(kCuda0); };
  EXPECT_TRUE(cuda_matches_cpu(where(on_cuda(condition), on_cuda(a), on_cuda(b)),
                               where(condition, a, b), 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(where(on_cuda(condition), on_cuda(ai), on_cuda(a)),
                               where(condition, ai, a), 0, 0));
  const Tensor big_c = k::gt_scalar(randn({1000003}), 0.0), big_a = randn({1000003}),
               big_b = randn({});
  EXPECT_TRUE(cuda_matches_cpu(where(on_cuda(big_c), on_cuda(big_a), on_cuda(big_b)),
                               where(big_c, big_a, big_b), 0, 0));
  // Transposed operands.
  const Tensor ct = k::gt_scalar(randn({5, 4}), 0.0), at = randn({5, 4}), bt = randn({4, 5});
  EXPECT_TRUE(cuda_matches_cpu(where(on_cuda(ct).t(), on_cuda(at).t(), on_cuda(bt)),
                               where(ct.t(), at.t(), bt), 0, 0));
}

TEST(CudaElementwise, FusedBackwardsMatchCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(7);
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = tol_for(dt);
    for (const Layout& l : binary_layouts(dt == kFloat32)) {
      const Tensor dout = randn(l.a_shape, dt), x = randn(l.b_shape, dt) * 2.0;
      const Tensor y = sigmoid(x);
      expect_binary("relu_backward", dout, x, l, 0, 0,
                    [](Tensor g, Tensor v) { return k::relu_backward(g, v); });
      expect_binary("sigmoid_backward", dout, y, l, tol, tol,
                    [](Tensor g, Tensor v) { return k::sigmoid_backward(g, v); });
      expect_binary("tanh_backward", dout, y, l, tol, tol,
                    [](Tensor g, Tensor v) { return k::tanh_backward(g, v); });
      expect_binary("gelu_backward erf", dout, x, l, tol, tol,
                    [](Tensor g, Tensor v) { return k::gelu_backward(g, v, false); });
      expect_binary("gelu_backward tanh", dout, x, l, tol, tol,
                    [](Tensor g, Tensor v) { return k::gelu_backward(g, v, true); });
      expect_binary("clamp_backward", dout, x, l, 0, 0,
                    [](Tensor g, Tensor v) { return k::clamp_backward(g, v, -0.5, 1.0); });
    }
  }
}

TEST(CudaElementwise, InPlaceOpsOnContiguousAndStridedSelf) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(8);
  using InPlace = std::function<void(const Tensor&, const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, InPlace>> ops = {
      {"add_", [](const Tensor& s, const Tensor& o, const Tensor&) { k::add_(s, o); }},
      {"add_ alpha", [](const Tensor& s, const Tensor& o, const Tensor&) { k::add_(s, o, -0.5); }},
      {"sub_", [](const Tensor& s, const Tensor& o, const Tensor&) { k::sub_(s, o, 2.0); }},
      {"mul_", [](const Tensor& s, const Tensor& o, const Tensor&) { k::mul_(s, o); }},
      {"div_", [](const Tensor& s, const Tensor&, const Tensor& p) { k::div_(s, p); }},
      {"mul_scalar_",
       [](const Tensor& s, const Tensor&, const Tensor&) { k::mul_scalar_(s, 1.5); }},
      {"add_scalar_", [](const Tensor& s, const Tensor&, const Tensor&) { k::add_scalar_(s, -4); }},
      {"addcmul_",
       [](const Tensor& s, const Tensor& o, const Tensor& p) { k::addcmul_(s, o, p, 0.3); }},
      {"addcdiv_",
       [](const Tensor& s, const Tensor& o, const Tensor& p) { k::addcdiv_(s, o, p, -0.7); }},
  };
  // self: the whole tensor, a transposed view, a column; other: same shape, or a broadcast row.
  const std::vector<std::pair<std::string, View>> selves = {
      {"contiguous", kSame},
      {"transposed", [](const Tensor& t) { return t.t(); }},
      {"column", [](const Tensor& t) { return t.select(1, 3); }},
      {"stepped slice", [](const Tensor& t) { return t.slice(0, 1, 6, 2); }},
  };
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = tol_for(dt);
    for (const auto& [op_name, op] : ops) {
      for (const auto& [self_name, view] : selves) {
        for (bool broadcast_other : {false, true}) {
          const Tensor base = randn({6, 6}, dt);
          const Tensor base_cuda = base.to(kCuda0);
          const Tensor self = view(base), self_cuda = view(base_cuda);
          Shape other_shape = self.sizes();
          if (broadcast_other) other_shape.front() = 1;
          const Tensor other = randn(other_shape, dt), positive = rand(other_shape, dt) + 0.5;
          const uint64_t version = base_cuda.version();
          op(self, other, positive);
          op(self_cuda, other.to(kCuda0), positive.to(kCuda0));
          EXPECT_GT(base_cuda.version(), version) << op_name;
          EXPECT_TRUE(cuda_matches_cpu(base_cuda, base, tol, tol))
              << op_name << " on a " << self_name << " self, " << dt
              << (broadcast_other ? ", broadcast other" : "");
        }
      }
    }
  }
  // Integer self with a float other: other is converted to self's dtype first.
  const Tensor self = randint(-10, 10, {4, 5}, kInt32), other = randn({5}) * 4.0;
  const Tensor self_cuda = self.to(kCuda0);
  k::add_(self, other);
  k::add_(self_cuda, other.to(kCuda0));
  k::mul_scalar_(self, 3);
  k::mul_scalar_(self_cuda, 3);
  EXPECT_TRUE(cuda_matches_cpu(self_cuda, self, 0, 0));
  // Large, contiguous (the vector path with a tail).
  const Tensor big = randn({1000003}), big_other = randn({1000003});
  const Tensor big_cuda = big.to(kCuda0);
  k::addcmul_(big, big_other, big_other, 0.1);
  k::addcmul_(big_cuda, big_other.to(kCuda0), big_other.to(kCuda0), 0.1);
  EXPECT_TRUE(cuda_matches_cpu(big_cuda, big));
}

TEST(CudaElementwise, MoreDimsThanOneLaunchHolds) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(9);
  // Ten dims of size 2 with reversed strides: no two merge, so the host loops over the outer two.
  const Shape shape(10, 2);
  Shape reversed;
  for (int64_t d = 9; d >= 0; --d) reversed.push_back(d);
  const Tensor x = randn(shape), y = randn(shape), z = randn({2, 1, 2});
  const Tensor x_cuda = x.to(kCuda0), y_cuda = y.to(kCuda0), z_cuda = z.to(kCuda0);
  // Same dtype: the strided kernel itself sees the ten dims.
  EXPECT_TRUE(
      cuda_matches_cpu(x_cuda.permute(reversed) * y_cuda + z_cuda, x.permute(reversed) * y + z));
  // Mixed dtypes: the permuted operand is converted (a ten-dim copy) first.
  const Tensor y64 = y.to(kFloat64);
  EXPECT_TRUE(cuda_matches_cpu(x_cuda.permute(reversed) * y64.to(kCuda0), x.permute(reversed) * y64,
                               1e-12, 1e-12));
  // In place into the permuted view.
  const Tensor base = randn(shape), base_cuda = base.to(kCuda0);
  k::add_(base.permute(reversed), y);
  k::add_(base_cuda.permute(reversed), y_cuda);
  EXPECT_TRUE(cuda_matches_cpu(base_cuda, base));
}

TEST(CudaElementwise, OffsetsBeyondInt32UseWideIndexing) {
  LOOM_SKIP_WITHOUT_GPU();
  // [3, 2^30] bytes: a [3, 4] slice reaches offset 2^31 + 3, past int32 (3 GiB on the device).
  const int64_t row = int64_t{1} << 30;
  const Tensor big = empty({3, row}, kUInt8, kCuda0);
  Tensor corner = big.slice(1, 0, 4);
  corner.fill_(7.0);
  const Tensor values = randint(0, 100, {3, 4}, kUInt8);
  k::add_(corner, values.to(kCuda0));
  const Tensor expected = values + 7.0;
  EXPECT_TRUE(cuda_matches_cpu(k::mul_scalar(corner, 1.0), expected, 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(k::gt_scalar(corner, 50.0), k::gt_scalar(expected, 50.0), 0, 0));
}

TEST(CudaElementwise, SameResultEveryRun) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(10);
  const Tensor x = randn({1000003}).to(kCuda0), y = randn({1000003}).to(kCuda0);
  const auto run = [&] {
    const Tensor z = x.clone();
    k::addcdiv_(z, y, y, 0.5);
    return gelu(z * y + x, "tanh");
  };
  const std::vector<float> first = run().to(kCPU).to_vector<float>();
  const std::vector<float> second = run().to(kCPU).to_vector<float>();
  EXPECT_EQ(first, second);
}

TEST(CudaElementwise, ErrorsNameTheOpAndShapes) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor a = zeros({2, 3}, kFloat32, kCuda0), b = zeros({4}, kFloat32, kCuda0);
  EXPECT_LOOM_ERROR(a + b, ShapeError, {"add", "[2, 3]", "[4]"});
  EXPECT_LOOM_ERROR(k::mul_(b, a), ShapeError, {"mul_", "[4]", "[2, 3]"});
  EXPECT_LOOM_ERROR(a + zeros({2, 3}), DeviceError, {"add", "cuda:0", "cpu"});
  EXPECT_LOOM_ERROR(exp(zeros({3}, kInt64, kCuda0)), DTypeError, {"exp", "int64"});
  // Operands that broadcast to self, so that only the dtype is wrong (shapes are checked first).
  EXPECT_LOOM_ERROR(k::addcmul_(zeros({2, 3}, kFloat16, kCuda0), a, a), DTypeError,
                    {"addcmul_", "float16"});
  EXPECT_LOOM_ERROR(where(a, a, a), DTypeError, {"where", "bool"});
  EXPECT_LOOM_ERROR(k::div_(zeros({2, 3}, kInt32, kCuda0), a), DTypeError, {"div_", "int32"});
  EXPECT_LOOM_ERROR(clamp(a, 1.0, 0.0), ValueError, {"clamp"});
  EXPECT_LOOM_ERROR(k::relu_backward(a, a.to(kFloat64)), DTypeError, {"relu_backward"});
  // The CUDA addcmul_ checks that its tensors broadcast to self (a wrong shape must not read
  // out of bounds).
  EXPECT_LOOM_ERROR(k::addcmul_(b, a, a), ShapeError, {"addcmul_", "[2, 3]", "[4]"});
  // Overlapping operands are refused on the GPU too (Note [Overlapping operands]).
  const Tensor x = arange(0, 10, 1, kFloat32).to(kCuda0);
  EXPECT_LOOM_ERROR(k::copy_(k::narrow(x, 0, 1, 9), k::narrow(x, 0, 0, 9)), ValueError,
                    {"copy_", "one memory location"});
  EXPECT_LOOM_ERROR(k::add_(k::expand(zeros({1}).to(kCuda0), {4}), ones({4}).to(kCuda0)),
                    ValueError, {"add_", "more than one element"});
}
