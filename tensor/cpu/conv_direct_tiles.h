// tensor/cpu/conv_direct_tiles.h — the register tiles of the direct 3x3 convolution, written once
// over a vector type. conv_direct.cpp includes this file once per instruction set, each time
// inside a namespace and a target region of its own, after defining there `Vec`:
//   Vec::V                    the register type; Vec::lanes its floats
//   Vec::out_block            forward: output channels per tile (Note [Direct 3x3 convolution])
//   Vec::grad_out             backward-weight: output channels per tile
//   load, store (unaligned), broadcast, fma (a * b + c), zero
//   Vec::Mask, load_masked(p, mask)   a load with the lanes off in mask zero (AVX-512); AVX2's
//                                     ignores the mask, and is given only full ones
// and, from the enclosing namespace, Padded; it ends with Tiles, the bundle the drivers take. So
// it has no include guard.

// Copies `count` samples [C, H, W] (consecutive in x) into the interiors of dst, padded images
// whose borders the caller zeroed once: row by row where rows are whole vectors, a plane at a
// time where they are narrow (no side columns: the plane's interior is contiguous, and whole
// vectors). One load and store per vector, where memcpy would be a call per row.
inline void pad_images(const float* x, int64_t count, const Padded& pad, float* dst) {
  const int64_t p = pad.h * pad.w;
  for (int64_t i = 0; i < count * pad.c; ++i) {
    float* to = dst + i * pad.plane + pad.wp + pad.left;
    if (pad.left == 0) {
      for (int64_t j = 0; j < p; j += Vec::lanes) Vec::store(to + j, Vec::load(x + i * p + j));
      continue;
    }
    for (int64_t row = 0; row < pad.h; ++row) {
      const float* from = x + i * p + row * pad.w;
      for (int64_t j = 0; j < pad.w; j += Vec::lanes)
        Vec::store(to + row * pad.wp + j, Vec::load(from + j));
    }
  }
}

// The input vector of tap (r, s) at p (p: the vector's own position, shifted by pad.left - 1,
// plus r rows): the side taps s = 0 and 2 masked by edge[0] and edge[1] (Note [Narrow rows]).
// Where rows are whole vectors (not Narrow) no lane needs masking, and the loads are plain. The
// callers unroll their loops over s, so the choice is made at compile time.
template <bool Narrow>
typename Vec::V tap_load(const float* p, int s, const typename Vec::Mask* edge) {
  if (!Narrow || s == 1) return Vec::load(p + s);
  return Vec::load_masked(p + s, edge[s / 2]);
}

// y (R vectors of output channels [ob, ob + out_block)) = the taps of xp. in_at[v]: where
// vector v's pixels are in the padded planes of channel 0, shifted by pad.left - 1 (so that tap
// (r, s) is at in_at[v] + r pad.wp + s); out_at[v]: where they are in output channel ob; wb: the
// packed weights of the block, [C, 9, out_block]; edge: the side taps' masks.
template <int R, bool Narrow>
void forward_tile(const float* xp, const float* wb, const Padded& pad, const int64_t* in_at,
                  float* const* out_at, int64_t out_plane, const typename Vec::Mask* edge) {
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
        for (int v = 0; v < R; ++v)
          in[v] = tap_load<Narrow>(plane + in_at[v] + r * pad.wp, s, edge);
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
// channels [0, 2) and row tap r, plus the products of `count` samples: dy [O, H, W] and xp
// [C, H+2, W + 2 pad.left] per sample, dy_sample and pad.sample floats apart; edge: the side
// taps' masks.
template <bool Narrow>
void weight_tile(const float* dy, int64_t dy_sample, const float* xp, const Padded& pad,
                 int64_t count, int64_t r, float* acc_mem, int64_t c_total,
                 const typename Vec::Mask* edge) {
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
    const float* x = xp + n * pad.sample + r * pad.wp + pad.left - 1;
    for (int64_t i = 0; i < pad.h; i += row_step)
      for (int64_t j = 0; j < pad.w; j += col_step) {
        typename Vec::V grad[kOut];
        for (int o = 0; o < kOut; ++o) grad[o] = Vec::load(d + o * p + i * pad.w + j);
#pragma GCC unroll 3
        for (int s = 0; s < 3; ++s)
#pragma GCC unroll 2
          for (int c = 0; c < kIn; ++c) {
            const typename Vec::V in =
                tap_load<Narrow>(x + c * pad.plane + i * pad.wp + j, s, edge);
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
