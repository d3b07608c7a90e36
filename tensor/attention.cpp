// tensor/attention.cpp — the fused attention's front: the argument checks, the four dims the
// kernels read (Note [Fused attention]), the CPU's 16-bit rule, and the device switch.

#include "tensor/attention.h"

#include <cmath>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/attention.h"
#include "tensor/cuda_backend.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// The leading dims of q, k and v (equal), L, S, E and Ev, after every check of the three.
struct Geometry {
  Shape lead;
  int64_t l, s, e, ev;
};

Geometry check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                      const AttentionOptions& o) {
  common_device(kOp, {q, k, v, o.mask});
  LOOM_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError, kOp,
             ": expected q [..., L, E], k [..., S, E], v [..., S, Ev] with the same number of "
             "dims (at least 2); got q=",
             q.sizes(), " k=", k.sizes(), " v=", v.sizes());
  const int64_t d = q.dim();
  const Shape lead(q.sizes().begin(), q.sizes().end() - 2);
  LOOM_CHECK(Shape(k.sizes().begin(), k.sizes().end() - 2) == lead &&
                 Shape(v.sizes().begin(), v.sizes().end() - 2) == lead,
             ShapeError, kOp,
             ": q, k and v must have the same leading (batch and head) dims; got q=", q.sizes(),
             " k=", k.sizes(), " v=", v.sizes());
  LOOM_CHECK(k.size(d - 1) == q.size(d - 1) && v.size(d - 2) == k.size(d - 2), ShapeError, kOp,
             ": expected k [..., S, E] with q's E and v [..., S, Ev] with k's S; got q=", q.sizes(),
             " k=", k.sizes(), " v=", v.sizes());
  LOOM_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), DTypeError,
             kOp, ": expected q, k and v of one floating dtype; got q ", q.dtype(), ", k ",
             k.dtype(), ", v ", v.dtype(), " (q=", q.sizes(), ")");
  Geometry g{lead, q.size(d - 2), k.size(d - 2), q.size(d - 1), v.size(d - 1)};
  if (o.mask.defined()) {
    LOOM_CHECK(o.mask.dtype() == kBool || o.mask.dtype() == q.dtype(), DTypeError, kOp,
               ": expected attn_mask of dtype bool or q's dtype ", q.dtype(), "; got ",
               o.mask.dtype(), " (attn_mask=", o.mask.sizes(), ")");
    Shape full = lead;
    full.push_back(g.l);
    full.push_back(g.s);
    bool broadcasts = o.mask.dim() <= static_cast<int64_t>(full.size());
    for (int64_t i = 1; broadcasts && i <= o.mask.dim(); ++i) {
      const int64_t m = o.mask.size(o.mask.dim() - i), f = full[full.size() - i];
      broadcasts = m == f || m == 1;
    }
    LOOM_CHECK(broadcasts, ShapeError, kOp, ": attn_mask=", o.mask.sizes(),
               " does not broadcast to the scores' shape ", full, " (q=", q.sizes(),
               " k=", k.sizes(), ")");
    LOOM_CHECK(!o.is_causal, ValueError, kOp,
               ": give attn_mask or is_causal, not both (as PyTorch); got attn_mask=",
               o.mask.sizes(), " with is_causal");
  }
  LOOM_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, ValueError, kOp,
             ": dropout_p must be in [0, 1); got ", o.dropout_p, " (q=", q.sizes(), ")");
  LOOM_CHECK(std::isfinite(o.scale), ValueError, kOp, ": scale must be finite; got ", o.scale,
             " (q=", q.sizes(), ")");
  return g;
}

// [..., R, F] as [N, H, R, F] (a view where the leading dims merge, else a copy), with a unit
// stride in the last dim when `unit_last`.
Tensor four_dims(const Tensor& t, bool unit_last) {
  Tensor x = t;
  if (x.dim() == 2) x = unsqueeze(unsqueeze(x, 0), 0);
  if (x.dim() == 3) x = unsqueeze(x, 0);
  if (x.dim() > 4) x = reshape(x, {-1, x.size(-3), x.size(-2), x.size(-1)});
  if (unit_last && x.size(3) > 1 && x.stride(3) != 1) x = contiguous(x);
  return x;
}

// The options with the mask broadcast to [N, H, L, S] (stride 0 on broadcast dims).
AttentionOptions four_dim_options(const AttentionOptions& o, const Geometry& g) {
  AttentionOptions r = o;
  if (!o.mask.defined()) return r;
  Shape full = g.lead;
  full.push_back(g.l);
  full.push_back(g.s);
  r.mask = four_dims(expand(o.mask, full), false);
  return r;
}

// A kernel's [N, H, R, F] result as [..., R, F] for the caller's leading dims.
Tensor leading_dims(const Tensor& t, const Geometry& g) {
  Shape shape = g.lead;
  for (int64_t d = 2; d < t.dim(); ++d) shape.push_back(t.size(d));
  return view(t, shape);
}

// The CPU computes 16-bit attention in float32 (Note [Fused attention]); the result returns to
// the 16-bit dtype in the kernels' layout.
Tensor narrowed_result(const Tensor& t, DType dtype) {
  Tensor r = empty_attention_result(t.size(0), t.size(1), t.size(2), t.size(3), dtype, t.device());
  copy_(r, t);
  return r;
}

Tensor narrowed_grad(const Tensor& t, const Tensor& like) {
  Tensor r = empty_attention_grad(like, like.dtype());
  copy_(r, t);
  return r;
}

AttentionOptions widened_options(const AttentionOptions& o) {
  AttentionOptions r = o;
  if (r.mask.defined() && r.mask.dtype() != kBool) r.mask = widened(r.mask);
  return r;
}

}  // namespace

Tensor empty_attention_result(int64_t n, int64_t h, int64_t l, int64_t e, DType dtype,
                              Device device) {
  return transpose(empty({n, l, h, e}, dtype, device), 1, 2);
}

Tensor empty_attention_grad(const Tensor& x, DType dtype) {
  if (!fills_its_span(x)) {
    return empty_attention_result(x.size(0), x.size(1), x.size(2), x.size(3), dtype, x.device());
  }
  return as_strided(empty({x.numel()}, dtype, x.device()), x.sizes(), x.strides(), 0);
}

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& options) {
  const Geometry g = check_inputs(q, k, v, options);
  const Tensor q4 = four_dims(q, true), k4 = four_dims(k, true), v4 = four_dims(v, true);
  const AttentionOptions o = four_dim_options(options, g);
  AttentionForward f;
  if (on_cuda(kOp, {q, k, v})) {
    f = cuda_backend(kOp).attention_forward(q4, k4, v4, o);
  } else if (is_16bit_float(q.dtype())) {
    f = cpu::attention_forward(widened(q4), widened(k4), widened(v4), widened_options(o));
    f.out = narrowed_result(f.out, q.dtype());
  } else {
    f = cpu::attention_forward(q4, k4, v4, o);
  }
  return {leading_dims(f.out, g), squeeze(leading_dims(unsqueeze(f.lse, -1), g), -1)};
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& options) {
  const char* op = "scaled_dot_product_attention_backward";
  const Geometry g = check_inputs(q, k, v, options);
  common_device(op, {dout, q, out, lse});
  Shape out_shape = g.lead, lse_shape = g.lead;
  out_shape.push_back(g.l);
  out_shape.push_back(g.ev);
  lse_shape.push_back(g.l);
  LOOM_CHECK(dout.sizes() == out_shape && out.sizes() == out_shape && lse.sizes() == lse_shape,
             ShapeError, op, ": expected dout and out of shape ", out_shape, " and lse of shape ",
             lse_shape, "; got dout=", dout.sizes(), " out=", out.sizes(), " lse=", lse.sizes());
  const DType stats = q.dtype() == kFloat64 ? kFloat64 : kFloat32;
  LOOM_CHECK(dout.dtype() == q.dtype() && out.dtype() == q.dtype() && lse.dtype() == stats,
             DTypeError, op, ": expected dout and out of q's dtype ", q.dtype(), " and lse of ",
             stats, "; got dout ", dout.dtype(), ", out ", out.dtype(), ", lse ", lse.dtype());
  const Tensor q4 = four_dims(q, true), k4 = four_dims(k, true), v4 = four_dims(v, true);
  const Tensor dout4 = four_dims(dout, true), out4 = four_dims(out, true);
  const Tensor lse3 = contiguous(squeeze(four_dims(unsqueeze(lse, -1), false), -1));
  const AttentionOptions o = four_dim_options(options, g);
  AttentionGrads r;
  if (on_cuda(op, {dout, q, k, v, out, lse})) {
    r = cuda_backend(op).attention_backward(dout4, q4, k4, v4, out4, lse3, o);
  } else if (is_16bit_float(q.dtype())) {
    r = cpu::attention_backward(widened(dout4), widened(q4), widened(k4), widened(v4),
                                widened(out4), lse3, widened_options(o));
    r.dq = narrowed_grad(r.dq, q4);
    r.dk = narrowed_grad(r.dk, k4);
    r.dv = narrowed_grad(r.dv, v4);
  } else {
    r = cpu::attention_backward(dout4, q4, k4, v4, out4, lse3, o);
  }
  return {leading_dims(r.dq, g), leading_dims(r.dk, g), leading_dims(r.dv, g)};
}

}  // namespace loom::kernels
