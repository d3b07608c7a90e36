// tensor/cpu/index.cpp — joining and indexing kernels on the CPU (the loops behind the front in
// tensor/index.cpp): cat as parallel byte copies, gather/scatter along one dim, race-free
// accumulation for index_add and embedding's backward (Note [Race-free index_add]), the scan
// for out-of-range index values, and dropout's Philox mask.

#include "tensor/cpu/index.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/random.h"

namespace loom::cpu {

namespace {

using kernels::contiguous;
using kernels::to_dtype;

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

}  // namespace

// Threads scan chunks; the lowest position found wins.
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

// ---------------------------------------------------------------- cat

// Work maps to threads by output elements: each thread copies a range of the flat output,
// which crosses input boundaries as memcpy segments.
Tensor cat(const kernels::CatPlan& plan) {
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

// ---------------------------------------------------------------- index_select, index_add_

Tensor index_select(const Tensor& x, int64_t d, const Tensor& idx, const Shape& out_shape) {
  const Shape xs = sizes_1d(x);
  const int64_t n = xs[d], m = idx.numel();
  Tensor out = empty(out_shape, x.dtype());
  select_rows(contiguous(x), prod(xs, 0, d), n, prod(xs, d + 1, xs.size()), idx.data_ptr<int64_t>(),
              m, out);
  return out;
}

void index_add_(const Tensor& self, int64_t d, const Tensor& idx, const Tensor& src) {
  const Shape xs = sizes_1d(self);
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
Tensor gather(const Tensor& x, int64_t d, const Tensor& idx) {
  const Shape is = sizes_1d(idx);
  Tensor out = empty(idx.sizes(), x.dtype());
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

// Lines along dim go to threads: two lines differ in some other coordinate, so they write to
// different elements of self.
void scatter_add_into(const Tensor& self, int64_t d, const Tensor& idx, const Tensor& src,
                      const char* op) {
  const Shape is = sizes_1d(idx);
  const Shape xst = strides_1d(self), sst = strides_1d(src);
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

Tensor one_hot(const Tensor& idx, int64_t num_classes) {
  const int64_t n = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  Shape out_shape = idx.sizes();
  out_shape.push_back(num_classes);
  Tensor out = zeros(out_shape, kInt64);
  int64_t* op = out.data_ptr<int64_t>();
  parallel_for(0, n, kParallelGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) op[i * num_classes + ip[i]] = 1;
  });
  return out;
}

// ---------------------------------------------------------------- embedding

Tensor embedding(const Tensor& weight, const Tensor& idx) {
  const int64_t num_weights = weight.size(0), dim = weight.size(1);
  Shape out_shape = idx.sizes();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, weight.dtype());
  select_rows(contiguous(weight), 1, num_weights, dim, idx.data_ptr<int64_t>(), idx.numel(), out);
  return out;
}

// Threads take rows of dweight (Note [Race-free index_add]), so duplicate indices never race.
Tensor embedding_backward(const Tensor& dout, const Tensor& idx, int64_t num_weights,
                          int64_t padding_idx) {
  const int64_t dim = dout.size(-1);
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

}  // namespace loom::cpu
