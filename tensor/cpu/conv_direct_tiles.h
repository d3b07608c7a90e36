// tensor/cpu/conv_direct_tiles.h — the register tiles of the direct 3x3 convolution, written once
// over a vector type. conv_direct.cpp includes this file once per instruction set, each time
// inside a namespace and a target region of its own, after defining there `Vec`:
//   Vec::V                    the register type; Vec::lanes its floats
//   Vec::out_block            forward: output channels per tile (Note [Direct 3x3 convolution])
//   Vec::grad_out             backward-weight: output channels per tile
//   load, store (unaligned), broadcast, fma (a * b + c), zero
// and, from the enclosing namespace, Padded; it ends with Tiles, the bundle the drivers take. So
// it has no include guard.

// Copies `count` samples [C, H, W] (consecutive in x) into dst, padded images (Padded) whose
// zeros the caller wrote once: rows of whole vectors one load and store per vector (where memcpy
// would be a call per row); narrow rows into their three shifted planes, the columns that fall
// outside left as they are, zero.
inline void pad_images(const float* x, int64_t count, const Padded& pad, float* dst) {
  const int64_t p = pad.h * pad.w;
  for (int64_t i = 0; i < count * pad.c; ++i) {
    const float* from = x + i * p;
    float* to = dst + i * pad.plane + pad.wp;  // row 1
    if (pad.narrow) {
      for (int64_t j = 0; j < p; j += Vec::lanes)  // s = 1: the plane as it is
        Vec::store(to + pad.tap + j, Vec::load(from + j));
      for (int64_t row = 0; row < pad.h; ++row) {  // s = 0 and 2: one column right and left
        const float* in = from + row * pad.w;
        std::copy(in, in + pad.w - 1, to + row * pad.wp + 1);
        std::copy(in + 1, in + pad.w, to + 2 * pad.tap + row * pad.wp);
      }
      continue;
    }
    for (int64_t row = 0; row < pad.h; ++row)
      for (int64_t j = 0; j < pad.w; j += Vec::lanes)
        Vec::store(to + row * pad.wp + 1 + j, Vec::load(from + row * pad.w + j));
  }
}

// The input vector of tap (r, s) at p (the vector's own position in its padded plane, plus r
// rows): s columns on, or on narrow rows s planes on. Narrow is pad.narrow, fixed at compile time
// so that wide rows keep their taps in the instructions' offsets.
template <bool Narrow>
typename Vec::V tap_load(const float* p, int s, const Padded& pad) {
  return Vec::load(p + (Narrow ? s * pad.tap : s));
}

// y (R vectors of output channels [ob, ob + out_block)) = the taps of xp. in_at[v]: where
// vector v's pixels are in the padded planes of channel 0; out_at[v]: where they are in output
// channel ob; wb: the packed weights of the block, [C, 9, out_block].
template <int R, bool Narrow>
void forward_tile(const float* xp, const float* wb, const Padded& pad, const int64_t* in_at,
                  float* const* out_at, int64_t out_plane) {
  constexpr int kOut = Vec::out_block;
  typename Vec::V acc[kOut][R];
  for (auto& row : acc)
    for (auto& v : row) v = Vec::zero();
  for (int64_t c = 0; c < pad.c; ++c) {
    const float* plane = xp + c * pad.plane;
    const float* wc = wb + c * 9 * kOut;
    for (int64_t r = 0; r < 3; ++r) {
#pragma GCC unroll 3
      for (int s = 0; s < 3; ++s) {
        typename Vec::V in[R];
        for (int v = 0; v < R; ++v) in[v] = tap_load<Narrow>(plane + in_at[v] + r * pad.wp, s, pad);
        const float* taps = wc + (r * 3 + s) * kOut;
#pragma GCC unroll 8
        for (int o = 0; o < kOut; ++o) {
          const typename Vec::V weight = Vec::broadcast(taps[o]);
          for (int v = 0; v < R; ++v) acc[o][v] = Vec::fma(weight, in[v], acc[o][v]);
        }
      }
    }
  }
  for (int o = 0; o < kOut; ++o)
    for (int v = 0; v < R; ++v) Vec::store(out_at[v] + o * out_plane, acc[o][v]);
}

// The lanes' partial sums acc_mem [O, C, 9, lanes] of output channels [0, grad_out), input
// channels [0, 2) and row tap r, plus the products of `count` samples: dy [O, H, W] and the
// padded images xp, dy_sample and pad.sample floats apart.
template <bool Narrow>
void weight_tile(const float* dy, int64_t dy_sample, const float* xp, const Padded& pad,
                 int64_t count, int64_t r, float* acc_mem, int64_t c_total) {
  constexpr int kOut = Vec::grad_out, kIn = 2;
  constexpr int64_t kLanes = Vec::lanes;
  const int64_t out_row = c_total * 9 * kLanes;  // acc_mem's stride between output channels
  typename Vec::V acc[kOut][kIn][3];
  for (int o = 0; o < kOut; ++o)
    for (int c = 0; c < kIn; ++c)
      for (int s = 0; s < 3; ++s)
        acc[o][c][s] = Vec::load(acc_mem + o * out_row + (c * 9 + r * 3 + s) * kLanes);
  // A vector is kLanes pixels of one row, or of kLanes / W narrow rows.
  const int64_t p = pad.h * pad.w, row_step = std::max<int64_t>(1, kLanes / pad.w);
  const int64_t col_step = std::min(kLanes, pad.w);
  for (int64_t n = 0; n < count; ++n) {
    const float* d = dy + n * dy_sample;
    const float* x = xp + n * pad.sample + r * pad.wp;
    for (int64_t i = 0; i < pad.h; i += row_step)
      for (int64_t j = 0; j < pad.w; j += col_step) {
        typename Vec::V grad[kOut];
        for (int o = 0; o < kOut; ++o) grad[o] = Vec::load(d + o * p + i * pad.w + j);
#pragma GCC unroll 3
        for (int s = 0; s < 3; ++s)
#pragma GCC unroll 2
          for (int c = 0; c < kIn; ++c) {
            const typename Vec::V in = tap_load<Narrow>(x + c * pad.plane + i * pad.wp + j, s, pad);
            for (int o = 0; o < kOut; ++o) acc[o][c][s] = Vec::fma(grad[o], in, acc[o][c][s]);
          }
      }
  }
  for (int o = 0; o < kOut; ++o)
    for (int c = 0; c < kIn; ++c)
      for (int s = 0; s < 3; ++s)
        Vec::store(acc_mem + o * out_row + (c * 9 + r * 3 + s) * kLanes, acc[o][c][s]);
}

// This instruction set's tiles, as conv_direct.cpp's drivers take them.
struct Tiles {
  using Traits = Vec;
  template <int R, bool Narrow>
  static constexpr auto forward = &forward_tile<R, Narrow>;
  template <bool Narrow>
  static constexpr auto weight = &weight_tile<Narrow>;
  static constexpr auto fill = &pad_images;
};
