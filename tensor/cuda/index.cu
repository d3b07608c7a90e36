// tensor/cuda/index.cu — joining and indexing kernels on the GPU: cat and row selection as
// word-wide copies, gather by coordinates, index_add / scatter_add / embedding's backward as
// per-destination sums in index order (grouped on the host, so no floating-point atomics), and
// dropout's Philox mask (tensor/philox.h), equal to the CPU's bit for bit.

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <vector>

#include "tensor/copy.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/index.h"
#include "tensor/dispatch.h"
#include "tensor/index.h"
#include "tensor/philox.h"

namespace loom::cuda {

namespace {

// ---------------------------------------------------------------- shared helpers

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

constexpr int kMaxDims = 16;

// Sizes and strides (in elements), passed to a kernel by value.
struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

Layout layout_of(const Shape& sizes, const Shape& strides, const char* op) {
  LOOM_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), NotImplementedError, op,
             ": CUDA index kernels take at most ", kMaxDims, " dims; got shape=", sizes);
  Layout l;
  l.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < l.ndim; ++d) {
    l.sizes[d] = sizes[d];
    l.strides[d] = strides[d];
  }
  return l;
}

// The storage offset of element i (row-major over l.sizes); with `dim` >= 0, that dim's
// coordinate is replaced by `at` (gather).
__device__ inline int64_t offset_of(const Layout& l, int64_t i, int dim = -1, int64_t at = 0) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    const int64_t coord = i % l.sizes[d];
    i /= l.sizes[d];
    off += (d == dim ? at : coord) * l.strides[d];
  }
  return off;
}

// Copies of whole elements move as unsigned words of the element's size, or of a larger size
// when a row's bytes and its addresses allow (up to 16 bytes: uint4).
template <typename F>
void dispatch_word(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    case 8:
      return f.template operator()<uint64_t>();
    case 16:
      return f.template operator()<uint4>();
  }
  LOOM_ASSERT(false, "dispatch_word: unexpected word size ", bytes);
}

// The widest word (16, 8, 4, 2 or 1 bytes) dividing every byte count and address given.
size_t widest_word(std::initializer_list<uint64_t> values) {
  uint64_t all = 0;
  for (uint64_t v : values) all |= v;
  for (size_t w = 16; w > 1; w /= 2)
    if (all % w == 0) return w;
  return 1;
}
uint64_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The index (int64 or int32: checked by the CPU entry) as a contiguous int64 tensor on its
// device (itself when already so).
Tensor index_as_int64(const Tensor& index) {
  return kernels::contiguous(kernels::to_dtype(index, kInt64));
}

// The index's values on the host, as int64 in row-major order (waits for the device).
std::vector<int64_t> index_to_host(const Tensor& index) {
  const Tensor idx = index_as_int64(index);
  std::vector<int64_t> host(static_cast<size_t>(idx.numel()));
  copy_bytes(host.data(), idx.data(), host.size() * sizeof(int64_t), CopyKind::DeviceToHost,
             idx.device().index);
  return host;
}

// An int64 tensor on `device` holding `values` (queued on the current stream; the host vector
// may go as soon as this returns: pageable copies are staged before cudaMemcpyAsync returns).
Tensor upload(const std::vector<int64_t>& values, Device device) {
  Tensor t = empty({static_cast<int64_t>(values.size())}, kInt64, device);
  copy_bytes_async(t.data(), values.data(), values.size() * sizeof(int64_t), CopyKind::HostToDevice,
                   Stream::current(device.index));
  return t;
}

// Marks the first position i with idx[i] outside [0, limit) (integer atomicMin: any order gives
// the same minimum). A thread stops at its first bad position: its later ones are larger.
__global__ void first_out_of_range_kernel(const int64_t* idx, int64_t n, int64_t limit,
                                          unsigned long long* first) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    if (idx[i] >= 0 && idx[i] < limit) continue;
    atomicMin(first, static_cast<unsigned long long>(i));
    return;
  }
}

// The first value of idx (contiguous int64 on the device) outside [0, limit), as the CPU's
// first_out_of_range finds it; false when all are in range. Waits for the device.
bool first_out_of_range(const Tensor& idx, int64_t limit, int64_t& value) {
  const int64_t n = idx.numel();
  if (n == 0) return false;
  const int device = idx.device().index;
  const cudaStream_t stream = stream_of(idx);
  Tensor first = empty({1}, kInt64, idx.device());
  LOOM_CUDA_CHECK(cudaMemsetAsync(first.data(), 0xff, sizeof(int64_t), stream), device);
  first_out_of_range_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      idx.data_ptr<int64_t>(), n, limit, static_cast<unsigned long long*>(first.data()));
  check_launch("first_out_of_range_kernel", device);
  unsigned long long position = 0;
  copy_bytes(&position, first.data(), sizeof(position), CopyKind::DeviceToHost, device);
  if (position == ~0ull) return false;
  copy_bytes(&value, idx.data_ptr<int64_t>() + position, sizeof(value), CopyKind::DeviceToHost,
             device);
  return true;
}

// The same search over a host copy.
bool first_out_of_range(const std::vector<int64_t>& idx, int64_t limit, int64_t& value) {
  for (int64_t v : idx) {
    if (v >= 0 && v < limit) continue;
    value = v;
    return true;
  }
  return false;
}

// Sizes and strides with a 0-d tensor seen as 1-D of size 1 (as the CPU does).
Shape sizes_1d(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.sizes(); }
Shape strides_1d(const Tensor& t) { return t.dim() == 0 ? Shape{0} : t.strides(); }

int64_t prod(const Shape& s, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t d = begin; d < end; ++d) p *= s[d];
  return p;
}

// ---------------------------------------------------------------- copies of rows and blocks

// dst[r * dst_pitch + w] = src[r * src_pitch + w] for a [rows, width] block of words (cat writes
// each input into its columns of the output rows). Thread per word.
template <typename W>
__global__ void copy_block_kernel(const W* src, int64_t src_pitch, W* dst, int64_t dst_pitch,
                                  int64_t rows, int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const int64_t r = i / width, w = i % width;
    dst[r * dst_pitch + w] = src[r * src_pitch + w];
  }
}

// out [outer, m, row] = src [outer, n, row] at rows idx[j], rows of `row` words (index_select,
// embedding). Thread per output word: consecutive threads copy consecutive words of a row.
template <typename W>
__global__ void select_rows_kernel(const W* src, W* out, int64_t outer, int64_t n, int64_t m,
                                   int64_t row, const int64_t* idx) {
  const int64_t total = outer * m * row;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t w = i % row, r = i / row, j = r % m, o = r / m;
    out[i] = src[(o * n + idx[j]) * row + w];
  }
}

// out = src [outer, n, inner] (contiguous) at rows idx (contiguous int64, m values, in range).
void select_rows(const Tensor& src, int64_t outer, int64_t n, int64_t inner, const Tensor& idx,
                 const Tensor& out) {
  const int64_t m = idx.numel();
  if (outer * m * inner == 0) return;
  const uint64_t row_bytes = static_cast<uint64_t>(inner) * src.itemsize();
  const size_t word = widest_word({row_bytes, address(src.data()), address(out.data())});
  const int64_t row = static_cast<int64_t>(row_bytes / word);
  dispatch_word(word, [&]<typename W>() {
    select_rows_kernel<W><<<blocks_for(outer * m * row), kThreads, 0, stream_of(src)>>>(
        static_cast<const W*>(src.data()), static_cast<W*>(out.data()), outer, n, m, row,
        idx.data_ptr<int64_t>());
    check_launch("select_rows_kernel", src.device().index);
  });
}

// ---------------------------------------------------------------- grouped accumulation

// The CUDA side of Note [Race-free index_add]. dst [outer, n, inner]: for each listed row v
// (rows[k], or k itself when rows is null) of each outer slice, element c becomes (0 with
// kOverwrite, else itself) plus src [outer, m, inner] rows order[start[v]] .. order[start[v+1]-1],
// added in that order. Thread per (outer, k, c): consecutive threads take consecutive columns of
// one row, no two threads write one element, and each element sums in the CPU's order.
template <bool kOverwrite, typename T>
__global__ void accumulate_rows_kernel(T* dst, const T* src, int64_t outer, int64_t n, int64_t m,
                                       int64_t inner, const int64_t* start, const int64_t* order,
                                       const int64_t* rows, int64_t num_rows) {
  const int64_t total = outer * num_rows * inner;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t c = i % inner, r = i / inner, k = r % num_rows, o = r / num_rows;
    const int64_t v = rows ? rows[k] : k;
    T* out = dst + (o * n + v) * inner + c;
    T acc = kOverwrite ? T(0) : *out;
    for (int64_t p = start[v]; p < start[v + 1]; ++p) acc += src[(o * m + order[p]) * inner + c];
    *out = acc;
  }
}

// dst [outer, n, inner] (contiguous) += or = the rows of src [outer, m, inner] (contiguous) that
// idx sends to each row; positions with idx[j] == skip are left out. The grouping is the CPU's
// counting sort, on the host copy of the index.
template <bool kOverwrite, typename T>
void accumulate_rows(const Tensor& dst, const Tensor& src, int64_t outer, int64_t n, int64_t m,
                     int64_t inner, const std::vector<int64_t>& idx, int64_t skip) {
  // One upload: start (n + 1) | order (count) | touched rows (kept only when adding).
  std::vector<int64_t> table(static_cast<size_t>(n) + 1, 0);
  for (int64_t j = 0; j < m; ++j)
    if (idx[j] != skip) ++table[idx[j] + 1];
  for (int64_t v = 0; v < n; ++v) table[v + 1] += table[v];
  const int64_t count = table[n];
  std::vector<int64_t> next(table.begin(), table.end() - 1);
  table.resize(static_cast<size_t>(n + 1 + count));
  for (int64_t j = 0; j < m; ++j)
    if (idx[j] != skip) table[n + 1 + next[idx[j]]++] = j;
  int64_t num_rows = n;
  if (!kOverwrite) {  // only rows that receive something change
    num_rows = 0;
    for (int64_t v = 0; v < n; ++v)
      if (table[v + 1] > table[v]) {
        table.push_back(v);
        ++num_rows;
      }
  }
  if (outer * num_rows * inner == 0) return;
  const Tensor device_table = upload(table, dst.device());
  const int64_t* start = device_table.data_ptr<int64_t>();
  accumulate_rows_kernel<kOverwrite, T>
      <<<blocks_for(outer * num_rows * inner), kThreads, 0, stream_of(dst)>>>(
          dst.data_ptr<T>(), src.data_ptr<T>(), outer, n, m, inner, start, start + n + 1,
          kOverwrite ? nullptr : start + n + 1 + count, num_rows);
  check_launch("accumulate_rows_kernel", dst.device().index);
}

// self[targets[s]] = self[targets[s]] + src[sources[p]] for p in [first[s], first[s+1]), added
// in that order (scatter_add_). Thread per target: targets are distinct, so no two threads
// write one element.
template <typename T>
__global__ void segment_sum_kernel(T* self, const T* src, const int64_t* targets,
                                   const int64_t* first, const int64_t* sources, int64_t segments) {
  for (int64_t s = thread_index(); s < segments; s += thread_count()) {
    T acc = self[targets[s]];
    for (int64_t p = first[s]; p < first[s + 1]; ++p) acc += src[sources[p]];
    self[targets[s]] = acc;
  }
}

// ---------------------------------------------------------------- gather, one_hot, dropout

// out[i] = x[offset of i's coordinates (index's shape) in x, coordinate d taken from idx[i]].
// Thread per output element.
template <typename W>
__global__ void gather_kernel(const W* x, W* out, const int64_t* idx, Layout index_in_x, int d,
                              int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    out[i] = x[offset_of(index_in_x, i, d, idx[i])];
}

// The largest value of idx (integer atomicMax: order-free).
__global__ void max_kernel(const int64_t* idx, int64_t n, long long* result) {
  long long best = LLONG_MIN;
  for (int64_t i = thread_index(); i < n; i += thread_count())
    best = max(best, static_cast<long long>(idx[i]));
  if (best != LLONG_MIN) atomicMax(result, best);
}

// out [n, classes] (int64): 1 where the column is idx of the row. Thread per output element.
__global__ void one_hot_kernel(const int64_t* idx, int64_t* out, int64_t n, int64_t classes) {
  const int64_t total = n * classes;
  for (int64_t i = thread_index(); i < total; i += thread_count())
    out[i] = idx[i / classes] == i % classes ? 1 : 0;
}

// Note [Dropout mask]. Thread c (grid-stride) evaluates counter first + c and scales elements
// 4c .. 4c+3 below n: float32 moves them as one float4 when the group is whole and both
// pointers are 16-byte aligned. x * 0 keeps NaN, as the CPU and PyTorch do.
template <typename T>
__global__ void dropout_kernel(const T* src, T* out, int64_t n, double p, T scale, uint64_t seed,
                               uint64_t first, bool aligned) {
  const int64_t counters = (n + 3) / 4;
  for (int64_t c = thread_index(); c < counters; c += thread_count()) {
    const philox::Lanes r = philox::philox4x32(seed, first + static_cast<uint64_t>(c));
    T factor[4];
    for (int k = 0; k < 4; ++k)
      factor[k] = static_cast<double>(philox::uniform_float(r[k])) >= p ? scale : T(0);
    if constexpr (sizeof(T) == 4) {
      if (aligned && c * 4 + 3 < n) {
        const float4 v = *reinterpret_cast<const float4*>(src + c * 4);
        *reinterpret_cast<float4*>(out + c * 4) =
            make_float4(v.x * factor[0], v.y * factor[1], v.z * factor[2], v.w * factor[3]);
        continue;
      }
    }
    for (int k = 0; k < 4 && c * 4 + k < n; ++k) out[c * 4 + k] = src[c * 4 + k] * factor[k];
  }
}

}  // namespace

// ---------------------------------------------------------------- cat

// One copy_block launch per input: its [outer, size(d) * inner] block lands at its columns of
// the output rows, in the widest word that the byte counts and addresses allow.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const kernels::CatPlan plan = kernels::plan_cat(tensors, dim);
  const Device device = tensors[0].device();
  DeviceGuard guard(device.index);
  const int64_t d = plan.dim;
  const Shape& out_shape = plan.out_shape;
  std::vector<Tensor> parts;  // contiguous, of the output dtype
  for (const Tensor& t : plan.parts)
    parts.push_back(kernels::contiguous(kernels::to_dtype(t, plan.dtype)));  // on the device
  Tensor out = empty(out_shape, plan.dtype, device);
  const int64_t outer = prod(out_shape, 0, d), inner = prod(out_shape, d + 1, out.dim());
  const uint64_t item = out.itemsize();
  const uint64_t out_row = static_cast<uint64_t>(out_shape[d] * inner) * item;  // bytes
  uint64_t column = 0;                                                          // bytes
  for (const Tensor& part : parts) {
    const uint64_t width = static_cast<uint64_t>(part.size(d) * inner) * item;
    char* dst = static_cast<char*>(out.data()) + column;
    column += width;
    if (outer == 0 || width == 0) continue;
    const size_t word = widest_word({width, out_row, address(dst), address(part.data())});
    const int64_t w = static_cast<int64_t>(width / word);
    dispatch_word(word, [&]<typename W>() {
      copy_block_kernel<W><<<blocks_for(outer * w), kThreads, 0, stream_of(out)>>>(
          static_cast<const W*>(part.data()), w, reinterpret_cast<W*>(dst),
          static_cast<int64_t>(out_row / word), outer, w);
      check_launch("copy_block_kernel", device.index);
    });
  }
  return out;
}

// ---------------------------------------------------------------- index_select, index_add_

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  DeviceGuard guard(x.device().index);
  const Tensor idx = index_as_int64(index);
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  const Shape xs = sizes_1d(x);
  const int64_t n = xs[d];
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, n, bad), IndexError, "index_select: index ", bad,
             " is out of range for dim ", d, " of size ", n, "; got x=", x.sizes(),
             " index=", index.sizes());
  Tensor out = empty(kernels::index_select_shape(x, d, index), x.dtype(), x.device());
  select_rows(kernels::contiguous(x), prod(xs, 0, d), n,
              prod(xs, d + 1, static_cast<int64_t>(xs.size())), idx, out);
  return out;
}

void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  DeviceGuard guard(self.device().index);
  const std::vector<int64_t> idx = index_to_host(index);
  const int64_t d = wrap_dim(dim, self.dim(), "index_add_");
  const Shape xs = sizes_1d(self);
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, xs[d], bad), IndexError, "index_add_: index ", bad,
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes());
  self.bump_version();
  const Tensor s = kernels::contiguous(src);
  dispatch_numeric(self.dtype(), "index_add_", [&]<typename T>() {
    accumulate_rows</*kOverwrite=*/false, T>(
        self, s, prod(xs, 0, d), xs[d], static_cast<int64_t>(idx.size()),
        prod(xs, d + 1, static_cast<int64_t>(xs.size())), idx, /*skip=*/-1);
  });
}

// ---------------------------------------------------------------- gather, scatter_add

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  DeviceGuard guard(x.device().index);
  const Tensor idx = index_as_int64(index);
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  const Shape xs = sizes_1d(x), is = sizes_1d(index);
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, xs[d], bad), IndexError, "gather: index ", bad,
             " is out of range for dim ", d, " of size ", xs[d], "; got x=", x.sizes(),
             " index=", index.sizes());
  Tensor out = empty(index.sizes(), x.dtype(), x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  // Coordinates run over index's shape; offsets use x's strides.
  const Layout index_in_x = layout_of(is, strides_1d(x), "gather");
  dispatch_word(x.itemsize(), [&]<typename W>() {
    gather_kernel<W><<<blocks_for(n), kThreads, 0, stream_of(x)>>>(
        static_cast<const W*>(x.data()), static_cast<W*>(out.data()), idx.data_ptr<int64_t>(),
        index_in_x, static_cast<int>(d), n);
    check_launch("gather_kernel", x.device().index);
  });
  return out;
}

// scatter_add_ under the name of the op the user called. On the host copy of the index: the
// storage offsets of every position's target in self and source in src, positions stably
// sorted by target (so each target keeps the CPU's increasing-j order), then one thread per
// distinct target sums its sources in that order.
void scatter_add_into(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const char* op) {
  DeviceGuard guard(self.device().index);
  const std::vector<int64_t> idx = index_to_host(index);
  const int64_t d = wrap_dim(dim, self.dim(), op);
  const Shape xs = sizes_1d(self), is = sizes_1d(index);
  const Shape xst = strides_1d(self), sst = strides_1d(src);
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, xs[d], bad), IndexError, op, ": index ", bad,
             " is out of range for dim ", d, " of size ", xs[d], "; got self=", self.sizes(),
             " index=", index.sizes(), " src=", src.sizes());
  self.bump_version();
  const int64_t m = static_cast<int64_t>(idx.size());
  if (m == 0) return;

  std::vector<int64_t> target(m), source(m);
  const int64_t r = static_cast<int64_t>(is.size());
  Shape coord(r, 0);
  for (int64_t e = 0; e < m; ++e) {
    int64_t to = 0, from = 0;
    for (int64_t k = 0; k < r; ++k) {
      to += (k == d ? idx[e] : coord[k]) * xst[k];
      from += coord[k] * sst[k];
    }
    target[e] = to;
    source[e] = from;
    for (int64_t k = r - 1; k >= 0; --k) {  // odometer step over index's shape
      if (++coord[k] < is[k]) break;
      coord[k] = 0;
    }
  }
  std::vector<int64_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return target[a] < target[b]; });

  // One upload: targets (U) | first (U + 1) | sources (m), U distinct targets.
  std::vector<int64_t> targets, first;
  for (int64_t p = 0; p < m; ++p)
    if (p == 0 || target[order[p]] != target[order[p - 1]]) {
      targets.push_back(target[order[p]]);
      first.push_back(p);
    }
  first.push_back(m);
  const int64_t segments = static_cast<int64_t>(targets.size());
  std::vector<int64_t> table = std::move(targets);
  table.insert(table.end(), first.begin(), first.end());
  for (int64_t p = 0; p < m; ++p) table.push_back(source[order[p]]);
  const Tensor device_table = upload(table, self.device());
  const int64_t* plan = device_table.data_ptr<int64_t>();
  dispatch_numeric(self.dtype(), op, [&]<typename T>() {
    segment_sum_kernel<T><<<blocks_for(segments), kThreads, 0, stream_of(self)>>>(
        self.data_ptr<T>(), src.data_ptr<T>(), plan, plan + segments, plan + 2 * segments + 1,
        segments);
    check_launch("segment_sum_kernel", self.device().index);
  });
}

void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_add_into(self, dim, index, src, "scatter_add_");
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  DeviceGuard guard(x.device().index);
  Tensor out = kernels::clone(x);
  scatter_add_into(out, dim, index, src, "scatter_add");
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  DeviceGuard guard(index.device().index);
  const Tensor idx = index_as_int64(index);
  const int64_t n = idx.numel();
  const int device = index.device().index;
  if (num_classes == -1) {  // n > 0: checked by the CPU entry
    Tensor best = empty({1}, kInt64, index.device());
    const long long lowest = LLONG_MIN;
    copy_bytes_async(best.data(), &lowest, sizeof(lowest), CopyKind::HostToDevice,
                     Stream::current(device));
    max_kernel<<<blocks_for(n), kThreads, 0, stream_of(idx)>>>(
        idx.data_ptr<int64_t>(), n, static_cast<long long*>(best.data()));
    check_launch("max_kernel", device);
    int64_t max_value = 0;
    copy_bytes(&max_value, best.data(), sizeof(max_value), CopyKind::DeviceToHost, device);
    num_classes = max_value + 1;
  }
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, num_classes, bad), IndexError, "one_hot: class ", bad,
             " is out of range [0, ", num_classes, "); got index=", index.sizes());
  Shape out_shape = index.sizes();
  out_shape.push_back(num_classes);
  Tensor out = empty(out_shape, kInt64, index.device());
  if (n * num_classes == 0) return out;
  one_hot_kernel<<<blocks_for(n * num_classes), kThreads, 0, stream_of(idx)>>>(
      idx.data_ptr<int64_t>(), out.data_ptr<int64_t>(), n, num_classes);
  check_launch("one_hot_kernel", device);
  return out;
}

// ---------------------------------------------------------------- embedding

Tensor embedding(const Tensor& weight, const Tensor& index) {
  DeviceGuard guard(weight.device().index);
  const Tensor idx = index_as_int64(index);
  const int64_t num_weights = weight.size(0), dim = weight.size(1);
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, num_weights, bad), IndexError, "embedding: index ", bad,
             " is out of range for weight=", weight.sizes(), "; got index=", index.sizes());
  Shape out_shape = index.sizes();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, weight.dtype(), weight.device());
  select_rows(kernels::contiguous(weight), 1, num_weights, dim, idx, out);
  return out;
}

// Threads take elements of dweight; each sums its dout rows in index order (accumulate_rows).
Tensor embedding_backward(const Tensor& dout, const Tensor& index, int64_t num_weights,
                          int64_t padding_idx) {
  DeviceGuard guard(dout.device().index);
  const std::vector<int64_t> idx = index_to_host(index);
  const int64_t dim = dout.size(-1);
  int64_t bad = 0;
  LOOM_CHECK(!first_out_of_range(idx, num_weights, bad), IndexError, "embedding_backward: index ",
             bad, " is out of range for ", num_weights, " embeddings; got index=", index.sizes());
  Tensor dweight = empty({num_weights, dim}, dout.dtype(), dout.device());  // all written below
  const Tensor g = kernels::contiguous(dout);
  dispatch_floating(dout.dtype(), "embedding_backward", [&]<typename T>() {
    accumulate_rows</*kOverwrite=*/true, T>(
        dweight, g, 1, num_weights, static_cast<int64_t>(idx.size()), dim, idx, padding_idx);
  });
  return dweight;
}

// ---------------------------------------------------------------- dropout

Tensor dropout_masked(const Tensor& x, double p, uint64_t seed, uint64_t first) {
  DeviceGuard guard(x.device().index);
  const Tensor src = kernels::contiguous(x);
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  const int64_t n = x.numel();
  dispatch_floating(x.dtype(), "dropout", [&]<typename T>() {
    if (n == 0) return;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const bool aligned = address(src.data()) % 16 == 0 && address(out.data()) % 16 == 0;
    dropout_kernel<T><<<blocks_for((n + 3) / 4), kThreads, 0, stream_of(x)>>>(
        src.data_ptr<T>(), out.data_ptr<T>(), n, p, scale, seed, first, aligned);
    check_launch("dropout_kernel", x.device().index);
  });
  return out;
}

}  // namespace loom::cuda
