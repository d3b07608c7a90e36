// tensor/cpu/pool.cpp — max, average and adaptive average pooling over NCHW tensors on the CPU,
// forward and backward, in the geometry the front (tensor/pool.cpp) checked and computed.
// Results keep the input's memory format (Note [Pooling channels-last on the CPU]). Threads own
// disjoint parts of the result (planes, rows or images), so the backward needs no atomics.

#include "tensor/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

using kernels::contiguous;
using kernels::Pair;
using kernels::Pool2dGeometry;

namespace {

// Runs unit(i) for i in [0, units) in parallel; `work` is the cost of one unit (an NCHW plane,
// a channels-last output row or block of channels).
template <typename F>
void for_units(int64_t units, int64_t work, F&& unit) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(work, 1));
  parallel_for(0, units, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) unit(i);
  });
}

// Note [Pooling channels-last on the CPU]
//   A channels-last input (suggest_memory_format) gets a channels-last output, max pooling's
//   indices too, and the backwards allocate dx in the format they are given (autograd passes
//   the forward input's). Those cases run their own loops over [N, H, W, C] memory: the forward
//   walks each output pixel's window once with the channels innermost (unit stride in x, the
//   output and the indices), threads taking output rows (n, oh); the backward zeroes dx and
//   scatters output pixel by output pixel, threads taking (image, block of kChannelBlock
//   channels) so that no two write the same dx element. Each channel sees the same comparisons
//   and the same additions in the same order as in the NCHW loops (windows row by row, dx
//   contributions in ascending (oh, ow)), so both formats give the same bits.
constexpr int64_t kChannelBlock = 64;

// The (image, channel range) of a channels-last backward unit.
struct ChannelUnit {
  int64_t n, c0, c1;
};
ChannelUnit channel_unit(int64_t unit, int64_t channels) {
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  const int64_t c0 = unit % blocks * kChannelBlock;
  return {unit / blocks, c0, std::min(c0 + kChannelBlock, channels)};
}
int64_t channel_units(int64_t images, int64_t channels) {
  return images * ((channels + kChannelBlock - 1) / kChannelBlock);
}

// Max pooling window of output (oh, ow): rows h0, h0 + dh, ... below h1 and columns w0,
// w0 + dw, ... below w1, starting at the first row and column inside the input.
struct MaxWindow {
  int64_t h0, h1, w0, w1;
};

MaxWindow max_window(const Pool2dGeometry& g, int64_t oh, int64_t ow) {
  MaxWindow win;
  win.h0 = oh * g.stride[0] - g.padding[0];
  win.w0 = ow * g.stride[1] - g.padding[1];
  win.h1 = std::min(win.h0 + (g.kernel[0] - 1) * g.dilation[0] + 1, g.h);
  win.w1 = std::min(win.w0 + (g.kernel[1] - 1) * g.dilation[1] + 1, g.w);
  while (win.h0 < 0) win.h0 += g.dilation[0];
  while (win.w0 < 0) win.w0 += g.dilation[1];
  return win;
}

// Average pooling window [h0, h1) x [w0, w1) of output (oh, ow), clamped to the input, and the
// divisor, as PyTorch: the window size counted up to the padded edge (count_include_pad) or
// the number of input elements it covers.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};

AvgWindow avg_window(const Pool2dGeometry& g, int64_t oh, int64_t ow, bool count_include_pad) {
  AvgWindow win;
  win.h0 = oh * g.stride[0] - g.padding[0];
  win.w0 = ow * g.stride[1] - g.padding[1];
  win.h1 = std::min(win.h0 + g.kernel[0], g.h + g.padding[0]);
  win.w1 = std::min(win.w0 + g.kernel[1], g.w + g.padding[1]);
  const int64_t padded_size = (win.h1 - win.h0) * (win.w1 - win.w0);
  win.h0 = std::max<int64_t>(win.h0, 0), win.w0 = std::max<int64_t>(win.w0, 0);
  win.h1 = std::min(win.h1, g.h), win.w1 = std::min(win.w1, g.w);
  win.divisor = count_include_pad ? padded_size : (win.h1 - win.h0) * (win.w1 - win.w0);
  return win;
}

// max_pool2d of a channels-last x into channels-last out and indices (Note [Pooling
// channels-last on the CPU]): the NCHW loop's window walk with the channels innermost.
void max_pool2d_channels_last(const Tensor& x, const Pool2dGeometry& g, const Tensor& out,
                              const Tensor& indices) {
  const int64_t channels = x.size(1);
  dispatch_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
    const T* src = x.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    int64_t* idx = indices.data_ptr<int64_t>();
    // Plain locals, not structured bindings: the lambda below captures them (clang before 16
    // cannot capture a structured binding).
    const int64_t kh = g.kernel[0], kw = g.kernel[1];
    const int64_t dh = g.dilation[0], dw = g.dilation[1];
    for_units(x.size(0) * g.ho, g.wo * channels * kh * kw, [&](int64_t row) {
      const int64_t n = row / g.ho, oh = row % g.ho;
      const T* image = src + n * g.h * g.w * channels;
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const auto [h0, h1, w0, w1] = max_window(g, oh, ow);
        T* best = dst + (row * g.wo + ow) * channels;
        int64_t* best_index = idx + (row * g.wo + ow) * channels;
        std::fill(best, best + channels, -std::numeric_limits<T>::infinity());
        std::fill(best_index, best_index + channels, h0 < h1 && w0 < w1 ? h0 * g.w + w0 : -1);
        for (int64_t ih = h0; ih < h1; ih += dh) {
          for (int64_t iw = w0; iw < w1; iw += dw) {
            const T* in = image + (ih * g.w + iw) * channels;
            for (int64_t c = 0; c < channels; ++c) {
              if (in[c] > best[c] || std::isnan(in[c])) {
                best[c] = in[c];
                best_index[c] = ih * g.w + iw;
              }
            }
          }
        }
      }
    });
  });
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dGeometry& g) {
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), g.ho, g.wo}, x.dtype(), x.device(), format);
  Tensor indices = empty(out.sizes(), kInt64, x.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    max_pool2d_channels_last(x, g, out, indices);
    return {out, indices};
  }
  const Tensor xc = contiguous(x);
  dispatch_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
    const T* src = xc.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    int64_t* idx = indices.data_ptr<int64_t>();
    // Plain locals, not structured bindings: the lambda below captures them (clang before 16
    // cannot capture a structured binding).
    const int64_t kh = g.kernel[0], kw = g.kernel[1];
    const int64_t dh = g.dilation[0], dw = g.dilation[1];
    for_units(g.planes, g.ho * g.wo * kh * kw, [&](int64_t plane) {
      const T* in = src + plane * g.h * g.w;
      T* o = dst + plane * g.ho * g.wo;
      int64_t* oi = idx + plane * g.ho * g.wo;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const auto [h0, h1, w0, w1] = max_window(g, oh, ow);
          // -inf and index -1 only for a window that holds no input (the backward skips it).
          T best = -std::numeric_limits<T>::infinity();
          int64_t best_index = h0 < h1 && w0 < w1 ? h0 * g.w + w0 : -1;
          for (int64_t ih = h0; ih < h1; ih += dh) {
            for (int64_t iw = w0; iw < w1; iw += dw) {
              const T v = in[ih * g.w + iw];
              if (v > best || std::isnan(v)) {  // NaN propagates, as PyTorch
                best = v;
                best_index = ih * g.w + iw;
              }
            }
          }
          o[oh * g.wo + ow] = best;
          oi[oh * g.wo + ow] = best_index;
        }
      }
    });
  });
  return {out, indices};
}

namespace {

// max_pool2d_backward into a channels-last dx (Note [Pooling channels-last on the CPU]).
void max_pool2d_backward_channels_last(const Tensor& dout, const Tensor& indices,
                                       const Tensor& dx) {
  const Tensor dc = contiguous(dout, MemoryFormat::kChannelsLast);
  const Tensor ic = contiguous(indices, MemoryFormat::kChannelsLast);
  const int64_t channels = dx.size(1), in_plane = dx.size(2) * dx.size(3);
  const int64_t out_plane = dout.size(2) * dout.size(3);
  dispatch_floating(dout.dtype(), "max_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    const int64_t* idx = ic.data_ptr<int64_t>();
    T* d = dx.data_ptr<T>();
    for_units(channel_units(dx.size(0), channels),
              (in_plane + out_plane) * std::min(channels, kChannelBlock), [&](int64_t unit) {
                const auto [n, c0, c1] = channel_unit(unit, channels);
                T* dimage = d + n * in_plane * channels;
                for (int64_t p = 0; p < in_plane; ++p)
                  std::fill(dimage + p * channels + c0, dimage + p * channels + c1, T(0));
                for (int64_t o = n * out_plane; o < (n + 1) * out_plane; ++o) {
                  for (int64_t c = c0; c < c1; ++c) {
                    const int64_t at = idx[o * channels + c];
                    if (at >= 0 && at < in_plane) dimage[at * channels + c] += dy[o * channels + c];
                  }
                }
              });
  });
}

}  // namespace

// dx: each output's gradient added at the input position of its maximum.
Tensor max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat format) {
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    max_pool2d_backward_channels_last(dout, indices, dx);
    return dx;
  }
  const Tensor dc = contiguous(dout), ic = contiguous(indices);
  const int64_t planes = x_shape[0] * x_shape[1], in_plane = x_shape[2] * x_shape[3];
  const int64_t out_plane = dout.size(2) * dout.size(3);
  dispatch_floating(dout.dtype(), "max_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    const int64_t* idx = ic.data_ptr<int64_t>();
    T* d = dx.data_ptr<T>();
    for_units(planes, in_plane + out_plane, [&](int64_t plane) {
      T* dplane = d + plane * in_plane;
      std::fill(dplane, dplane + in_plane, T(0));
      for (int64_t i = plane * out_plane; i < (plane + 1) * out_plane; ++i)
        if (idx[i] >= 0 && idx[i] < in_plane) dplane[idx[i]] += dy[i];
    });
  });
  return dx;
}

namespace {

// avg_pool2d of a channels-last x into a channels-last out (Note [Pooling channels-last on the
// CPU]): each output pixel's channels sum in place, window row by row, then divide.
void avg_pool2d_channels_last(const Tensor& x, const Pool2dGeometry& g, bool count_include_pad,
                              const Tensor& out) {
  const int64_t channels = x.size(1);
  dispatch_floating(x.dtype(), "avg_pool2d", [&]<typename T>() {
    const T* src = x.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    for_units(x.size(0) * g.ho, g.wo * channels * g.kernel[0] * g.kernel[1], [&](int64_t row) {
      const int64_t n = row / g.ho, oh = row % g.ho;
      const T* image = src + n * g.h * g.w * channels;
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
        T* sum = dst + (row * g.wo + ow) * channels;
        std::fill(sum, sum + channels, T(0));
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) {
            const T* in = image + (ih * g.w + iw) * channels;
            for (int64_t c = 0; c < channels; ++c) sum[c] += in[c];
          }
        }
        const bool covers = win.divisor > 0 && win.h0 < win.h1 && win.w0 < win.w1;
        for (int64_t c = 0; c < channels; ++c)
          sum[c] = covers ? sum[c] / static_cast<T>(win.divisor) : T(0);
      }
    });
  });
}

}  // namespace

Tensor avg_pool2d(const Tensor& x, const Pool2dGeometry& g, bool count_include_pad) {
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), g.ho, g.wo}, x.dtype(), x.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    avg_pool2d_channels_last(x, g, count_include_pad, out);
    return out;
  }
  const Tensor xc = contiguous(x);
  dispatch_floating(x.dtype(), "avg_pool2d", [&]<typename T>() {
    const T* src = xc.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    for_units(g.planes, g.ho * g.wo * g.kernel[0] * g.kernel[1], [&](int64_t plane) {
      const T* in = src + plane * g.h * g.w;
      T* o = dst + plane * g.ho * g.wo;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
          T sum = 0;
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += in[ih * g.w + iw];
          o[oh * g.wo + ow] = win.divisor > 0 && win.h0 < win.h1 && win.w0 < win.w1
                                  ? sum / static_cast<T>(win.divisor)
                                  : T(0);
        }
      }
    });
  });
  return out;
}

namespace {

// avg_pool2d_backward into a channels-last dx (Note [Pooling channels-last on the CPU]).
void avg_pool2d_backward_channels_last(const Tensor& dout, const Pool2dGeometry& g,
                                       bool count_include_pad, const Tensor& dx) {
  const Tensor dc = contiguous(dout, MemoryFormat::kChannelsLast);
  const int64_t channels = dx.size(1);
  dispatch_floating(dout.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    T* d = dx.data_ptr<T>();
    const int64_t work =
        g.ho * g.wo * g.kernel[0] * g.kernel[1] * std::min(channels, kChannelBlock);
    for_units(channel_units(dx.size(0), channels), work, [&](int64_t unit) {
      const auto [n, c0, c1] = channel_unit(unit, channels);
      T* dimage = d + n * g.h * g.w * channels;
      const T* dyimage = dy + n * g.ho * g.wo * channels;
      for (int64_t p = 0; p < g.h * g.w; ++p)
        std::fill(dimage + p * channels + c0, dimage + p * channels + c1, T(0));
      T share[kChannelBlock];
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
          if (win.divisor <= 0) continue;
          const T* dyo = dyimage + (oh * g.wo + ow) * channels;
          for (int64_t c = c0; c < c1; ++c) share[c - c0] = dyo[c] / static_cast<T>(win.divisor);
          for (int64_t ih = win.h0; ih < win.h1; ++ih) {
            for (int64_t iw = win.w0; iw < win.w1; ++iw) {
              T* dp = dimage + (ih * g.w + iw) * channels;
              for (int64_t c = c0; c < c1; ++c) dp[c] += share[c - c0];
            }
          }
        }
      }
    });
  });
}

}  // namespace

// dx[i] = sum over the windows w holding i of dout[w] / divisor(w)
Tensor avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, const Pool2dGeometry& g,
                           bool count_include_pad, MemoryFormat format) {
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    avg_pool2d_backward_channels_last(dout, g, count_include_pad, dx);
    return dx;
  }
  const Tensor dc = contiguous(dout);
  dispatch_floating(dout.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    T* d = dx.data_ptr<T>();
    for_units(g.planes, g.ho * g.wo * g.kernel[0] * g.kernel[1], [&](int64_t plane) {
      T* dplane = d + plane * g.h * g.w;
      const T* dyp = dy + plane * g.ho * g.wo;
      std::fill(dplane, dplane + g.h * g.w, T(0));
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const AvgWindow win = avg_window(g, oh, ow, count_include_pad);
          if (win.divisor <= 0) continue;
          const T share = dyp[oh * g.wo + ow] / static_cast<T>(win.divisor);
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) dplane[ih * g.w + iw] += share;
        }
      }
    });
  });
  return dx;
}

namespace {

// Adaptive pooling's window along one dim: [floor(i in / out), ceil((i+1) in / out)).
inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return i * in / out; }
inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

// adaptive_avg_pool2d of a channels-last x into a channels-last out (Note [Pooling
// channels-last on the CPU]): each output pixel's channels sum in place, then divide.
void adaptive_avg_pool2d_channels_last(const Tensor& x, Pair output_size, const Tensor& out) {
  const int64_t ho = output_size[0], wo = output_size[1];  // captured: no structured binding
  const int64_t h = x.size(2), w = x.size(3), channels = x.size(1);
  dispatch_floating(x.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    const T* src = x.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    for_units(x.size(0) * ho, (h * w / ho + wo) * channels, [&](int64_t row) {
      const int64_t n = row / ho, oh = row % ho;
      const T* image = src + n * h * w * channels;
      const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
      for (int64_t ow = 0; ow < wo; ++ow) {
        const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
        T* sum = dst + (row * wo + ow) * channels;
        std::fill(sum, sum + channels, T(0));
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) {
            const T* in = image + (ih * w + iw) * channels;
            for (int64_t c = 0; c < channels; ++c) sum[c] += in[c];
          }
        }
        const T count = static_cast<T>((h1 - h0) * (w1 - w0));
        for (int64_t c = 0; c < channels; ++c) sum[c] = sum[c] / count;
      }
    });
  });
}

// adaptive_avg_pool2d_backward into a channels-last dx (Note [Pooling channels-last on the
// CPU]).
void adaptive_avg_pool2d_backward_channels_last(const Tensor& dout, const Tensor& dx) {
  const Tensor dc = contiguous(dout, MemoryFormat::kChannelsLast);
  const int64_t channels = dx.size(1), h = dx.size(2), w = dx.size(3);
  const int64_t ho = dout.size(2), wo = dout.size(3);
  dispatch_floating(dout.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    T* d = dx.data_ptr<T>();
    for_units(channel_units(dx.size(0), channels),
              (h * w + ho * wo) * std::min(channels, kChannelBlock), [&](int64_t unit) {
                const auto [n, c0, c1] = channel_unit(unit, channels);
                T* dimage = d + n * h * w * channels;
                const T* dyimage = dy + n * ho * wo * channels;
                for (int64_t p = 0; p < h * w; ++p)
                  std::fill(dimage + p * channels + c0, dimage + p * channels + c1, T(0));
                T share[kChannelBlock];
                for (int64_t oh = 0; oh < ho; ++oh) {
                  const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
                  for (int64_t ow = 0; ow < wo; ++ow) {
                    const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
                    const T count = static_cast<T>((h1 - h0) * (w1 - w0));
                    const T* dyo = dyimage + (oh * wo + ow) * channels;
                    for (int64_t c = c0; c < c1; ++c) share[c - c0] = dyo[c] / count;
                    for (int64_t ih = h0; ih < h1; ++ih) {
                      for (int64_t iw = w0; iw < w1; ++iw) {
                        T* dp = dimage + (ih * w + iw) * channels;
                        for (int64_t c = c0; c < c1; ++c) dp[c] += share[c - c0];
                      }
                    }
                  }
                }
              });
  });
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  const int64_t ho = output_size[0], wo = output_size[1];  // captured: no structured binding
  const int64_t h = x.size(2), w = x.size(3), planes = x.size(0) * x.size(1);
  const MemoryFormat format = suggest_memory_format(x);
  Tensor out = empty({x.size(0), x.size(1), ho, wo}, x.dtype(), x.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    adaptive_avg_pool2d_channels_last(x, output_size, out);
    return out;
  }
  const Tensor xc = contiguous(x);
  dispatch_floating(x.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    const T* src = xc.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    for_units(planes, h * w + ho * wo, [&](int64_t plane) {
      const T* in = src + plane * h * w;
      T* o = dst + plane * ho * wo;
      for (int64_t oh = 0; oh < ho; ++oh) {
        const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
        for (int64_t ow = 0; ow < wo; ++ow) {
          const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
          T sum = 0;
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) sum += in[ih * w + iw];
          o[oh * wo + ow] = sum / static_cast<T>((h1 - h0) * (w1 - w0));
        }
      }
    });
  });
  return out;
}

// dx[i] = sum over the cells c whose window holds i of dout[c] / |window(c)|
Tensor adaptive_avg_pool2d_backward(const Tensor& dout, const Shape& x_shape, MemoryFormat format) {
  const int64_t h = x_shape[2], w = x_shape[3], ho = dout.size(2), wo = dout.size(3);
  const int64_t planes = x_shape[0] * x_shape[1];
  Tensor dx = empty(x_shape, dout.dtype(), dout.device(), format);
  if (format == MemoryFormat::kChannelsLast) {
    adaptive_avg_pool2d_backward_channels_last(dout, dx);
    return dx;
  }
  const Tensor dc = contiguous(dout);
  dispatch_floating(dout.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    const T* dy = dc.data_ptr<T>();
    T* d = dx.data_ptr<T>();
    for_units(planes, h * w + ho * wo, [&](int64_t plane) {
      T* dplane = d + plane * h * w;
      const T* dyp = dy + plane * ho * wo;
      std::fill(dplane, dplane + h * w, T(0));
      for (int64_t oh = 0; oh < ho; ++oh) {
        const int64_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
        for (int64_t ow = 0; ow < wo; ++ow) {
          const int64_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
          const T share = dyp[oh * wo + ow] / static_cast<T>((h1 - h0) * (w1 - w0));
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) dplane[ih * w + iw] += share;
        }
      }
    });
  });
  return dx;
}

}  // namespace loom::cpu
