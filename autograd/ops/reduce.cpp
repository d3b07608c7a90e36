// autograd/ops/reduce.cpp — differentiable reductions. Each backward first restores the
// reduced dims as size 1 (unsqueeze_reduced) so the gradient broadcasts against the input.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/reduce.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "autograd/ops/elementwise.h"
#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::record_multi;
using autograd::Saved;

namespace {

// A reduction's output (or its gradient) reshaped with the reduced dims back as size 1.
Tensor unsqueeze_reduced(const Tensor& t, const Shape& in_shape, const Shape& sorted_dims) {
  return k::reshape(t, k::reduced_shape(in_shape, sorted_dims, /*keepdim=*/true));
}

int64_t count_of(const Shape& in_shape, const Shape& sorted_dims) {
  int64_t n = 1;
  for (int64_t d : sorted_dims) n *= in_shape[d];
  return n;
}

}  // namespace

// d sum: dout broadcast over the reduced dims
Tensor ops_impl::sum(const Tensor& x, const Shape& dims, bool keepdim) {
  const Shape rdims = k::reduce_dims(x, dims, "sum");
  const Shape in_shape = x.sizes();
  return record("sum", k::sum(x, dims, keepdim), {x}, {},
                [in_shape, rdims](const Grads& dout, Saved&, Grads& g) {
                  g[0] = k::expand(unsqueeze_reduced(dout[0], in_shape, rdims), in_shape);
                });
}

// d mean: dout / N broadcast over the reduced dims
Tensor ops_impl::mean(const Tensor& x, const Shape& dims, bool keepdim) {
  const Shape rdims = k::reduce_dims(x, dims, "mean");
  const Shape in_shape = x.sizes();
  const double n = static_cast<double>(count_of(in_shape, rdims));
  return record("mean", k::mean(x, dims, keepdim), {x}, {},
                [in_shape, rdims, n](const Grads& dout, Saved&, Grads& g) {
                  g[0] = k::expand(unsqueeze_reduced(k::div_scalar(dout[0], n), in_shape, rdims),
                                   in_shape);
                });
}

// d amax: dout shared evenly among the elements equal to the maximum
static Tensor extremum(const char* name, const Tensor& x, const Shape& dims, bool keepdim,
                       bool is_max) {
  const Shape rdims = k::reduce_dims(x, dims, name);
  const Shape in_shape = x.sizes();
  Tensor out = is_max ? k::amax(x, dims, keepdim) : k::amin(x, dims, keepdim);
  return record(name, out, {x}, {x, out}, [in_shape, rdims](const Grads& dout, Saved& s, Grads& g) {
    const Tensor hit =
        k::to_dtype(k::eq(s[0], unsqueeze_reduced(s[1], in_shape, rdims)), dout[0].dtype());
    const Tensor count = k::sum(hit, rdims, /*keepdim=*/true);
    g[0] = k::mul(hit, k::div(unsqueeze_reduced(dout[0], in_shape, rdims), count));
  });
}
Tensor ops_impl::amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return extremum("amax", x, dims, keepdim, true);
}
Tensor ops_impl::amin(const Tensor& x, const Shape& dims, bool keepdim) {
  return extremum("amin", x, dims, keepdim, false);
}
Tensor max(const Tensor& x) { return amax(x); }
Tensor min(const Tensor& x) { return amin(x); }

// d max(x, dim): dout goes to the index that won
static std::pair<Tensor, Tensor> extremum_dim(const char* name, const Tensor& x, int64_t dim,
                                              bool keepdim, bool is_max) {
  auto [values, indices] = is_max ? k::max_dim(x, dim, keepdim) : k::min_dim(x, dim, keepdim);
  const Shape in_shape = x.sizes();
  const int64_t d = wrap_dim(dim, x.dim(), name);
  auto outs = record_multi(
      name, {values, indices}, {x}, {indices},
      [in_shape, d](const Grads& dout, Saved& s, Grads& g) {
        // Scatter dout into zeros along dim d at the chosen indices.
        const Shape kept = k::reduced_shape(in_shape, {d}, true);
        const Tensor idx = k::contiguous(k::reshape(s[0], kept));
        const Tensor grad = k::contiguous(k::reshape(dout[0], kept));
        Tensor dx = zeros(in_shape, grad.dtype(), grad.device());
        const int64_t outer = shape_numel(Shape(in_shape.begin(), in_shape.begin() + d));
        const int64_t n = in_shape.empty() ? 1 : in_shape[d];
        const int64_t inner = shape_numel(Shape(in_shape.begin() + d + 1, in_shape.end()));
        const int64_t* ip = idx.data_ptr<int64_t>();
        dispatch_floating(grad.dtype(), "max_backward", [&]<typename T>() {
          const T* gp = grad.data_ptr<T>();
          T* out = dx.data_ptr<T>();
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t i = 0; i < inner; ++i)
              out[(o * n + ip[o * inner + i]) * inner + i] = gp[o * inner + i];
        });
        g[0] = dx;
      });
  return {outs[0], outs[1]};
}
std::pair<Tensor, Tensor> ops_impl::max(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_dim("max", x, dim, keepdim, true);
}
std::pair<Tensor, Tensor> ops_impl::min(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_dim("min", x, dim, keepdim, false);
}

Tensor ops_impl::argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return k::argmax(x, dim, keepdim);
}
Tensor ops_impl::argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return k::argmin(x, dim, keepdim);
}

// d var: dout 2 (x - mean) / (N - correction)
Tensor ops_impl::var(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  const Shape rdims = k::reduce_dims(x, dims, "var");
  const Shape in_shape = x.sizes();
  const double denom = static_cast<double>(count_of(in_shape, rdims) - (unbiased ? 1 : 0));
  return record("var", k::var(x, dims, unbiased, keepdim), {x}, {x},
                [in_shape, rdims, denom](const Grads& dout, Saved& s, Grads& g) {
                  const Tensor centred = k::sub(s[0], k::mean(s[0], rdims, true));
                  const Tensor scale =
                      k::mul_scalar(unsqueeze_reduced(dout[0], in_shape, rdims), 2.0 / denom);
                  g[0] = k::mul(centred, scale);
                });
}

// std = sqrt(var): the chain rule through both
Tensor std(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim) {
  return sqrt(var(x, dims, unbiased, keepdim));
}

// d logsumexp: dout softmax(x) over the reduced dims
Tensor ops_impl::logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  const Shape rdims = k::reduce_dims(x, dims, "logsumexp");
  const Shape in_shape = x.sizes();
  Tensor out = k::logsumexp(x, dims, keepdim);
  return record(
      "logsumexp", out, {x}, {x, out}, [in_shape, rdims](const Grads& dout, Saved& s, Grads& g) {
        const Tensor softmax = k::exp(k::sub(s[0], unsqueeze_reduced(s[1], in_shape, rdims)));
        g[0] = k::mul(softmax, unsqueeze_reduced(dout[0], in_shape, rdims));
      });
}

}  // namespace loom
