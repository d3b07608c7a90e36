// tensor/cpu/conv_direct.h — direct 3x3 convolution (stride 1 or 2, one pixel of zero padding)
// on NCHW float32 for layers with few channels, where a GEMM on the patches spends its time
// packing them: forward, backward-data and backward-weight with AVX-512 or AVX2 register tiles
// that read a zero-padded copy of the image in place (Note [Direct 3x3 convolution] and Note
// [Stride 2 in phases] in conv_direct.cpp).
#pragma once

#include <cstdint>
#include <iosfwd>

namespace loom::cpu {

// x [N, C, H, W], weight [O, C, 3, 3], y [N, O, H / stride, W / stride]; all contiguous float32.
struct DirectShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // x
  int64_t o = 0;                       // output channels
  int64_t stride = 1;                  // 1 or 2 (then H and W even)
};

// "x=[N, C, H, W] weight=[O, C, 3, 3]", and " stride 2" where it is (for error messages).
std::ostream& operator<<(std::ostream& os, const DirectShape& shape);

// Whether the functions below run this shape here: the instruction set in use (cpu_isa()) is
// AVX-512 and the output's width a multiple of 16, or AVX2 (with the build's baseline) and a
// multiple of 8 (a row is whole vectors), or AVX-512 and the width in {2, 4, 8} with the output's
// plane a multiple of 16 pixels (a vector is whole rows); C and O are multiples of 8 and at most
// kDirectMaxChannels; N, H >= 1; stride 1, or 2 with H and W even (the output H/2 x W/2).
constexpr int64_t kDirectMaxChannels = 128;
bool direct_conv3x3_fits(const DirectShape& shape);

// Whether the direct kernels beat the packed GEMM on this shape's forward, or its backward-data
// (backward; the weight gradient is direct_weight_grad_pays), as measured on the AVX-512 path:
// at stride 1 wherever they fit; at stride 2 on output rows of whole vectors up to 32 x 32
// channels, and the forward on narrow rows (docs/cpu_speed.md). conv2d's kAuto takes them there,
// but for the layers where Winograd F(4x4) is faster still (128 channels either side; Note
// [Winograd in kAuto] in tensor/cpu/conv.cpp). The AVX2 tiles tied the packed engine's AVX2
// kernels: kBenchmark races them.
bool direct_conv3x3_pays(const DirectShape& shape, bool backward = false);

// Whether direct_conv3x3_backward_weight pays on this shape: on output rows of whole vectors,
// where its per-thread lane sums (O C 9 floats per lane) fit in an L2 cache, up to 32 x 32
// channels. Past that, and on narrow rows, the packed GEMM was as fast or faster (Note [Direct
// 3x3 convolution], Note [Narrow rows]), and conv2d uses it instead.
bool direct_weight_grad_pays(const DirectShape& shape);

// Each raises ValueError naming itself and the shape where direct_conv3x3_fits is false, and
// overwrites its output.

// With t = stride:
// y[n,o,i,j] = sum_{c,r,s} x[n,c,t i+r-1,t j+s-1] weight[o,c,r,s] (x zero outside).
void direct_conv3x3(const DirectShape& shape, const float* x, const float* weight, float* y);

// dx[n,c,a,b] = sum of dy[n,o,i,j] weight[o,c,r,s] over the o, r, s, i, j with t i+r-1 = a and
// t j+s-1 = b.
void direct_conv3x3_backward_data(const DirectShape& shape, const float* dy, const float* weight,
                                  float* dx);

// dweight[o,c,r,s] = sum_{n,i,j} dy[n,o,i,j] x[n,c,t i+r-1,t j+s-1].
void direct_conv3x3_backward_weight(const DirectShape& shape, const float* x, const float* dy,
                                    float* dweight);

}  // namespace loom::cpu
