// tensor/cpu/winograd.h — Winograd convolution for 3x3, stride-1, dilation-1, ungrouped float32
// layers (most of ResNet-18's FLOPs): forward, backward-data and backward-weight on raw NCHW
// buffers, each a set of GEMMs per frequency between small tile transforms. The algorithm and its
// accuracy are Note [Winograd convolution] and the notes after it in tensor/cpu/winograd.cpp.
#pragma once

#include <cstdint>
#include <iosfwd>

namespace loom::cpu {

// The output tile: F(m x m, 3x3) computes m x m outputs from an (m+2) x (m+2) input tile with
// (m+2)^2 multiplies, against 9 m^2 for the direct loop (Note [Winograd convolution]).
enum class WinogradTile {
  kF2x2,  // F(2x2,3x3): 16 multiplies per 4 outputs instead of 36 (2.25x); errors as direct
  kF4x4,  // F(4x4,3x3): 36 per 16 instead of 144 (4x); errors a few times larger
};

// The shape of a 3x3 convolution: x [N, C, H, W], weight [K, C, 3, 3], y [N, K, Ho, Wo], with
// pad_h rows and pad_w columns of zeros on each side of x. All float32; the weight contiguous,
// the images (x, y and their gradients) contiguous NCHW, or with channels_last dense NHWC
// (memory order [N, H, W, C]; Note [Winograd in channels-last]).
struct WinogradShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // x
  int64_t k = 0;                       // output channels
  int64_t pad_h = 0, pad_w = 0;        // 0, 1 or 2
  bool channels_last = false;
  int64_t ho() const { return h + 2 * pad_h - 2; }
  int64_t wo() const { return w + 2 * pad_w - 2; }
};

// Prints "x=[N, C, H, W] weight=[K, C, 3, 3] padding=(ph, pw)", and " channels-last" where it
// is (for error messages).
std::ostream& operator<<(std::ostream& os, const WinogradShape& shape);

// All three check the shape (ValueError naming the function and the shape unless the padding is
// 0..2 and the output at least 1x1) and overwrite their output. tiles_per_block bounds the
// scratch memory: tiles are transformed and multiplied that many at a time (0: chosen from the
// channel counts, a few hundred; tests pass small values to exercise partial blocks).

// y[n,k,i,j] = sum_{c,r,s} x[n,c,i+r-pad_h,j+s-pad_w] weight[k,c,r,s] (zero padding; PyTorch's
// conv2d, a cross-correlation).
void winograd_conv2d(const WinogradShape& shape, WinogradTile tile, const float* x,
                     const float* weight, float* y, int64_t tiles_per_block = 0);

// dx[n,c,i,j] = sum_{k,r,s} dy[n,k,i-r+pad_h,j-s+pad_w] weight[k,c,r,s] (dy zero outside).
void winograd_conv2d_backward_data(const WinogradShape& shape, WinogradTile tile, const float* dy,
                                   const float* weight, float* dx, int64_t tiles_per_block = 0);

// dweight[k,c,r,s] = sum_{n,i,j} dy[n,k,i,j] x[n,c,i+r-pad_h,j+s-pad_w].
void winograd_conv2d_backward_weight(const WinogradShape& shape, WinogradTile tile, const float* x,
                                     const float* dy, float* dweight, int64_t tiles_per_block = 0);

}  // namespace loom::cpu
