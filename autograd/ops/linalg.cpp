// autograd/ops/linalg.cpp — matmul, bmm, addmm and linear with their backwards. Transposed
// operands in the backward are views (.t()), which the GEMM reads in place.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/linalg.h"

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "autograd/ops/view.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/linalg.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::Saved;

// a [M,K] @ b [K,N]: da = dout @ b^T ; db = a^T @ dout
Tensor ops_impl::mm(const Tensor& a, const Tensor& b) {
  return record("mm", k::mm(a, b), {a, b}, {a, b}, [](const Grads& dout, Saved& s, Grads& g) {
    if (s.needs_grad(0)) g[0] = k::mm(dout[0], k::transpose(s[1], 0, 1));
    if (s.needs_grad(1)) g[1] = k::mm(k::transpose(s[0], 0, 1), dout[0]);
  });
}

// a [B,M,K] @ b [B,K,N]: da = dout @ b^T ; db = a^T @ dout, per batch
Tensor ops_impl::bmm(const Tensor& a, const Tensor& b) {
  return record("bmm", k::bmm(a, b), {a, b}, {a, b}, [](const Grads& dout, Saved& s, Grads& g) {
    if (s.needs_grad(0)) g[0] = k::bmm(dout[0], k::transpose(s[1], 1, 2));
    if (s.needs_grad(1)) g[1] = k::bmm(k::transpose(s[0], 1, 2), dout[0]);
  });
}

// Note [matmul shapes] — as numpy.matmul and torch.matmul:
//   1-D @ 1-D: dot product; 2-D @ 2-D: matrix product; 1-D operands gain a dim (prepended for
//   a, appended for b) that is removed from the result; N-D operands are stacks of matrices
//   whose batch dims broadcast. Everything reduces to mm or bmm on views, so the backward is
//   the composition of theirs (and expand's, whose sum the engine performs).
Tensor matmul(const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError,
             "matmul: both operands need at least 1 dim; got a=", a.sizes(), " b=", b.sizes());
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  LOOM_CHECK(ka == kb, ShapeError, "matmul: inner dimensions differ; got a=", a.sizes(),
             " b=", b.sizes());
  if (a.dim() <= 2 && b.dim() <= 2) {
    const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
    const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
    Tensor out = mm(a2, b2);
    if (b.dim() == 1) out = squeeze(out, 1);
    if (a.dim() == 1) out = squeeze(out, 0);
    return out;
  }
  // Batched: broadcast the batch dims, flatten them into one, bmm, restore.
  const Tensor a3 = a.dim() == 1 ? unsqueeze(a, 0) : a;
  const Tensor b3 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  const Shape batch_a(a3.sizes().begin(), a3.sizes().end() - 2);
  const Shape batch_b(b3.sizes().begin(), b3.sizes().end() - 2);
  const Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  const int64_t m = a3.size(-2), n = b3.size(-1), inner = ka;
  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), {m, inner});
  b_shape.insert(b_shape.end(), {inner, n});
  const int64_t nb = shape_numel(batch);
  Tensor out = bmm(reshape(expand(a3, a_shape), {nb, m, inner}),
                   reshape(expand(b3, b_shape), {nb, inner, n}));
  Shape out_shape = batch;
  if (a.dim() > 1) out_shape.push_back(m);
  if (b.dim() > 1) out_shape.push_back(n);
  return reshape(out, out_shape);
}

// beta c + alpha a @ b: dc = beta dout ; da = alpha dout @ b^T ; db = alpha a^T @ dout
Tensor ops_impl::addmm(const Tensor& input, const Tensor& a, const Tensor& b, double beta,
                       double alpha) {
  return record(
      "addmm", k::addmm(input, a, b, beta, alpha), {input, a, b}, {a, b},
      [beta, alpha](const Grads& dout, Saved& s, Grads& g) {
        if (s.needs_grad(0))
          g[0] = beta == 1.0 ? dout[0] : k::mul_scalar(k::widened(dout[0]), beta);
        if (s.needs_grad(1)) {
          g[1] = empty({dout[0].size(0), s[1].size(0)}, dout[0].dtype(), dout[0].device());
          k::mm_out(g[1], dout[0], k::transpose(s[1], 0, 1), alpha);
        }
        if (s.needs_grad(2)) {
          g[2] = empty({s[0].size(1), dout[0].size(1)}, dout[0].dtype(), dout[0].device());
          k::mm_out(g[2], k::transpose(s[0], 0, 1), dout[0], alpha);
        }
      });
}

// y = x W^T + b over x [N, in] (leading dims flattened):
// dx = dy W ; dW = dy^T x ; db = sum over rows of dy
Tensor ops_impl::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  LOOM_CHECK(x.dim() >= 1 && weight.dim() == 2, ShapeError,
             "linear: expected x [..., in] and weight [out, in]; got x=", x.sizes(),
             " weight=", weight.sizes());
  LOOM_CHECK(x.size(-1) == weight.size(1), ShapeError,
             "linear: x's last dim differs from weight's in_features; got x=", x.sizes(),
             " weight=", weight.sizes());
  LOOM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ShapeError,
             "linear: bias must be [", weight.size(0), "]; got bias=", bias.sizes(),
             " weight=", weight.sizes());
  const Tensor x2 = x.dim() == 2 ? x : reshape(x, {-1, x.size(-1)});
  const Tensor wt = k::transpose(weight, 0, 1);
  Tensor out = bias.defined() ? k::addmm(bias, x2, wt) : k::mm(x2, wt);
  out = record("linear", out, {x2, weight, bias}, {x2, weight},
               [](const Grads& dout, Saved& s, Grads& g) {
                 if (s.needs_grad(0)) g[0] = k::mm(dout[0], s[1]);
                 if (s.needs_grad(1)) g[1] = k::mm(k::transpose(dout[0], 0, 1), s[0]);
                 if (s.needs_grad(2)) g[2] = k::sum(k::widened(dout[0]), {0});
               });
  if (x.dim() == 2) return out;
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(weight.size(0));
  return reshape(out, out_shape);
}

}  // namespace loom
