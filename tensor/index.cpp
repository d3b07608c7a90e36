// tensor/index.cpp — the front of the joining, splitting and indexing kernels (tensor/index.h):
// cat's plan, the split sizes and index_select's shape that both backends use, every argument
// check, then the one device switch per entry to tensor/cpu/index.cpp or the CUDA backend
// (tensor/cuda_backend.h). stack, split and scatter_add are built here from other entries.

#include "tensor/index.h"

#include <algorithm>
#include <string>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/index.h"
#include "tensor/cuda_backend.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

// Each op checks that its operands share a device, then what it can check on the host; its CUDA
// branch follows (tensor/cuda/index.cu checks the index ranges on the device), and on the CPU the
// index ranges are checked after the switch, before the loops run.

// "[2, 3], [4, 3]": the shapes of a list of tensors, for error messages.
std::string shapes_of(const std::vector<Tensor>& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i)
    s += (i ? ", " : "") + (tensors[i].defined() ? detail::str(tensors[i].sizes()) : "undefined");
  return s;
}

// The index as contiguous int64 (a copy only when it is int32 or strided).
Tensor index_as_int64(const Tensor& index, const char* op) {
  LOOM_CHECK(index.defined(), ValueError, op, ": the index tensor is undefined");
  LOOM_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, DTypeError, op,
             ": expected an int64 or int32 index tensor; got ", index.dtype(),
             " index=", index.sizes());
  if (index.is_cuda()) return index;  // the CUDA kernels take int32 or int64 as they are
  return contiguous(to_dtype(index, kInt64));
}

// Sizes and strides with a 0-d tensor seen as 1-D of size 1 (gather and friends index dim 0).
Shape sizes_1d(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.sizes(); }
Shape strides_1d(const Tensor& t) { return t.dim() == 0 ? Shape{0} : t.strides(); }

bool is_empty_1d(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

}  // namespace

// ---------------------------------------------------------------- cat, stack, split

CatPlan plan_cat(const std::vector<Tensor>& tensors, int64_t dim) {
  LOOM_CHECK(!tensors.empty(), ValueError, "cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i)
    LOOM_CHECK(tensors[i].defined(), ValueError, "cat: tensor ", i, " is undefined; got shapes ",
               shapes_of(tensors));
  CatPlan plan;
  plan.dtype = tensors[0].dtype();
  const Tensor* ref = nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    LOOM_CHECK(t.device() == tensors[0].device(), DeviceError,
               "cat: expected all tensors on one device; got ", tensors[0].device(), " and ",
               t.device(), " (tensor ", i, ") for shapes ", shapes_of(tensors));
    LOOM_CHECK(t.dim() > 0, ShapeError, "cat: a 0-d tensor (tensor ", i,
               ") cannot be concatenated; got shapes ", shapes_of(tensors));
    plan.dtype = promote_types(plan.dtype, t.dtype());
    if (!ref && !is_empty_1d(t)) ref = &t;
  }
  if (!ref) {  // only empty 1-D tensors
    wrap_dim(dim, 1, "cat");
    plan.out_shape = {0};
    return plan;
  }
  const int64_t d = wrap_dim(dim, ref->dim(), "cat");
  plan.dim = d;
  plan.out_shape = ref->sizes();
  plan.out_shape[d] = 0;
  for (const Tensor& t : tensors) {
    if (is_empty_1d(t)) continue;
    bool match = t.dim() == ref->dim();
    for (int64_t k = 0; match && k < t.dim(); ++k) match = k == d || t.size(k) == ref->size(k);
    LOOM_CHECK(match, ShapeError, "cat: tensors must have the same shape except in dim ", d,
               "; got shapes ", shapes_of(tensors));
    plan.out_shape[d] += t.size(d);
    plan.parts.push_back(t);
  }
  return plan;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const CatPlan plan = plan_cat(tensors, dim);
  // plan_cat has checked that every tensor is on tensors[0]'s device.
  if (on_cuda("cat", {tensors[0]})) return cuda_backend().cat(tensors, dim);
  return cpu::cat(plan);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  LOOM_CHECK(!tensors.empty(), ValueError, "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].defined(), ValueError, "stack: tensor ", i, " is undefined; got shapes ",
               shapes_of(tensors));
    LOOM_CHECK(tensors[i].sizes() == tensors[0].sizes(), ShapeError,
               "stack: expected tensors of one shape; got shapes ", shapes_of(tensors));
  }
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(unsqueeze(t, d));
  return cat(unsqueezed, d);
}

Shape split_sizes(const Tensor& x, int64_t split_size, int64_t dim) {
  LOOM_CHECK(x.dim() > 0, ShapeError,
             "split: expected a tensor with at least 1 dim; got x=", x.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(d);
  LOOM_CHECK(split_size > 0 || (split_size == 0 && n == 0), ValueError,
             "split: split_size must be positive; got split_size=", split_size,
             " for x=", x.sizes());
  if (n == 0) return {0};  // one empty piece, as PyTorch
  const int64_t pieces = (n + split_size - 1) / split_size;
  Shape sizes(pieces, split_size);
  sizes.back() = n - split_size * (pieces - 1);
  return sizes;
}

Shape chunk_sizes(const Tensor& x, int64_t chunks, int64_t dim) {
  LOOM_CHECK(x.dim() > 0, ShapeError,
             "chunk: expected a tensor with at least 1 dim; got x=", x.sizes());
  LOOM_CHECK(chunks > 0, ValueError, "chunk: chunks must be positive; got chunks=", chunks,
             " for x=", x.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(d);
  if (n == 0) return Shape(chunks, 0);  // as PyTorch: `chunks` empty pieces
  return split_sizes(x, (n + chunks - 1) / chunks, d);
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const Shape& sizes, int64_t dim) {
  LOOM_CHECK(x.dim() > 0, ShapeError,
             "split: expected a tensor with at least 1 dim; got x=", x.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    LOOM_CHECK(s >= 0, ValueError, "split: sizes must be non-negative; got sizes=", sizes,
               " for x=", x.sizes());
    total += s;
  }
  LOOM_CHECK(total == x.size(d), ShapeError, "split: sizes=", sizes, " sum to ", total,
             ", not to x.size(", d, ")=", x.size(d), "; got x=", x.sizes());
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(slice(x, d, start, start + s));
    start += s;
  }
  return pieces;
}

// ---------------------------------------------------------------- index_select, index_add_

Shape index_select_shape(const Tensor& x, int64_t d, const Tensor& index) {
  if (x.dim() == 0) {
    LOOM_CHECK(index.numel() == 1, ShapeError,
               "index_select: a 0-d x takes one index; got x=", x.sizes(),
               " index=", index.sizes());
    return {};
  }
  Shape out_shape = x.sizes();
  out_shape[d] = index.numel();
  return out_shape;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  common_device("index_select", {x, index});
  const Tensor idx = index_as_int64(index, "index_select");
  LOOM_CHECK(index.dim() <= 1, ShapeError, "index_select: expected a 1-D index; got x=", x.sizes(),
             " index=", index.sizes());
  if (on_cuda("index_select", {x, index})) return cuda_backend().index_select(x, dim, index);
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  const int64_t n = sizes_1d(x)[d];
  const int64_t bad = cpu::first_out_of_range(idx, n);
  LOOM_CHECK(bad < 0, IndexError, "index_select: index ",
             bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad], " is out of range for dim ", d,
             " of size ", n, "; got x=", x.sizes(), " index=", index.sizes());
  return cpu::index_select(x, d, idx, index_select_shape(x, d, index));
}

void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  common_device("index_add_", {self, index, src});
  const Tensor idx = index_as_int64(index, "index_add_");
  LOOM_CHECK(index.dim() <= 1, ShapeError,
             "index_add_: expected a 1-D index; got self=", self.sizes(), " index=", index.sizes(),
             " src=", src.sizes());
  LOOM_CHECK(self.dtype() == src.dtype(), DTypeError, "index_add_: self is ", self.dtype(),
             " but src is ", src.dtype(), "; got self=", self.sizes(), " src=", src.sizes());
  LOOM_CHECK(self.is_contiguous(), ValueError,
             "index_add_: self must be contiguous; got self=", self.sizes());
  const int64_t d = wrap_dim(dim, self.dim(), "index_add_");
  const Shape xs = sizes_1d(self);
  Shape expected = xs;
  expected[d] = idx.numel();
  LOOM_CHECK(sizes_1d(src) == expected && src.dim() == self.dim(), ShapeError,
             "index_add_: src must have self's shape with index.numel() in dim ", d,
             "; got self=", self.sizes(), " index=", index.sizes(), " src=", src.sizes());
  if (on_cuda("index_add_", {self, index, src}))
    return cuda_backend().index_add_(self, dim, index, src);
  const int64_t bad = cpu::first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, "index_add_: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes());
  return cpu::index_add_(self, d, idx, src);
}

// ---------------------------------------------------------------- gather, scatter_add

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  common_device("gather", {x, index});
  const Tensor idx = index_as_int64(index, "gather");
  LOOM_CHECK(index.dim() == x.dim(), ShapeError,
             "gather: index must have as many dims as x; "
             "got x=",
             x.sizes(), " index=", index.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  const Shape xs = sizes_1d(x), is = sizes_1d(index);
  for (size_t k = 0; k < xs.size(); ++k)
    LOOM_CHECK(static_cast<int64_t>(k) == d || is[k] <= xs[k], ShapeError, "gather: index.size(", k,
               ")=", is[k], " exceeds x.size(", k, ")=", xs[k], "; got x=", x.sizes(),
               " index=", index.sizes());
  if (on_cuda("gather", {x, index})) return cuda_backend().gather(x, dim, index);
  const int64_t bad = cpu::first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, "gather: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got x=", x.sizes(),
             " index=", index.sizes());
  return cpu::gather(x, d, idx);
}

namespace {

// scatter_add_ under the name of the op the user called.
void scatter_add_into(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const char* op) {
  common_device(op, {self, index, src});
  const Tensor idx = index_as_int64(index, op);
  LOOM_CHECK(index.dim() == self.dim() && src.dim() == self.dim(), ShapeError, op,
             ": self, index and src must have the same number of dims; got self=", self.sizes(),
             " index=", index.sizes(), " src=", src.sizes());
  LOOM_CHECK(self.dtype() == src.dtype(), DTypeError, op, ": self is ", self.dtype(),
             " but src is ", src.dtype(), "; got self=", self.sizes(), " src=", src.sizes());
  const int64_t d = wrap_dim(dim, self.dim(), op);
  const Shape xs = sizes_1d(self), is = sizes_1d(index), ss = sizes_1d(src);
  const Shape xst = strides_1d(self);
  for (size_t k = 0; k < xs.size(); ++k) {
    LOOM_CHECK(is[k] <= ss[k] && (static_cast<int64_t>(k) == d || is[k] <= xs[k]), ShapeError, op,
               ": index.size(", k, ")=", is[k], " exceeds src.size(", k, ") or self.size(", k,
               "); got self=", self.sizes(), " index=", index.sizes(), " src=", src.sizes());
    LOOM_CHECK(xs[k] <= 1 || xst[k] != 0, ValueError, op,
               ": self has overlapping elements (an expanded tensor); clone it first; got self=",
               self.sizes());
  }
  if (on_cuda(op, {self, index, src}))
    return cuda_backend().scatter_add_into(self, dim, index, src, op);
  const int64_t bad = cpu::first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, op, ": index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes(), " src=", src.sizes());
  return cpu::scatter_add_into(self, d, idx, src, op);
}

}  // namespace

void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_add_into(self, dim, index, src, "scatter_add_");
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  common_device("scatter_add", {x, index, src});
  Tensor out = clone(x);
  scatter_add_into(out, dim, index, src, "scatter_add");
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  common_device("one_hot", {index});
  const Tensor idx = index_as_int64(index, "one_hot");
  LOOM_CHECK(num_classes >= -1, ValueError, "one_hot: num_classes must be -1 or >= 0; got ",
             num_classes, " for index=", index.sizes());
  LOOM_CHECK(num_classes != -1 || index.numel() > 0, ValueError,
             "one_hot: cannot infer num_classes from an empty index; got index=", index.sizes());
  if (on_cuda("one_hot", {index})) return cuda_backend().one_hot(index, num_classes);
  const int64_t n = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  if (num_classes == -1) num_classes = *std::max_element(ip, ip + n) + 1;
  const int64_t bad = cpu::first_out_of_range(idx, num_classes);
  LOOM_CHECK(bad < 0, IndexError, "one_hot: class ", bad < 0 ? 0 : ip[bad], " is out of range [0, ",
             num_classes, "); got index=", index.sizes());
  return cpu::one_hot(idx, num_classes);
}

// ---------------------------------------------------------------- embedding

Tensor embedding(const Tensor& weight, const Tensor& index) {
  common_device("embedding", {weight, index});
  LOOM_CHECK(weight.dim() == 2, ShapeError,
             "embedding: expected a 2-D weight [V, D]; got weight=", weight.sizes(),
             " index=", index.sizes());
  const Tensor idx = index_as_int64(index, "embedding");
  if (on_cuda("embedding", {weight, index})) return cuda_backend().embedding(weight, index);
  const int64_t num_weights = weight.size(0);
  const int64_t bad = cpu::first_out_of_range(idx, num_weights);
  LOOM_CHECK(bad < 0, IndexError, "embedding: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for weight=", weight.sizes(), "; got index=", index.sizes());
  return cpu::embedding(weight, idx);
}

Tensor embedding_backward(const Tensor& dout, const Tensor& index, int64_t num_weights,
                          int64_t padding_idx) {
  common_device("embedding_backward", {dout, index});
  const Tensor idx = index_as_int64(index, "embedding_backward");
  LOOM_CHECK(dout.dim() == index.dim() + 1 && dout.numel() == idx.numel() * dout.size(-1),
             ShapeError, "embedding_backward: expected dout of shape index.shape + [D]; got dout=",
             dout.sizes(), " index=", index.sizes());
  if (on_cuda("embedding_backward", {dout, index}))
    return cuda_backend().embedding_backward(dout, index, num_weights, padding_idx);
  const int64_t bad = cpu::first_out_of_range(idx, num_weights);
  LOOM_CHECK(bad < 0, IndexError, "embedding_backward: index ",
             bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad], " is out of range for ", num_weights,
             " embeddings; got index=", index.sizes());
  return cpu::embedding_backward(dout, idx, num_weights, padding_idx);
}

// ---------------------------------------------------------------- dropout

Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first) {
  common_device("dropout", {x});
  LOOM_CHECK(p > 0.0 && p < 1.0, ValueError,
             "dropout: the masked kernel needs 0 < p < 1; got p=", p, " for x=", x.sizes());
  if (on_cuda("dropout", {x})) return cuda_backend().dropout_masked(x, p, seed, first);
  return cpu::dropout_masked(x, p, seed, first);
}

}  // namespace loom::kernels
