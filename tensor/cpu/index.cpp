// tensor/cpu/index.cpp — joining, splitting and indexing kernels on the CPU: cat as parallel
// byte copies, views for split, gather/scatter along one dim, race-free accumulation for
// index_add and embedding's backward (Note [Race-free index_add]), and dropout's Philox mask.

#include "tensor/index.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/random.h"
#include "tensor/view.h"

namespace loom::kernels {

namespace {

// Each op checks that its operands share a device, then what it can check on the host; its CUDA
// branch follows (tensor/cuda/index.cu checks the index ranges on the device).

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

// The position of the first index value outside [0, limit), or -1. Threads scan chunks.
int64_t first_out_of_range(const Tensor& idx, int64_t limit) {
  const int64_t* p = idx.data_ptr<int64_t>();
  const int64_t n = idx.numel();
  std::atomic<int64_t> first{n};
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (p[i] >= 0 && p[i] < limit) continue;
      int64_t seen = first.load();
      while (i < seen && !first.compare_exchange_weak(seen, i)) {
      }
      return;
    }
  });
  return first.load() == n ? -1 : first.load();
}

// Sizes and strides with a 0-d tensor seen as 1-D of size 1 (gather and friends index dim 0).
Shape sizes_1d(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.sizes(); }
Shape strides_1d(const Tensor& t) { return t.dim() == 0 ? Shape{0} : t.strides(); }

int64_t prod(const Shape& s, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t d = begin; d < end; ++d) p *= s[d];
  return p;
}

// out [outer, m, inner] = src [outer, n, inner] at rows idx[j] (bytes; any dtype).
// Threads take ranges of output rows.
void select_rows(const Tensor& src, int64_t outer, int64_t n, int64_t inner, const int64_t* idx,
                 int64_t m, const Tensor& out) {
  const size_t row_bytes = static_cast<size_t>(inner) * src.itemsize();
  const char* s = static_cast<const char*>(src.data());
  char* o = static_cast<char*>(out.data());
  const int64_t grain = grain_for(inner);
  parallel_for(0, outer * m, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t outer_i = r / m, j = r % m;
      std::memcpy(o + r * row_bytes, s + (outer_i * n + idx[j]) * row_bytes, row_bytes);
    }
  });
}

// Note [Race-free index_add]
// dst [outer, n, inner] += src [outer, m, inner], row j of src going to row idx[j] of dst.
// Several j may name one row, so threads must not split the work by j. Instead a counting sort
// groups the j of each row (keeping their order), and each work unit — one dst row of one
// outer slice, or a block of kBlock of its columns — sums its sources in increasing j. No two
// threads write one element, and every element sums in the same order whatever the thread
// count, so results are bitwise reproducible. Positions with idx[j] == skip are left out
// (embedding's padding_idx). With kOverwrite, dst may be uninitialised: every unit first zeroes
// its block, so a fresh gradient needs no separate zero fill (one pass over dst, in parallel).
template <bool kOverwrite, typename T>
void accumulate_rows(T* dst, const T* src, int64_t outer, int64_t n, int64_t m, int64_t inner,
                     const int64_t* idx, int64_t skip) {
  constexpr int64_t kBlock = 256;
  std::vector<int64_t> start(n + 1, 0);
  for (int64_t j = 0; j < m; ++j)
    if (idx[j] != skip) ++start[idx[j] + 1];
  for (int64_t v = 0; v < n; ++v) start[v + 1] += start[v];
  std::vector<int64_t> order(start[n]), next(start.begin(), start.end() - 1);
  for (int64_t j = 0; j < m; ++j)
    if (idx[j] != skip) order[next[idx[j]]++] = j;

  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  const int64_t units = outer * n * blocks;
  const int64_t work = (kOverwrite ? outer * n : 0) + outer * m;
  const int64_t grain = work * inner >= kParallelGrain ? 1 : units + 1;  // inline when small
  parallel_for(0, units, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t b = u % blocks, row = u / blocks, v = row % n, outer_i = row / n;
      const int64_t c0 = b * kBlock, c1 = std::min(inner, c0 + kBlock);
      T* out = dst + (outer_i * n + v) * inner;
      if constexpr (kOverwrite) std::fill(out + c0, out + c1, T(0));
      for (int64_t p = start[v]; p < start[v + 1]; ++p) {
        const T* in = src + (outer_i * m + order[p]) * inner;
        for (int64_t c = c0; c < c1; ++c) out[c] += in[c];
      }
    }
  });
}

// Calls f(offsets) once per line along `dim` of `shape`, that is for every coordinate of the
// other dims, with offsets[k] = that coordinate dotted with strides[k] (dim's term left out).
// Threads take ranges of lines, so lines must not write to shared elements.
template <size_t K, typename F>
void for_each_line(const Shape& shape, int64_t dim, const std::array<Shape, K>& strides, F&& f) {
  Shape sizes;
  std::array<Shape, K> st;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d == dim) continue;
    sizes.push_back(shape[d]);
    for (size_t k = 0; k < K; ++k) st[k].push_back(strides[k][d]);
  }
  const int64_t lines = shape_numel(sizes);
  const int64_t line_length = std::max<int64_t>(shape[dim], 1);
  const int64_t r = static_cast<int64_t>(sizes.size());
  parallel_for(0, lines, grain_for(line_length), [&](int64_t lo, int64_t hi) {
    Shape coord(r, 0);
    std::array<int64_t, K> off{};
    for (int64_t i = r - 1, rest = lo; i >= 0; --i) {
      coord[i] = rest % sizes[i];
      rest /= sizes[i];
      for (size_t k = 0; k < K; ++k) off[k] += coord[i] * st[k][i];
    }
    for (int64_t line = lo; line < hi; ++line) {
      f(off);
      for (int64_t i = r - 1; i >= 0; --i) {  // odometer step
        for (size_t k = 0; k < K; ++k) off[k] += st[k][i];
        if (++coord[i] < sizes[i]) break;
        for (size_t k = 0; k < K; ++k) off[k] -= st[k][i] * sizes[i];
        coord[i] = 0;
      }
    }
  });
}

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

// Work maps to threads by output elements: each thread copies a range of the flat output,
// which crosses input boundaries as memcpy segments.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const CatPlan plan = plan_cat(tensors, dim);
  if (tensors[0].is_cuda()) return cuda_backend().cat(tensors, dim);
  const int64_t d = plan.dim;
  const Shape& out_shape = plan.out_shape;
  std::vector<Tensor> parts;  // contiguous, of the output dtype
  parts.reserve(plan.parts.size());
  for (const Tensor& t : plan.parts) parts.push_back(contiguous(to_dtype(t, plan.dtype)));
  Tensor out = empty(out_shape, plan.dtype);
  const int64_t outer = prod(out_shape, 0, d), inner = prod(out_shape, d + 1, out.dim());
  const int64_t out_row = out_shape[d] * inner;
  std::vector<int64_t> col(parts.size() + 1, 0);  // each part's first column in an output row
  for (size_t i = 0; i < parts.size(); ++i) col[i + 1] = col[i] + parts[i].size(d) * inner;
  const size_t item = out.itemsize();
  char* o = static_cast<char*>(out.data());
  parallel_for(0, outer * out_row, kParallelGrain, [&](int64_t lo, int64_t hi) {
    int64_t pos = lo;
    while (pos < hi) {
      const int64_t row = pos / out_row, c = pos % out_row;
      const size_t i = std::upper_bound(col.begin(), col.end(), c) - col.begin() - 1;
      const int64_t width = col[i + 1] - col[i];
      const int64_t count = std::min(hi - pos, col[i + 1] - c);
      const char* s = static_cast<const char*>(parts[i].data());
      std::memcpy(o + pos * item, s + (row * width + c - col[i]) * item, count * item);
      pos += count;
    }
  });
  return out;
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
  if (x.is_cuda()) return cuda_backend().index_select(x, dim, index);
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  const Shape xs = sizes_1d(x);
  const int64_t n = xs[d], m = idx.numel();
  const int64_t bad = first_out_of_range(idx, n);
  LOOM_CHECK(bad < 0, IndexError, "index_select: index ",
             bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad], " is out of range for dim ", d,
             " of size ", n, "; got x=", x.sizes(), " index=", index.sizes());
  Tensor out = empty(index_select_shape(x, d, index), x.dtype());
  select_rows(contiguous(x), prod(xs, 0, d), n, prod(xs, d + 1, xs.size()), idx.data_ptr<int64_t>(),
              m, out);
  return out;
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
  if (self.is_cuda()) return cuda_backend().index_add_(self, dim, index, src);
  const int64_t bad = first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, "index_add_: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes());
  self.bump_version();
  const Tensor s = contiguous(src);
  dispatch_numeric(self.dtype(), "index_add_", [&]<typename T>() {
    accumulate_rows</*kOverwrite=*/false, T>(self.data_ptr<T>(), s.data_ptr<T>(), prod(xs, 0, d),
                                             xs[d], idx.numel(), prod(xs, d + 1, xs.size()),
                                             idx.data_ptr<int64_t>(), /*skip=*/-1);
  });
}

// ---------------------------------------------------------------- gather, scatter_add

// Threads take lines along dim (for_each_line): every other coordinate is one line.
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
  if (x.is_cuda()) return cuda_backend().gather(x, dim, index);
  const int64_t bad = first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, "gather: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got x=", x.sizes(),
             " index=", index.sizes());
  Tensor out = empty(index.sizes(), x.dtype());
  const Shape xst = strides_1d(x), ost = contiguous_strides(is);  // idx shares out's strides
  dispatch_all(x.dtype(), "gather", [&]<typename T>() {
    const T* xp = x.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t* ip = idx.data_ptr<int64_t>();
    const int64_t m = is[d], x_step = xst[d], o_step = ost[d];
    for_each_line<2>(is, d, {xst, ost}, [&](const std::array<int64_t, 2>& off) {
      for (int64_t j = 0; j < m; ++j) {
        const int64_t at = off[1] + j * o_step;
        op[at] = xp[off[0] + ip[at] * x_step];
      }
    });
  });
  return out;
}

namespace {

// scatter_add_ under the name of the op the user called. Lines along dim go to threads: two
// lines differ in some other coordinate, so they write to different elements of self.
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
  const Shape xst = strides_1d(self), sst = strides_1d(src);
  for (size_t k = 0; k < xs.size(); ++k) {
    LOOM_CHECK(is[k] <= ss[k] && (static_cast<int64_t>(k) == d || is[k] <= xs[k]), ShapeError, op,
               ": index.size(", k, ")=", is[k], " exceeds src.size(", k, ") or self.size(", k,
               "); got self=", self.sizes(), " index=", index.sizes(), " src=", src.sizes());
    LOOM_CHECK(xs[k] <= 1 || xst[k] != 0, ValueError, op,
               ": self has overlapping elements (an expanded tensor); clone it first; got self=",
               self.sizes());
  }
  if (self.is_cuda()) return cuda_backend().scatter_add_into(self, dim, index, src, op);
  const int64_t bad = first_out_of_range(idx, xs[d]);
  LOOM_CHECK(bad < 0, IndexError, op, ": index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes(), " src=", src.sizes());
  self.bump_version();
  const Shape ist = contiguous_strides(is);
  dispatch_numeric(self.dtype(), op, [&]<typename T>() {
    T* xp = self.data_ptr<T>();
    const T* sp = src.data_ptr<T>();
    const int64_t* ip = idx.data_ptr<int64_t>();
    const int64_t m = is[d], x_step = xst[d], s_step = sst[d], i_step = ist[d];
    for_each_line<3>(is, d, {xst, sst, ist}, [&](const std::array<int64_t, 3>& off) {
      for (int64_t j = 0; j < m; ++j)
        xp[off[0] + ip[off[2] + j * i_step] * x_step] += sp[off[1] + j * s_step];
    });
  });
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
  if (index.is_cuda()) return cuda_backend().one_hot(index, num_classes);
  const int64_t n = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  if (num_classes == -1) num_classes = *std::max_element(ip, ip + n) + 1;
  const int64_t bad = first_out_of_range(idx, num_classes);
  LOOM_CHECK(bad < 0, IndexError, "one_hot: class ", bad < 0 ? 0 : ip[bad], " is out of range [0, ",
             num_classes, "); got index=", index.sizes());
  Shape out_shape = index.sizes();
  out_shape.push_back(num_classes);
  Tensor out = zeros(out_shape, kInt64);
  int64_t* op = out.data_ptr<int64_t>();
  parallel_for(0, n, kParallelGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) op[i * num_classes + ip[i]] = 1;
  });
  return out;
}

// ---------------------------------------------------------------- embedding

Tensor embedding(const Tensor& weight, const Tensor& index) {
  common_device("embedding", {weight, index});
  LOOM_CHECK(weight.dim() == 2, ShapeError,
             "embedding: expected a 2-D weight [V, D]; got weight=", weight.sizes(),
             " index=", index.sizes());
  const Tensor idx = index_as_int64(index, "embedding");
  if (weight.is_cuda()) return cuda_backend().embedding(weight, index);
  const int64_t num_weights = weight.size(0), dim = weight.size(1);
  const int64_t bad = first_out_of_range(idx, num_weights);
  LOOM_CHECK(bad < 0, IndexError, "embedding: index ", bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad],
             " is out of range for weight=", weight.sizes(), "; got index=", index.sizes());
  Shape out_shape = index.sizes();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, weight.dtype());
  select_rows(contiguous(weight), 1, num_weights, dim, idx.data_ptr<int64_t>(), idx.numel(), out);
  return out;
}

// Threads take rows of dweight (Note [Race-free index_add]), so duplicate indices never race.
Tensor embedding_backward(const Tensor& dout, const Tensor& index, int64_t num_weights,
                          int64_t padding_idx) {
  common_device("embedding_backward", {dout, index});
  const Tensor idx = index_as_int64(index, "embedding_backward");
  LOOM_CHECK(dout.dim() == index.dim() + 1 && dout.numel() == idx.numel() * dout.size(-1),
             ShapeError, "embedding_backward: expected dout of shape index.shape + [D]; got dout=",
             dout.sizes(), " index=", index.sizes());
  if (dout.is_cuda())
    return cuda_backend().embedding_backward(dout, index, num_weights, padding_idx);
  const int64_t dim = dout.size(-1);
  const int64_t bad = first_out_of_range(idx, num_weights);
  LOOM_CHECK(bad < 0, IndexError, "embedding_backward: index ",
             bad < 0 ? 0 : idx.data_ptr<int64_t>()[bad], " is out of range for ", num_weights,
             " embeddings; got index=", index.sizes());
  Tensor dweight = empty({num_weights, dim}, dout.dtype());  // every element written below
  const Tensor g = contiguous(dout);
  dispatch_floating(dout.dtype(), "embedding_backward", [&]<typename T>() {
    accumulate_rows</*kOverwrite=*/true, T>(dweight.data_ptr<T>(), g.data_ptr<T>(), 1, num_weights,
                                            idx.numel(), dim, idx.data_ptr<int64_t>(), padding_idx);
  });
  return dweight;
}

// ---------------------------------------------------------------- dropout

// See Note [Dropout mask]. Threads take ranges of Philox counters (4 elements each), so the
// mask does not depend on the thread count.
Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first) {
  common_device("dropout", {x});
  LOOM_CHECK(p > 0.0 && p < 1.0, ValueError,
             "dropout: the masked kernel needs 0 < p < 1; got p=", p, " for x=", x.sizes());
  if (x.is_cuda()) return cuda_backend().dropout_masked(x, p, seed, first);
  const Tensor src = contiguous(x);
  Tensor out = empty(x.sizes(), x.dtype());
  const int64_t n = x.numel();
  dispatch_floating(x.dtype(), "dropout", [&]<typename T>() {
    const T* s = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    parallel_for(0, (n + 3) / 4, 4096, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const auto r = philox4x32(seed, first + c);
        for (int64_t k = 0; k < 4 && c * 4 + k < n; ++k) {
          const bool keep = static_cast<double>(uniform_float(r[k])) >= p;
          o[c * 4 + k] = s[c * 4 + k] * (keep ? scale : T(0));  // x * 0 keeps NaN, as PyTorch
        }
      }
    });
  });
  return out;
}

}  // namespace loom::kernels
