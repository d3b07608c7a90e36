// tests/cuda/attention_cuda_test.cpp — the CUDA fused attention kernels (tensor/cuda/attention.h)
// against the CPU kernels (tensor/attention.h) on CPU copies: out, lse, dq, dk and dv for L != S,
// E != Ev, head dims 64 and 128, odd dims, a transposed [N, L, H, E] view, causal, boolean and
// broadcast additive masks, fully masked rows, dropout (its mask checked element by element
// against the Philox mapping), every dtype; the layouts of the results, repeatability, the
// table's slots and the head-dim limit. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/attention.h"
#include "tensor/cuda/attention.h"
#include "tensor/elementwise.h"
#include "tensor/philox.h"

namespace loom {
namespace {

namespace k = loom::kernels;
namespace kc = loom::cuda;
using test::cuda_matches_cpu;
using test::kCuda0;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor gpu(const Tensor& t) { return t.defined() ? t.to(kCuda0) : t; }

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(kCPU), hb = b.to(kCPU);
  if (ha.sizes() != hb.sizes() || ha.dtype() != hb.dtype())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  if (std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

// Tolerances of one result against the CPU's: both accumulate in float32 (float64), in
// different orders, and round once to the dtype.
struct Tolerance {
  double rtol, atol;
};
Tolerance tolerance_of(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return {1e-10, 1e-12};
    case DType::Float16:
      return {1e-2, 5e-3};
    case DType::BFloat16:
      return {3e-2, 2e-2};
    default:
      return {2e-4, 2e-5};
  }
}

// lse against the CPU's: the same -inf entries (fully masked rows), the rest within tolerance.
::testing::AssertionResult lse_matches(const Tensor& on_cuda, const Tensor& on_cpu, double rtol,
                                       double atol) {
  if (!on_cuda.is_cuda()) return ::testing::AssertionFailure() << "lse is not on CUDA";
  const Tensor back = on_cuda.to(kCPU);
  if (back.sizes() != on_cpu.sizes() || back.dtype() != on_cpu.dtype())
    return ::testing::AssertionFailure()
           << "lse shapes or dtypes differ: cuda " << detail::str(back.sizes(), " ", back.dtype())
           << " cpu " << detail::str(on_cpu.sizes(), " ", on_cpu.dtype());
  const std::vector<double> a = back.to_vector<double>(), e = on_cpu.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(e[i]) || std::isinf(a[i])) {
      if (a[i] != e[i])
        return ::testing::AssertionFailure()
               << "lse element " << i << ": " << a[i] << " vs expected " << e[i];
      continue;
    }
    if (!(std::fabs(a[i] - e[i]) <= atol + rtol * std::fabs(e[i])))
      return ::testing::AssertionFailure()
             << "lse element " << i << ": " << a[i] << " vs expected " << e[i];
  }
  return ::testing::AssertionSuccess();
}

enum class MaskKind { kNone, kBool, kAdditiveBroadcast };

struct Case {
  std::string name;
  int64_t n, h, l, s, e, ev;
  bool transposed = false;  // q, k, v read in place from [N, L, H, E] memory
  bool causal = false;
  MaskKind mask = MaskKind::kNone;
  double dropout_p = 0.0;
};

const std::vector<Case> kCases = {
    {"plain", 2, 3, 37, 53, 64, 64},
    {"e_ne_ev", 2, 2, 70, 45, 32, 48},
    {"odd_dims", 1, 3, 19, 23, 17, 5},
    {"head_dim_128", 1, 2, 65, 130, 128, 128},
    {"transposed", 2, 4, 33, 33, 64, 64, true},
    {"causal_l_gt_s", 2, 2, 100, 80, 64, 32, false, true},
    {"causal_l_lt_s", 1, 3, 50, 120, 64, 64, false, true},
    {"bool_mask", 2, 3, 41, 70, 64, 64, false, false, MaskKind::kBool},
    {"additive_mask", 2, 3, 41, 70, 32, 64, false, false, MaskKind::kAdditiveBroadcast},
    {"dropout", 2, 2, 45, 75, 64, 64, false, false, MaskKind::kNone, 0.3},
    // The front refuses a mask together with is_causal (as PyTorch): dropout with each.
    {"dropout_causal", 1, 2, 66, 66, 128, 64, true, true, MaskKind::kNone, 0.3},
    {"dropout_mask", 1, 2, 66, 66, 128, 64, true, false, MaskKind::kBool, 0.3},
};

constexpr int64_t kMaskedRow = 3;  // fully masked by the boolean and additive masks
constexpr uint64_t kSeed = 20240601, kFirst = 77;

// q, k, v [N, H, *, *] in `dtype`, on the CPU; with c.transposed, views of [N, *, H, *] memory.
Tensor operand(const Case& c, int64_t rows, int64_t dims, DType dtype) {
  if (!c.transposed) return randn({c.n, c.h, rows, dims}, kFloat64).to(dtype);
  return randn({c.n, rows, c.h, dims}, kFloat64).to(dtype).transpose(1, 2);
}
// The same view on cuda:0: the memory uploaded, then viewed as on the CPU.
Tensor on_gpu(const Case& c, const Tensor& t) {
  return c.transposed ? gpu(t.transpose(1, 2)).transpose(1, 2) : gpu(t);
}

// The case's mask as [N, H, L, S] on the CPU and on cuda:0 (undefined without one): boolean,
// about 70% true, or additive [1, 1, L, S] broadcast (stride 0) over batch and heads; both mask
// every key of row kMaskedRow.
std::pair<Tensor, Tensor> mask_of(const Case& c, DType dtype) {
  if (c.mask == MaskKind::kNone) return {Tensor(), Tensor()};
  if (c.mask == MaskKind::kBool) {
    Tensor mask = k::gt_scalar(rand({c.n, c.h, c.l, c.s}), 0.3);
    mask.narrow(2, kMaskedRow, 1).fill_(0.0);
    return {mask, gpu(mask)};
  }
  Tensor bias = k::mul_scalar(randn({1, 1, c.l, c.s}, kFloat64), 0.5).to(dtype);
  bias.narrow(2, kMaskedRow, 1).fill_(-kInf);
  const Shape full{c.n, c.h, c.l, c.s};
  return {bias.expand(full), gpu(bias).expand(full)};
}

k::AttentionOptions options_of(const Case& c, const Tensor& mask) {
  k::AttentionOptions o;
  o.mask = mask;
  o.is_causal = c.causal;
  o.scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  o.dropout_p = c.dropout_p;
  o.seed = kSeed;
  o.first = kFirst;
  return o;
}

// The result of empty_attention_result: [N, H, L, E] over [N, L, H, E] memory.
bool has_attention_layout(const Tensor& t) { return t.transpose(1, 2).is_contiguous(); }

// The same layout: equal strides along every dim of more than one element (the stride of a
// size-1 dim addresses nothing, and the two devices need not choose the same one).
::testing::AssertionResult same_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure()
           << "shapes differ: " << detail::str(a.sizes()) << " vs " << detail::str(b.sizes());
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d))
      return ::testing::AssertionFailure()
             << "strides differ in dim " << d << ": " << detail::str(a.strides()) << " vs "
             << detail::str(b.strides()) << " for shape " << detail::str(a.sizes());
  return ::testing::AssertionSuccess();
}

TEST(CudaAttention, MatchesCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(detail::str(c.name, " ", dtype));
      const Tolerance tol = tolerance_of(dtype);
      const Tensor q = operand(c, c.l, c.e, dtype), key = operand(c, c.s, c.e, dtype),
                   v = operand(c, c.s, c.ev, dtype);
      const Tensor gq = on_gpu(c, q), gk = on_gpu(c, key), gv = on_gpu(c, v);
      const auto [mask, gmask] = mask_of(c, dtype);
      const k::AttentionOptions cpu_options = options_of(c, mask);
      const k::AttentionOptions gpu_options = options_of(c, gmask);

      const k::AttentionForward cf = k::attention_forward(q, key, v, cpu_options);
      const k::AttentionForward gf = kc::attention_forward(gq, gk, gv, gpu_options);
      EXPECT_TRUE(cuda_matches_cpu(gf.out, cf.out, tol.rtol, tol.atol));
      EXPECT_TRUE(lse_matches(gf.lse, cf.lse, tol.rtol, tol.atol));
      EXPECT_TRUE(has_attention_layout(gf.out));
      EXPECT_TRUE(gf.lse.is_contiguous());

      // Both backwards from the CPU's out and lse, so that only the backward is compared.
      const Tensor dout = randn({c.n, c.h, c.l, c.ev}, kFloat64).to(dtype);
      const k::AttentionGrads cg =
          k::attention_backward(dout, q, key, v, cf.out, cf.lse, cpu_options);
      const k::AttentionGrads gg =
          kc::attention_backward(gpu(dout), gq, gk, gv, gpu(cf.out), gpu(cf.lse), gpu_options);
      EXPECT_TRUE(cuda_matches_cpu(gg.dq, cg.dq, tol.rtol, tol.atol));
      EXPECT_TRUE(cuda_matches_cpu(gg.dk, cg.dk, tol.rtol, tol.atol));
      EXPECT_TRUE(cuda_matches_cpu(gg.dv, cg.dv, tol.rtol, tol.atol));
      // Gradients take the layout the CPU's do (the inputs' strides where those are dense).
      EXPECT_TRUE(same_layout(gg.dq, cg.dq));
      EXPECT_TRUE(same_layout(gg.dk, cg.dk));
      EXPECT_TRUE(same_layout(gg.dv, cg.dv));

      if (c.mask != MaskKind::kNone) {
        // Row kMaskedRow attends to nothing: out 0, lse -inf, no gradient into q.
        const Tensor out_row = gf.out.narrow(2, kMaskedRow, 1).to(kCPU).to(kFloat64);
        const Tensor lse_row = gf.lse.narrow(2, kMaskedRow, 1).to(kCPU).to(kFloat64);
        const Tensor dq_row = gg.dq.narrow(2, kMaskedRow, 1).to(kCPU).to(kFloat64);
        for (double value : out_row.to_vector<double>()) EXPECT_EQ(value, 0.0);
        for (double value : lse_row.to_vector<double>()) EXPECT_EQ(value, -kInf);
        for (double value : dq_row.to_vector<double>()) EXPECT_EQ(value, 0.0);
      }
    }
  }
}

// Note [Dropout mask] element by element: with v = the identity (Ev = S), out_i is row i of
// the dropped, rescaled weights, so out[n, h, i, j] is 0 exactly where (n, h, i, j) is dropped.
// The expected mask comes straight from Philox here, not from either kernel.
TEST(CudaAttention, DropoutMaskFollowsPhilox) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  const int64_t n = 2, h = 3, l = 37, s = 96, e = 32;
  const double p = 0.3;
  const Tensor q = randn({n, h, l, e}), key = randn({n, h, s, e});
  const Tensor v = eye(s).reshape({1, 1, s, s}).expand({n, h, s, s});
  k::AttentionOptions options;
  options.scale = 0.1;
  options.dropout_p = p;
  options.seed = kSeed;
  options.first = kFirst;
  const k::AttentionForward gf = kc::attention_forward(gpu(q), gpu(key), gpu(v), options);
  const k::AttentionForward cf = k::attention_forward(q, key, v, options);
  EXPECT_TRUE(cuda_matches_cpu(gf.out, cf.out, 1e-4, 1e-6));
  const std::vector<float> out = gf.out.to(kCPU).contiguous().to_vector<float>();
  int64_t dropped = 0, wrong = 0;
  for (int64_t idx = 0; idx < n * h * l * s; ++idx) {
    const philox::Lanes r = philox::philox4x32(kSeed, kFirst + static_cast<uint64_t>(idx) / 4);
    const bool keep = static_cast<double>(philox::uniform_float(r[static_cast<int>(idx % 4)])) >= p;
    dropped += keep ? 0 : 1;
    wrong += (out[idx] == 0.0f) == keep ? 1 : 0;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(dropped, n * h * l * s / 5);  // about 30%
  EXPECT_LT(dropped, n * h * l * s * 2 / 5);
}

// The forward and dk, dv have no atomics: the same bits every run (dq's atomics may differ).
TEST(CudaAttention, ForwardAndKeyGradientsRepeat) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(7);
  const Tensor q = gpu(randn({2, 4, 130, 64})), key = gpu(randn({2, 4, 200, 64})),
               v = gpu(randn({2, 4, 200, 64})), dout = gpu(randn({2, 4, 130, 64}));
  k::AttentionOptions options;
  options.scale = 0.125;
  options.is_causal = true;
  const k::AttentionForward a = kc::attention_forward(q, key, v, options);
  const k::AttentionForward b = kc::attention_forward(q, key, v, options);
  EXPECT_TRUE(same_bits(a.out, b.out));
  EXPECT_TRUE(same_bits(a.lse, b.lse));
  const k::AttentionGrads ga = kc::attention_backward(dout, q, key, v, a.out, a.lse, options);
  const k::AttentionGrads gb = kc::attention_backward(dout, q, key, v, a.out, a.lse, options);
  EXPECT_TRUE(same_bits(ga.dk, gb.dk));
  EXPECT_TRUE(same_bits(ga.dv, gb.dv));
}

// The front (tensor/attention.h) reaches the kernels through the backend table's two slots.
TEST(CudaAttention, FrontUsesTheTable) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(8);
  const Tensor q = randn({2, 3, 20, 16}), key = randn({2, 3, 25, 16}), v = randn({2, 3, 25, 8});
  const Tensor dout = randn({2, 3, 20, 8});
  k::AttentionOptions options;
  options.scale = 0.25;
  const k::AttentionForward cf = k::attention_forward(q, key, v, options);
  const k::AttentionForward gf = k::attention_forward(gpu(q), gpu(key), gpu(v), options);
  EXPECT_TRUE(cuda_matches_cpu(gf.out, cf.out, 1e-4, 1e-5));
  EXPECT_TRUE(lse_matches(gf.lse, cf.lse, 1e-4, 1e-5));
  const k::AttentionGrads cg = k::attention_backward(dout, q, key, v, cf.out, cf.lse, options);
  const k::AttentionGrads gg =
      k::attention_backward(gpu(dout), gpu(q), gpu(key), gpu(v), gpu(cf.out), gpu(cf.lse), options);
  EXPECT_TRUE(cuda_matches_cpu(gg.dq, cg.dq, 1e-4, 1e-5));
  EXPECT_TRUE(cuda_matches_cpu(gg.dk, cg.dk, 1e-4, 1e-5));
  EXPECT_TRUE(cuda_matches_cpu(gg.dv, cg.dv, 1e-4, 1e-5));
}

// No keys (S = 0): every row fully masked; no queries (L = 0): zero key gradients.
TEST(CudaAttention, EmptySequences) {
  LOOM_SKIP_WITHOUT_GPU();
  k::AttentionOptions options;
  const Tensor q = gpu(randn({1, 2, 5, 8})), dout = gpu(randn({1, 2, 5, 4}));
  const Tensor no_k = gpu(randn({1, 2, 0, 8})), no_v = gpu(randn({1, 2, 0, 4}));
  const k::AttentionForward f = kc::attention_forward(q, no_k, no_v, options);
  EXPECT_TRUE(cuda_matches_cpu(f.out, zeros({1, 2, 5, 4})));
  EXPECT_TRUE(lse_matches(f.lse, full({1, 2, 5}, -kInf), 0, 0));
  const k::AttentionGrads g = kc::attention_backward(dout, q, no_k, no_v, f.out, f.lse, options);
  EXPECT_TRUE(cuda_matches_cpu(g.dq, zeros({1, 2, 5, 8})));
  EXPECT_EQ(g.dk.sizes(), (Shape{1, 2, 0, 8}));

  const Tensor no_q = gpu(randn({1, 2, 0, 8})), no_dout = gpu(randn({1, 2, 0, 4}));
  const Tensor key = gpu(randn({1, 2, 6, 8})), v = gpu(randn({1, 2, 6, 4}));
  const k::AttentionForward f0 = kc::attention_forward(no_q, key, v, options);
  EXPECT_EQ(f0.out.sizes(), (Shape{1, 2, 0, 4}));
  const k::AttentionGrads g0 =
      kc::attention_backward(no_dout, no_q, key, v, f0.out, f0.lse, options);
  EXPECT_TRUE(cuda_matches_cpu(g0.dk, zeros({1, 2, 6, 8})));
  EXPECT_TRUE(cuda_matches_cpu(g0.dv, zeros({1, 2, 6, 4})));
}

TEST(CudaAttention, HeadDimsAbove128AreRejected) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor q = gpu(randn({1, 1, 4, 160})), key = gpu(randn({1, 1, 4, 160})),
               v = gpu(randn({1, 1, 4, 64}));
  EXPECT_LOOM_ERROR(kc::attention_forward(q, key, v, {}), ValueError,
                    {"scaled_dot_product_attention", "[1, 1, 4, 160]", "[1, 1, 4, 64]"});
}

}  // namespace
}  // namespace loom
