// autograd/ops/index.cpp — differentiable joining, splitting and indexing ops, embedding and
// dropout. Backwards route the gradient to where each element came from: slices of dout for
// cat, accumulation (index_add_, scatter_add_) where an index may repeat.
// Ops with an autocast rule are defined here as ops_impl:: bodies (autograd/ops/bodies.h);
// their entries, which apply the rule, are in autograd/autocast_ops.cpp.

#include "autograd/ops/index.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/ops/bodies.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/index.h"
#include "tensor/random.h"
#include "tensor/view.h"

namespace loom {

namespace k = kernels;
using autograd::Grads;
using autograd::record;
using autograd::record_multi;
using autograd::Saved;

// d cat: input i gets the slice of dout it was copied to (empty 1-D inputs get empty zeros)
Tensor ops_impl::cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = k::cat(tensors, dim);  // checks the arguments
  if (!autograd::any_requires_grad(tensors)) return out;
  std::vector<int64_t> starts, lengths;  // along d, -1 for skipped inputs
  int64_t d = 0;
  for (const Tensor& t : tensors)
    if (!(t.dim() == 1 && t.size(0) == 0)) d = wrap_dim(dim, t.dim(), "cat");
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    const bool skipped = t.dim() == 1 && t.size(0) == 0;
    starts.push_back(skipped ? -1 : at);
    lengths.push_back(skipped ? 0 : t.size(d));
    if (!skipped) at += t.size(d);
  }
  return record("cat", out, tensors, {},
                [d, starts, lengths](const Grads& dout, Saved& s, Grads& g) {
                  for (size_t i = 0; i < starts.size(); ++i) {
                    if (!s.needs_grad(i)) continue;
                    g[i] = starts[i] < 0 ? zeros({0}, dout[0].dtype(), dout[0].device())
                                         : k::narrow(dout[0], d, starts[i], lengths[i]);
                  }
                });
}

// d stack: input i gets dout.select(dim, i)
Tensor ops_impl::stack(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = k::stack(tensors, dim);  // checks the arguments
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  return record("stack", out, tensors, {}, [d](const Grads& dout, Saved& s, Grads& g) {
    for (size_t i = 0; i < g.size(); ++i)
      if (s.needs_grad(i)) g[i] = k::select(dout[0], d, static_cast<int64_t>(i));
  });
}

// d split: the pieces' gradients concatenated back (the engine supplies zeros for pieces that
// received none)
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces = k::split_with_sizes(x, sizes, dim);  // checks the arguments
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  return autograd::record_views(
      "split", std::move(pieces), x,
      [d](const Grads& dout, Saved&, Grads& g) { g[0] = k::cat(dout, d); });
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  return split(x, k::split_sizes(x, split_size, dim), dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  return split(x, k::chunk_sizes(x, chunks, dim), dim);
}

// d index_select: dout's rows added into zeros at the rows they were read from (duplicates add)
Tensor ops_impl::index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = k::index_select(x, dim, index);  // checks the arguments
  const Shape in_shape = x.sizes();
  return record("index_select", out, {x}, {index},
                [dim, in_shape](const Grads& dout, Saved& s, Grads& g) {
                  Tensor dx = zeros(in_shape, dout[0].dtype(), dout[0].device());
                  k::index_add_(dx, dim, s[0], dout[0]);
                  g[0] = dx;
                });
}

// d gather: dout scattered (added) into zeros at the positions it was read from
Tensor ops_impl::gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = k::gather(x, dim, index);  // checks the arguments
  const Shape in_shape = x.sizes();
  return record("gather", out, {x}, {index},
                [dim, in_shape](const Grads& dout, Saved& s, Grads& g) {
                  Tensor dx = zeros(in_shape, dout[0].dtype(), dout[0].device());
                  k::scatter_add_(dx, dim, s[0], dout[0]);
                  g[0] = dx;
                });
}

// d scatter_add: dx = dout ; dsrc = gather(dout, dim, index) where index reaches, 0 elsewhere
Tensor ops_impl::scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = k::scatter_add(x, dim, index, src);  // checks the arguments
  const Shape src_shape = src.sizes();
  return record("scatter_add", out, {x, src}, {index},
                [dim, src_shape](const Grads& dout, Saved& s, Grads& g) {
                  if (s.needs_grad(0)) g[0] = dout[0];
                  if (!s.needs_grad(1)) return;
                  Tensor picked = k::gather(dout[0], dim, s[0]);
                  if (picked.sizes() == src_shape) {
                    g[1] = picked;
                    return;
                  }
                  // index smaller than src: src's other elements were never added anywhere
                  Tensor dsrc = zeros(src_shape, dout[0].dtype(), dout[0].device());
                  Tensor corner = dsrc;
                  for (int64_t d = 0; d < picked.dim(); ++d)
                    corner = k::narrow(corner, d, 0, picked.size(d));
                  k::copy_(corner, picked);
                  g[1] = dsrc;
                });
}

Tensor one_hot(const Tensor& index, int64_t num_classes) { return k::one_hot(index, num_classes); }

// d embedding: dweight row v = sum of the dout rows whose index is v (none for padding_idx)
Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx) {
  Tensor out = k::embedding(weight, index);  // checks weight and index
  const int64_t num_weights = weight.size(0);
  LOOM_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < num_weights), IndexError,
             "embedding: padding_idx ", padding_idx, " is out of range for weight=", weight.sizes(),
             " (-1 means none)");
  // A 16-bit weight (FSDP's mixed precision) gets its row sums taken in float32, rounded once.
  const DType dtype = weight.dtype();
  return record("embedding", out, {weight}, {index},
                [num_weights, padding_idx, dtype](const Grads& dout, Saved& s, Grads& g) {
                  g[0] = k::to_dtype(
                      k::embedding_backward(k::widened(dout[0]), s[0], num_weights, padding_idx),
                      dtype);
                });
}

// d dropout: dout * mask / (1 - p), the mask recomputed from the forward's (seed, first)
// (Note [Dropout mask] in tensor/index.h)
Tensor ops_impl::dropout(const Tensor& x, double p, bool training) {
  LOOM_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1]; got p=", p,
             " for x=", x.sizes());
  if (!training || p == 0.0) return x;
  LOOM_CHECK(is_floating(x.dtype()), DTypeError, "dropout: expected a floating tensor; got ",
             x.dtype(), " x=", x.sizes());
  if (p == 1.0) {
    return record("dropout", k::mul_scalar(x, 0.0), {x}, {},
                  [](const Grads& dout, Saved&, Grads& g) { g[0] = k::mul_scalar(dout[0], 0.0); });
  }
  Generator& gen = default_generator();
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve(static_cast<uint64_t>((x.numel() + 3) / 4));
  Tensor out = k::dropout_masked(x, p, seed, first);
  return record("dropout", out, {x}, {}, [p, seed, first](const Grads& dout, Saved&, Grads& g) {
    g[0] = k::dropout_masked(dout[0], p, seed, first);
  });
}

}  // namespace loom
