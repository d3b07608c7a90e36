// tensor/view.cpp — views over shared storage. A view only rewrites sizes, strides and offset.

#include "tensor/view.h"

#include <algorithm>
#include <numeric>

#include "tensor/copy.h"

namespace loom::kernels {

Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset) {
  LOOM_ASSERT(sizes.size() == strides.size(), "as_strided: sizes and strides differ in length");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Tensor alias(const Tensor& t) { return as_strided(t, t.sizes(), t.strides(), t.offset()); }

Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK(infer_at < 0, ShapeError, op, ": only one dim may be -1; got shape=", requested);
      infer_at = static_cast<int64_t>(i);
    } else {
      LOOM_CHECK(shape[i] >= 0, ShapeError, op, ": invalid size ", shape[i],
                 " in shape=", requested);
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    LOOM_CHECK(known != 0 && numel % known == 0, ShapeError, op, ": shape=", requested,
               " is invalid for input of size ", numel);
    shape[infer_at] = numel / known;
  }
  LOOM_CHECK(shape_numel(shape) == numel, ShapeError, op, ": shape=", requested,
             " is invalid for input of size ", numel);
  return shape;
}

// The strides of a view of t with a new shape, or nothing when t's layout cannot express it.
// The old dims (size-1 dims left out) fall into chunks: runs of dims each contiguous with its
// inner neighbour, so a chunk is one evenly strided block of `numel` elements. New dims, from
// the innermost out, must tile the chunks exactly: within a chunk any split is expressible.
static std::optional<Shape> view_strides(const Tensor& t, const Shape& shape) {
  if (t.numel() == 0 || t.dim() == 0) return contiguous_strides(shape);
  struct Chunk {
    int64_t numel;
    int64_t base_stride;  // the stride of the chunk's innermost dim
  };
  std::vector<Chunk> chunks;  // innermost first
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.sizes()[d], stride = t.strides()[d];
    if (size == 1) continue;
    if (!chunks.empty() && stride == chunks.back().base_stride * chunks.back().numel)
      chunks.back().numel *= size;
    else
      chunks.push_back({size, stride});
  }
  Shape strides(shape.size(), 1);
  size_t chunk = 0;
  int64_t filled = 1;  // elements of the current chunk covered so far
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (chunk == chunks.size()) {  // only size-1 dims may remain
      if (shape[d] != 1) return std::nullopt;
      strides[d] = 1;
      continue;
    }
    strides[d] = filled * chunks[chunk].base_stride;
    filled *= shape[d];
    if (filled > chunks[chunk].numel || chunks[chunk].numel % filled != 0) return std::nullopt;
    if (filled == chunks[chunk].numel) {
      ++chunk;
      filled = 1;
    }
  }
  if (chunk != chunks.size()) return std::nullopt;
  return strides;
}

Tensor view(const Tensor& t, const Shape& requested) {
  const Shape shape = infer_shape(requested, t.numel(), "view");
  auto strides = view_strides(t, shape);
  LOOM_CHECK(strides.has_value(), ShapeError, "view: size ", detail::str(requested),
             " is not compatible with the input's strides (sizes=", t.sizes(),
             ", strides=", t.strides(), "); use reshape instead");
  return as_strided(t, shape, *strides, t.offset());
}

Tensor reshape(const Tensor& t, const Shape& requested) {
  const Shape shape = infer_shape(requested, t.numel(), "reshape");
  if (auto strides = view_strides(t, shape)) return as_strided(t, shape, *strides, t.offset());
  return view(contiguous(t), shape);
}

Tensor permute(const Tensor& t, const Shape& dims) {
  LOOM_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), ShapeError, "permute: expected ",
             t.dim(), " dims; got dims=", dims, " for shape=", t.sizes());
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    LOOM_CHECK(!seen[d], ShapeError, "permute: repeated dim in dims=", dims);
    seen[d] = true;
    sizes[i] = t.sizes()[d];
    strides[i] = t.strides()[d];
  }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  if (t.dim() == 0) return alias(t);
  d0 = wrap_dim(d0, t.dim(), "transpose");
  d1 = wrap_dim(d1, t.dim(), "transpose");
  Shape sizes = t.sizes(), strides = t.strides();
  std::swap(sizes[d0], sizes[d1]);
  std::swap(strides[d0], strides[d1]);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  LOOM_CHECK(t.dim() > 0, IndexError, "slice: cannot slice a 0-d tensor");
  dim = wrap_dim(dim, t.dim(), "slice");
  LOOM_CHECK(step > 0, ValueError, "slice: step must be positive; got ", step);
  const int64_t n = t.sizes()[dim];
  // Python's rules: negative bounds count from the end, and bounds clamp to [0, n].
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes = t.sizes(), strides = t.strides();
  sizes[dim] = (end - start + step - 1) / step;
  strides[dim] *= step;
  return as_strided(t, sizes, strides, t.offset() + start * t.strides()[dim]);
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  LOOM_CHECK(t.dim() > 0, IndexError, "narrow: cannot narrow a 0-d tensor");
  dim = wrap_dim(dim, t.dim(), "narrow");
  const int64_t n = t.sizes()[dim];
  if (start < 0) start += n;
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= n, IndexError, "narrow: start ", start,
             " and length ", length, " out of range for dim ", dim, " of shape=", t.sizes());
  return slice(t, dim, start, start + length, 1);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  LOOM_CHECK(t.dim() > 0, IndexError, "select: cannot select from a 0-d tensor");
  dim = wrap_dim(dim, t.dim(), "select");
  const int64_t n = t.sizes()[dim];
  LOOM_CHECK(index >= -n && index < n, IndexError, "select: index ", index,
             " out of range for dim ", dim, " of shape=", t.sizes());
  if (index < 0) index += n;
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, sizes, strides, t.offset() + index * t.strides()[dim]);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  LOOM_CHECK(static_cast<int64_t>(shape.size()) >= t.dim(), ShapeError,
             "expand: the target shape has fewer dims than the input; got shape=", t.sizes(),
             " target=", shape);
  const size_t lead = shape.size() - t.sizes().size();
  Shape sizes(shape.size()), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      LOOM_CHECK(shape[i] >= 0, ShapeError,
                 "expand: a new leading dim cannot be -1; target=", shape);
      sizes[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = t.sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    LOOM_CHECK(have == want || have == 1, ShapeError, "expand: cannot expand shape=", t.sizes(),
               " to ", shape);
    sizes[i] = want;
    strides[i] = have == want ? t.strides()[i - lead] : 0;
  }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor squeeze(const Tensor& t) {
  Shape sizes, strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] == 1) continue;
    sizes.push_back(t.sizes()[d]);
    strides.push_back(t.strides()[d]);
  }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return alias(t);
  dim = wrap_dim(dim, t.dim(), "squeeze");
  if (t.sizes()[dim] != 1) return alias(t);
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  dim = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape sizes = t.sizes(), strides = t.strides();
  const int64_t stride = dim < t.dim() ? t.strides()[dim] * t.sizes()[dim] : 1;
  sizes.insert(sizes.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  start_dim = wrap_dim(start_dim, t.dim(), "flatten");
  end_dim = wrap_dim(end_dim, t.dim(), "flatten");
  LOOM_CHECK(start_dim <= end_dim, ShapeError, "flatten: start_dim ", start_dim,
             " comes after end_dim ", end_dim, " for shape=", t.sizes());
  Shape shape(t.sizes().begin(), t.sizes().begin() + start_dim);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= t.sizes()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), t.sizes().begin() + end_dim + 1, t.sizes().end());
  return reshape(t, shape);
}

}  // namespace loom::kernels
