// tensor/cuda/pool.cu — max, average and adaptive average 2-D pooling on the GPU, forward and
// backward: the CUDA twin of tensor/cpu/pool.cpp, with its windows, its index convention and,
// for float32 and float64, its exact sums (same terms, same order). No floating-point atomics:
// Note [Deterministic pooling backward]. Results keep the input's memory format: Note [Pooling
// thread order].

#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "tensor/cuda/handles.h"
#include "tensor/cuda/pool.h"

namespace loom::cuda {

// Note [Deterministic pooling backward]
//   Average pooling (plain and adaptive) gathers: one thread per input element finds the
//   output windows that hold it (a closed-form range of rows and columns) and adds their
//   shares in ascending (oh, ow) order, the order in which the CPU scatters them, so float32
//   results match the CPU bit for bit.
//   Max pooling's backward gets only the indices, not the window geometry, so it cannot gather
//   by windows. It sorts instead: the key of output (n, c, oh, ow) is the offset in dx of the
//   input element its index names (index = ih W + iw), (n C + c) H W + index for a contiguous
//   dx, (n H W + index) C + c for a channels-last one, so the gather writes dx[key] directly in
//   either format. The sort is stable (CUB's radix sort), with the outputs' positions (in the
//   order the keys kernel enumerates them) as values; each run of equal keys is one input
//   element, and the run's first thread sums dout over the run. Both enumeration orders visit
//   one plane's outputs in ascending (oh, ow), so a run's order is the CPU's in either format.
//   Outputs whose index is outside the plane (-1: a window with no input) get a key past every
//   element and are skipped, as the CPU skips them.

// Note [Pooling thread order]
//   A channels-last input gives a channels-last output (and max pooling's indices), and the
//   backwards write dx in the format they are given. Each kernel below takes one thread per
//   element of what it writes, numbered in that tensor's memory order (position_of): for a
//   contiguous result i runs over (n, c, h, w) with w innermost, for a channels-last one over
//   (n, h, w, c) with c innermost, so neighbouring threads write neighbouring memory (out[i],
//   dx[i]) and, when their input is channels-last too, read neighbouring channels. What each
//   thread computes, and in which order it sums, does not depend on the numbering.

namespace {

using kernels::Pair;
using kernels::Pool2dOptions;

// Strides of a 4-D tensor [N, C, H, W] in elements.
struct Strides4 {
  int64_t n, c, h, w;
};
Strides4 strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Planes of H x W in, Ho x Wo out, and the window (stride {0,0} already replaced by the kernel).
struct PoolGeometry {
  int64_t channels, h, w, ho, wo;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

// kernels::pool2d_geometry (tensor/pool.cpp, whose entry points checked x and the options
// before the device switch) in the plain fields the kernels take by value.
PoolGeometry pool_geometry(const char* op, const Shape& x, const Pool2dOptions& opt, bool dilated) {
  const kernels::Pool2dGeometry s = kernels::pool2d_geometry(op, x, opt, dilated);
  PoolGeometry g;
  g.channels = x[1], g.h = s.h, g.w = s.w, g.ho = s.ho, g.wo = s.wo;
  g.kh = s.kernel[0], g.kw = s.kernel[1], g.sh = s.stride[0], g.sw = s.stride[1];
  g.ph = s.padding[0], g.pw = s.padding[1], g.dh = s.dilation[0], g.dw = s.dilation[1];
  return g;
}

__device__ inline int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_size() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Element i of a dense [N, C, H, W] tensor, in memory order: (n, c, h, w) with w innermost, or
// with channels_last (n, h, w, c) with c innermost (Note [Pooling thread order]).
struct Position {
  int64_t n, c, h, w;
};
__device__ inline Position position_of(int64_t i, int64_t channels, int64_t h, int64_t w,
                                       bool channels_last) {
  Position p;
  if (channels_last) {
    p.c = i % channels;
    const int64_t pixel = i / channels;
    p.w = pixel % w, p.h = (pixel / w) % h, p.n = pixel / (w * h);
  } else {
    p.w = i % w, p.h = (i / w) % h;
    const int64_t plane = i / (w * h);
    p.c = plane % channels, p.n = plane / channels;
  }
  return p;
}

// floor(a / b) for b > 0 and any sign of a.
__device__ inline int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// ---------------------------------------------------------------- max pooling

// One thread per output element (n, c, oh, ow) in out's memory order (Note [Pooling thread
// order]), grid-stride. The window walk is the CPU's: rows h0, h0 + dh, ... below h1, starting
// at the first row inside the input.
template <typename T>
__global__ void max_pool2d_kernel(const T* x, Strides4 xs, PoolGeometry g, bool channels_last,
                                  int64_t total, T* out, int64_t* indices) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Position p = position_of(i, g.channels, g.ho, g.wo, channels_last);
    const int64_t oh = p.h, ow = p.w;
    const T* in = x + p.n * xs.n + p.c * xs.c;
    int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    const int64_t h1 = min(h0 + (g.kh - 1) * g.dh + 1, g.h);
    const int64_t w1 = min(w0 + (g.kw - 1) * g.dw + 1, g.w);
    if (h0 < 0) h0 += (-h0 + g.dh - 1) / g.dh * g.dh;
    if (w0 < 0) w0 += (-w0 + g.dw - 1) / g.dw * g.dw;
    // -inf and index -1 only for a window that holds no input (the backward skips it).
    Acc best = -std::numeric_limits<Acc>::infinity();
    int64_t best_index = h0 < h1 && w0 < w1 ? h0 * g.w + w0 : -1;
    for (int64_t ih = h0; ih < h1; ih += g.dh) {
      for (int64_t iw = w0; iw < w1; iw += g.dw) {
        const Acc v = static_cast<Acc>(in[ih * xs.h + iw * xs.w]);
        if (v > best || isnan(v)) {  // NaN propagates, as PyTorch
          best = v;
          best_index = ih * g.w + iw;
        }
      }
    }
    out[i] = T(best);
    indices[i] = best_index;
  }
}

// Sort keys (Note [Deterministic pooling backward]): one thread per output element e, numbered
// in the indices' memory order (out_channels_last); the key is dx's offset of the input element
// (dx_channels_last says dx's format).
template <typename Index>
__global__ void max_pool_keys_kernel(const int64_t* indices, Strides4 is, int64_t channels,
                                     int64_t ho, int64_t wo, bool out_channels_last,
                                     int64_t in_plane, bool dx_channels_last, Index past_end,
                                     int64_t total, Index* keys, Index* positions) {
  for (int64_t e = first_index(); e < total; e += grid_size()) {
    const Position p = position_of(e, channels, ho, wo, out_channels_last);
    const int64_t index = indices[p.n * is.n + p.c * is.c + p.h * is.h + p.w * is.w];
    const int64_t offset = dx_channels_last ? (p.n * in_plane + index) * channels + p.c
                                            : (p.n * channels + p.c) * in_plane + index;
    keys[e] = index >= 0 && index < in_plane ? static_cast<Index>(offset) : past_end;
    positions[e] = static_cast<Index>(e);
  }
}

// One thread per sorted entry; the first entry of each run of equal keys sums the run's dout
// values in order and writes dx at the key (an offset in dx's format). dx starts zeroed.
template <typename T, typename Index>
__global__ void max_pool_gather_kernel(const T* dout, Strides4 ds, int64_t channels, int64_t ho,
                                       int64_t wo, bool out_channels_last, const Index* keys,
                                       const Index* positions, Index past_end, int64_t total,
                                       T* dx) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Index key = keys[i];
    if (key == past_end || (i > 0 && keys[i - 1] == key)) continue;
    Acc sum = 0;
    for (int64_t j = i; j < total && keys[j] == key; ++j) {
      const Position p =
          position_of(static_cast<int64_t>(positions[j]), channels, ho, wo, out_channels_last);
      sum += static_cast<Acc>(dout[p.n * ds.n + p.c * ds.c + p.h * ds.h + p.w * ds.w]);
    }
    dx[key] = T(sum);
  }
}

template <typename T, typename Index>
void max_pool_backward_sorted(const Tensor& dout, const Tensor& indices, const Tensor& dx,
                              int64_t in_plane, bool dx_channels_last) {
  const int device = dout.device().index;
  cudaStream_t stream = stream_of(dout);
  const int64_t total = dout.numel(), channels = dout.size(1), ho = dout.size(2), wo = dout.size(3);
  const Index past_end = static_cast<Index>(dx.numel());  // past every offset in dx
  // Enumerate the outputs in the indices' memory order, so the keys kernel reads them coalesced.
  const bool out_channels_last = suggest_memory_format(indices) == MemoryFormat::kChannelsLast;
  const int end_bit =
      std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(past_end))));
  const size_t bytes = static_cast<size_t>(total) * sizeof(Index);
  Scratch keys_a(bytes, device), keys_b(bytes, device);
  Scratch positions_a(bytes, device), positions_b(bytes, device);
  max_pool_keys_kernel<Index><<<blocks_for(total), kThreads, 0, stream>>>(
      indices.data_ptr<int64_t>(), strides_of(indices), channels, ho, wo, out_channels_last,
      in_plane, dx_channels_last, past_end, total, keys_a.as<Index>(), positions_a.as<Index>());
  check_launch("max_pool_keys_kernel", device);
  // Double buffers: the sort ping-pongs between a and b and says which holds the result.
  cub::DoubleBuffer<Index> keys(keys_a.as<Index>(), keys_b.as<Index>());
  cub::DoubleBuffer<Index> positions(positions_a.as<Index>(), positions_b.as<Index>());
  size_t temp_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, positions, total, 0,
                                             end_bit, stream),
             device, "max_pool2d_backward: cub::DeviceRadixSort::SortPairs (size query)");
  Scratch temp(temp_bytes, device);
  check_cuda(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys, positions, total, 0,
                                             end_bit, stream),
             device, "max_pool2d_backward: cub::DeviceRadixSort::SortPairs");
  max_pool_gather_kernel<T, Index><<<blocks_for(total), kThreads, 0, stream>>>(
      static_cast<const T*>(dout.data()), strides_of(dout), channels, ho, wo, out_channels_last,
      keys.Current(), positions.Current(), past_end, total, static_cast<T*>(dx.data()));
  check_launch("max_pool_gather_kernel", device);
}

// ---------------------------------------------------------------- average pooling

// The CPU's avg_window: [h0, h1) x [w0, w1) clamped to the input, and the divisor (the window
// counted up to the padded edge with count_include_pad, else the input elements it covers).
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};

__device__ inline AvgWindow avg_window(const PoolGeometry& g, int64_t oh, int64_t ow,
                                       bool count_include_pad) {
  AvgWindow win;
  win.h0 = oh * g.sh - g.ph;
  win.w0 = ow * g.sw - g.pw;
  win.h1 = min(win.h0 + g.kh, g.h + g.ph);
  win.w1 = min(win.w0 + g.kw, g.w + g.pw);
  const int64_t padded_size = (win.h1 - win.h0) * (win.w1 - win.w0);
  win.h0 = max(win.h0, int64_t{0}), win.w0 = max(win.w0, int64_t{0});
  win.h1 = min(win.h1, g.h), win.w1 = min(win.w1, g.w);
  win.divisor = count_include_pad ? padded_size : (win.h1 - win.h0) * (win.w1 - win.w0);
  return win;
}

// One thread per output element in out's memory order (Note [Pooling thread order]),
// grid-stride; the window summed row by row as the CPU does.
template <typename T>
__global__ void avg_pool2d_kernel(const T* x, Strides4 xs, PoolGeometry g, bool count_include_pad,
                                  bool channels_last, int64_t total, T* out) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Position p = position_of(i, g.channels, g.ho, g.wo, channels_last);
    const int64_t oh = p.h, ow = p.w;
    const T* in = x + p.n * xs.n + p.c * xs.c;
    const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
    Acc sum = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw)
        sum += static_cast<Acc>(in[ih * xs.h + iw * xs.w]);
    out[i] = win.divisor > 0 && win.h0 < win.h1 && win.w0 < win.w1
                 ? T(sum / static_cast<Acc>(win.divisor))
                 : T(Acc(0));
  }
}

// dx[i] = sum over the windows w holding i of dout[w] / divisor(w). One thread per input
// element in dx's memory order (Note [Pooling thread order]), grid-stride; window (oh, ow)
// holds row ih when oh sh - ph <= ih < oh sh - ph + kh, i.e. oh in
// [floor((ih + ph - kh) / sh) + 1, floor((ih + ph) / sh)], likewise columns; each is checked
// against the clamped window too.
template <typename T>
__global__ void avg_pool2d_backward_kernel(const T* dout, Strides4 ds, PoolGeometry g,
                                           bool count_include_pad, bool channels_last,
                                           int64_t total, T* dx) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Position p = position_of(i, g.channels, g.h, g.w, channels_last);
    const int64_t ih = p.h, iw = p.w;
    const T* dy = dout + p.n * ds.n + p.c * ds.c;
    const int64_t oh_lo = max(floor_div(ih + g.ph - g.kh, g.sh) + 1, int64_t{0});
    const int64_t oh_hi = min(floor_div(ih + g.ph, g.sh), g.ho - 1);
    const int64_t ow_lo = max(floor_div(iw + g.pw - g.kw, g.sw) + 1, int64_t{0});
    const int64_t ow_hi = min(floor_div(iw + g.pw, g.sw), g.wo - 1);
    Acc sum = 0;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
        if (win.divisor <= 0 || ih < win.h0 || ih >= win.h1 || iw < win.w0 || iw >= win.w1)
          continue;
        sum += static_cast<Acc>(dy[oh * ds.h + ow * ds.w]) / static_cast<Acc>(win.divisor);
      }
    }
    dx[i] = T(sum);
  }
}

// ---------------------------------------------------------------- adaptive average pooling

// Output cell i along a dim averages input [floor(i in / out), ceil((i+1) in / out)).
__device__ inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}
__device__ inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

// One thread per output element in out's memory order (Note [Pooling thread order]),
// grid-stride.
template <typename T>
__global__ void adaptive_avg_pool2d_kernel(const T* x, Strides4 xs, int64_t channels, int64_t h,
                                           int64_t w, int64_t ho, int64_t wo, bool channels_last,
                                           int64_t total, T* out) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Position p = position_of(i, channels, ho, wo, channels_last);
    const int64_t oh = p.h, ow = p.w;
    const T* in = x + p.n * xs.n + p.c * xs.c;
    const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
    const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
    Acc sum = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) sum += static_cast<Acc>(in[ih * xs.h + iw * xs.w]);
    out[i] = T(sum / static_cast<Acc>((h1 - h0) * (w1 - w0)));
  }
}

// dx[i] = sum over the cells c whose window holds i of dout[c] / |window(c)|. One thread per
// input element in dx's memory order (Note [Pooling thread order]), grid-stride. Cell oh holds
// row ih for oh in [floor(ih Ho / H), ceil((ih + 1) Ho / H) - 1]; the loop widens that by one
// on each side and checks each cell, so it stays exact at the edges.
template <typename T>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* dout, Strides4 ds, int64_t channels,
                                                    int64_t h, int64_t w, int64_t ho, int64_t wo,
                                                    bool channels_last, int64_t total, T* dx) {
  using Acc = acc_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_size()) {
    const Position p = position_of(i, channels, h, w, channels_last);
    const int64_t ih = p.h, iw = p.w;
    const T* dy = dout + p.n * ds.n + p.c * ds.c;
    const int64_t oh_lo = max(ih * ho / h - 1, int64_t{0});
    const int64_t oh_hi = min(((ih + 1) * ho + h - 1) / h, ho - 1);
    const int64_t ow_lo = max(iw * wo / w - 1, int64_t{0});
    const int64_t ow_hi = min(((iw + 1) * wo + w - 1) / w, wo - 1);
    Acc sum = 0;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
        if (iw < w0 || iw >= w1) continue;
        sum +=
            static_cast<Acc>(dy[oh * ds.h + ow * ds.w]) / static_cast<Acc>((h1 - h0) * (w1 - w0));
      }
    }
    dx[i] = T(sum);
  }
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const PoolGeometry g = pool_geometry("max_pool2d", x.sizes(), options, /*dilated=*/true);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), g.ho, g.wo}, x.dtype(), x.device(), format);
  Tensor indices = empty(out.sizes(), kInt64, x.device(), format);
  const int64_t total = out.numel();
  dispatch_cuda_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
    if (total == 0) return;
    max_pool2d_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(x)>>>(
        static_cast<const T*>(x.data()), strides_of(x), g, format == MemoryFormat::kChannelsLast,
        total, static_cast<T*>(out.data()), indices.data_ptr<int64_t>());
    check_launch("max_pool2d_kernel", device);
  });
  return {out, indices};
}

// dx: each output's gradient added at the input position of its maximum.
Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format) {
  const int device = dout.device().index;
  DeviceGuard guard(device);
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  dispatch_cuda_floating(dout.dtype(), "max_pool2d_backward", [&]<typename T>() {
    if (dx.numel() == 0) return;
    LOOM_CUDA_CHECK(cudaMemsetAsync(dx.data(), 0, dx.nbytes(), stream_of(dx)), device);
    if (dout.numel() == 0) return;
    const uint64_t largest = static_cast<uint64_t>(std::max(dx.numel(), dout.numel()));
    const int64_t in_plane = x_shape[2] * x_shape[3];
    const bool channels_last = format == MemoryFormat::kChannelsLast;
    if (largest < std::numeric_limits<uint32_t>::max())
      max_pool_backward_sorted<T, uint32_t>(dout, indices, dx, in_plane, channels_last);
    else
      max_pool_backward_sorted<T, uint64_t>(dout, indices, dx, in_plane, channels_last);
  });
  return dx;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const PoolGeometry g = pool_geometry("avg_pool2d", x.sizes(), options, /*dilated=*/false);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), g.ho, g.wo}, x.dtype(), x.device(), format);
  const int64_t total = out.numel();
  dispatch_cuda_floating(x.dtype(), "avg_pool2d", [&]<typename T>() {
    if (total == 0) return;
    avg_pool2d_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(x)>>>(
        static_cast<const T*>(x.data()), strides_of(x), g, options.count_include_pad,
        format == MemoryFormat::kChannelsLast, total, static_cast<T*>(out.data()));
    check_launch("avg_pool2d_kernel", device);
  });
  return out;
}

Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, const Pool2dOptions& options,
                           MemoryFormat format) {
  const PoolGeometry g = pool_geometry("avg_pool2d_backward", x_shape, options, false);
  const int device = dout.device().index;
  DeviceGuard guard(device);
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  const int64_t total = dx.numel();
  dispatch_cuda_floating(dout.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    if (total == 0) return;
    avg_pool2d_backward_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(dout)>>>(
        static_cast<const T*>(dout.data()), strides_of(dout), g, options.count_include_pad,
        format == MemoryFormat::kChannelsLast, total, static_cast<T*>(dx.data()));
    check_launch("avg_pool2d_backward_kernel", device);
  });
  return dx;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  const int device = x.device().index;
  DeviceGuard guard(device);
  const auto [ho, wo] = output_size;
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), ho, wo}, x.dtype(), x.device(), format);
  const int64_t total = out.numel();
  dispatch_cuda_floating(x.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    if (total == 0) return;
    adaptive_avg_pool2d_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(x)>>>(
        static_cast<const T*>(x.data()), strides_of(x), x.size(1), x.size(2), x.size(3), ho, wo,
        format == MemoryFormat::kChannelsLast, total, static_cast<T*>(out.data()));
    check_launch("adaptive_avg_pool2d_kernel", device);
  });
  return out;
}

Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, MemoryFormat format) {
  const int device = dout.device().index;
  DeviceGuard guard(device);
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  const int64_t total = dx.numel();
  dispatch_cuda_floating(dout.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    if (total == 0) return;
    adaptive_avg_pool2d_backward_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(dout)>>>(
        static_cast<const T*>(dout.data()), strides_of(dout), x_shape[1], x_shape[2], x_shape[3],
        dout.size(2), dout.size(3), format == MemoryFormat::kChannelsLast, total,
        static_cast<T*>(dx.data()));
    check_launch("adaptive_avg_pool2d_backward_kernel", device);
  });
  return dx;
}

}  // namespace loom::cuda
