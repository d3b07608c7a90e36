// tensor/cpu/conv_direct_tiles.h — the register tiles of the direct 3x3 convolution, written once
// over a vector type. conv_direct.cpp includes this file once per instruction set, each time
// inside a namespace and a target region of its own, after defining there `Vec`:
//   Vec::V                    the register type; Vec::lanes its floats
//   Vec::out_block            forward: output channels per tile (Note [Direct 3x3 convolution])
//   Vec::grad_out             backward-weight: output channels per tile
//   load, store (unaligned), broadcast, fma (a * b + c), zero
//   deinterleave(p, even, odd)  even, odd = p[0, 2, 4, ...], p[1, 3, 5, ...] (2 lanes floats)
//   interleave(even, odd, p)    the reverse
// and, from the enclosing namespace, Padded, Taps and TapTable; it ends with Tiles, the bundle
// the drivers take. So it has no include guard.

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

// Copies `count` samples [C, H, W] into dst as stride 2's phase planes (Note [Stride 2 in
// phases]), whose zeros (the first row of each plane; on wide rows also the first column, on
// narrow ones the first column of the s = 0 copy) the caller wrote once: x[2a + p, 2b + q] goes
// to row a + 1 of plane (p, q), column b + 1, or on narrow rows to column b of the copies that
// read it (q = 0: s = 1; q = 1: s = 2, and s = 0 one column right).
inline void pad_phases(const float* x, int64_t count, const Padded& pad, float* dst) {
  const int64_t p = pad.h * pad.w;
  for (int64_t i = 0; i < count * pad.c; ++i) {
    const float* from = x + i * p;
    float* to = dst + i * pad.plane;
    for (int64_t row = 0; row < pad.h; ++row) {
      const int64_t phase = row % 2;
      const float* in = from + row * pad.w;
      float* out = to + (row / 2 + 1) * pad.wp;
      if (!pad.narrow) {
        float* even = out + 2 * phase * pad.tap + 1;
        float* odd = even + pad.tap;
        for (int64_t j = 0; j < pad.wo; j += Vec::lanes) {
          typename Vec::V e, o;
          Vec::deinterleave(in + 2 * j, e, o);
          Vec::store(even + j, e);
          Vec::store(odd + j, o);
        }
        continue;
      }
      float* left = out + 3 * phase * pad.tap;  // s = 0
      float *middle = left + pad.tap, *right = middle + pad.tap;
      for (int64_t b = 0; b < pad.wo; ++b) middle[b] = in[2 * b], right[b] = in[2 * b + 1];
      for (int64_t b = 1; b < pad.wo; ++b) left[b] = in[2 * b - 1];
    }
  }
}

// dx [C, 2 ho, 2 wo] of `count` samples from their phases [C, 4, ho wo] (Note [Stride 2 in
// phases]): row 2a + p interleaves the rows a of phases (p, 0) and (p, 1).
inline void interleave_phases(const float* phases, int64_t count, int64_t c, int64_t ho, int64_t wo,
                              float* dx) {
  const int64_t p = ho * wo;
  for (int64_t i = 0; i < count * c; ++i) {
    const float* from = phases + i * 4 * p;
    float* to = dx + i * 4 * p;
    for (int64_t row = 0; row < 2 * ho; ++row) {
      const float* even = from + 2 * (row % 2) * p + row / 2 * wo;
      const float* odd = even + p;
      float* out = to + row * 2 * wo;
      int64_t b = 0;
      for (; b + Vec::lanes <= wo; b += Vec::lanes)
        Vec::interleave(Vec::load(even + b), Vec::load(odd + b), out + 2 * b);
      for (; b < wo; ++b) out[2 * b] = even[b], out[2 * b + 1] = odd[b];
    }
  }
}

// Where tap (r, s) of a vector is, from the vector's own position in its padded planes: on wide
// rows r rows and s columns on, on narrow ones r rows on in copy s (Note [Narrow rows]); both
// fixed at compile time, so that the offsets sit in the instructions. kTable layouts read a
// TapTable instead.
template <Taps L>
int64_t tap_offset(int r, int s, const Padded& pad) {
  static_assert(L != Taps::kTable);
  return r * pad.wp + (L == Taps::kNarrow ? s * pad.tap : s);
}

// y (R vectors of output channels [ob, ob + out_block)) = the taps of xp. in_at[v]: where
// vector v's pixels are in the padded planes of channel 0; out_at[v]: where they are in output
// channel ob; wb: the packed weights of the block, [C, 9, out_block]. With kTable, the taps are
// table's (their offsets, and which of the 9 packed weights each takes); else all nine, at
// tap_offset.
template <int R, Taps L>
void forward_tile(const float* xp, const float* wb, const Padded& pad, const TapTable& table,
                  const int64_t* in_at, float* const* out_at, int64_t out_plane) {
  constexpr int kOut = Vec::out_block;
  typename Vec::V acc[kOut][R];
  for (auto& row : acc)
    for (auto& v : row) v = Vec::zero();
  const auto products = [&](const float* at, const float* taps) {
    typename Vec::V in[R];
    for (int v = 0; v < R; ++v) in[v] = Vec::load(at + in_at[v]);
#pragma GCC unroll 8
    for (int o = 0; o < kOut; ++o) {
      const typename Vec::V weight = Vec::broadcast(taps[o]);
      for (int v = 0; v < R; ++v) acc[o][v] = Vec::fma(weight, in[v], acc[o][v]);
    }
  };
  for (int64_t c = 0; c < pad.c; ++c) {
    const float* plane = xp + c * pad.plane;
    const float* wc = wb + c * 9 * kOut;
    if constexpr (L == Taps::kTable) {
      for (int t = 0; t < table.count; ++t)
        products(plane + table.offset[t], wc + table.weight[t] * kOut);
    } else {
      for (int r = 0; r < 3; ++r) {
#pragma GCC unroll 3
        for (int s = 0; s < 3; ++s)
          products(plane + tap_offset<L>(r, s, pad), wc + (r * 3 + s) * kOut);
      }
    }
  }
  for (int o = 0; o < kOut; ++o)
    for (int v = 0; v < R; ++v) Vec::store(out_at[v] + o * out_plane, acc[o][v]);
}

// The lanes' partial sums acc_mem [O, C, 9, lanes] of output channels [0, grad_out), input
// channels [0, 2) and row tap r, plus the products of `count` samples: dy [O, ho, wo] and the
// padded images xp, dy_sample and pad.sample floats apart. Taps as forward_tile's; kTable reads
// the table's entries r * 3 + s (stride 2's nine taps).
template <Taps L>
void weight_tile(const float* dy, int64_t dy_sample, const float* xp, const Padded& pad,
                 const TapTable& table, int64_t count, int r, float* acc_mem, int64_t c_total) {
  constexpr int kOut = Vec::grad_out, kIn = 2;
  constexpr int64_t kLanes = Vec::lanes;
  const int64_t out_row = c_total * 9 * kLanes;  // acc_mem's stride between output channels
  typename Vec::V acc[kOut][kIn][3];
  for (int o = 0; o < kOut; ++o)
    for (int c = 0; c < kIn; ++c)
      for (int s = 0; s < 3; ++s)
        acc[o][c][s] = Vec::load(acc_mem + o * out_row + (c * 9 + r * 3 + s) * kLanes);
  int64_t offset[3];
  for (int s = 0; s < 3; ++s) offset[s] = L == Taps::kTable ? table.offset[r * 3 + s] : r * pad.wp;
  // A vector is kLanes pixels of one row, or of kLanes / wo narrow rows.
  const int64_t p = pad.ho * pad.wo, row_step = std::max<int64_t>(1, kLanes / pad.wo);
  const int64_t col_step = std::min(kLanes, pad.wo);
  const auto products = [&](const float* d, const float* x, int64_t i, int64_t j) {
    typename Vec::V grad[kOut];
    for (int o = 0; o < kOut; ++o) grad[o] = Vec::load(d + o * p + i * pad.wo + j);
#pragma GCC unroll 3
    for (int s = 0; s < 3; ++s)
#pragma GCC unroll 2
      for (int c = 0; c < kIn; ++c) {
        const float* at = x + c * pad.plane + i * pad.wp + j + offset[s];
        typename Vec::V in;
        if constexpr (L == Taps::kTable)
          in = Vec::load(at);
        else
          in = Vec::load(at + (L == Taps::kNarrow ? s * pad.tap : s));
        for (int o = 0; o < kOut; ++o) acc[o][c][s] = Vec::fma(grad[o], in, acc[o][c][s]);
      }
  };
  // Rows of one or two vectors run down each column of vectors: along a row, the loop would
  // end every one or two steps (0.85-0.93 of the time with 16 to 32 channels on rows of 16 and
  // 32 pixels; 1.04-1.07 on rows of 64, where the rows stay).
  const bool by_columns = pad.wo / col_step <= 2;
  for (int64_t n = 0; n < count; ++n) {
    const float* d = dy + n * dy_sample;
    const float* x = xp + n * pad.sample;
    if (by_columns) {
      for (int64_t j = 0; j < pad.wo; j += col_step)
        for (int64_t i = 0; i < pad.ho; i += row_step) products(d, x, i, j);
    } else {
      for (int64_t i = 0; i < pad.ho; i += row_step)
        for (int64_t j = 0; j < pad.wo; j += col_step) products(d, x, i, j);
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
  template <int R, Taps L>
  static constexpr auto forward = &forward_tile<R, L>;
  template <Taps L>
  static constexpr auto weight = &weight_tile<L>;
  static constexpr auto fill = &pad_images;
  static constexpr auto fill_phases = &pad_phases;
  static constexpr auto interleave = &interleave_phases;
};
