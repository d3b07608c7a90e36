// tensor/cuda/attention.cu — fused scaled dot-product attention on CUDA: FlashAttention-2's
// forward (a block per tile of queries, online softmax over the key tiles) and backward (a block
// per tile of keys, scores recomputed from the saved lse), after Note [Fused attention] in
// tensor/attention.h, whose contract and semantics tensor/cpu/attention.cpp shares. The [L, S]
// scores never reach global memory. Plain float (double) arithmetic on the CUDA cores, no tensor
// cores: written to be read and checked against the CPU first.

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/float16.h"
#include "tensor/cuda/reduce.h"
#include "tensor/dispatch.h"
#include "tensor/philox.h"

namespace loom::cuda {

// Note [CUDA flash attention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Legend: N batch, H heads, L queries, S keys, E the q/k head dim, Ev the v head dim; Br query
// rows and Bc keys per tile; A the accumulation type (float; double for float64 inputs), the
// type of every tile in shared memory (elements are widened as they are loaded).
//
// Online softmax, per query row i, after each key tile with scores s_ij (j in the tile):
//   m_new = max(m, max_j s_ij) ; alpha = exp(m - m_new) ;
//   l = alpha l + sum_j exp(s_ij - m_new) ; o = alpha o + sum_j exp(s_ij - m_new) z_ij v_j
// with m = -inf, l = 0, o = 0 before the first tile, and exp(. - 0) in place of exp(. - m_new)
// while m_new is still -inf (every key so far masked: p = 0, and no -inf - -inf). z_ij is the
// dropout factor (1 without dropout; 0 or 1 / (1 - p)); l sums the undropped weights, so
// out_i = o / l and lse_i = m + log l. l = 0 at the end: a fully masked row, out 0, lse -inf.
//
// Forward, one block of 256 threads (8 warps) per (n, h, tile of Br query rows), Br = Bc = 64
// (32 for double). Shared memory holds Q [Br, E], and in turn each K [Bc, E] and V [Bc, Ev]
// tile. Warp w owns rows w Br/8 .. w Br/8 + Br/8 - 1 of the tile, keeping their m, l and o in
// registers (o: lane t holds dims t, t + 32, t + 64, t + 96). For each key tile:
//   1. scores: lane t computes s for keys t and t + 32 of the tile for each of the warp's rows
//      (register tiling: a K value is loaded once per dim and used for all Br/8 rows);
//   2. the update above, the row max and sum taken across the warp by shuffles;
//   3. o += p v: p_ij is passed from its lane by a shuffle, v_j[d] read from shared memory.
// With is_causal a tile of rows stops at key i_last (keys beyond are all masked).
//
// Backward, after a first kernel takes D_i = dout_i . out_i (a warp per row). One block of 256
// threads per (n, h, tile of Bc keys), Br = 32, Bc = 64 (16 and 32 for double), keeps K and V
// in shared memory and its keys' dk and dv in registers: warp w owns keys w Bc/8 .. + Bc/8 - 1,
// lane t dims t, t + 32, .... It visits every tile of Br query rows (with is_causal from the
// tile holding query j_first), with Q [Br, E], dout [Br, Ev], lse and D in shared memory:
//   1. warp w takes rows w Br/8 .. (lane t keys t, t + 32): s = scale q . k + mask,
//      p = exp(s - lse), dp~ = dout . v, then P~ = p z and dS = p (dp~ z - D) into shared
//      memory [Br, Bc] (z as in the forward; 0 where masked or lse = -inf);
//   2. dv_j += sum_i P~_ij dout_i ; dk_j += scale sum_i dS_ij q_i  (each key's own warp);
//   3. dq_i += scale sum_j dS_ij k_j for the warp's rows, added with atomicAdd to a [N, H, L, E]
//      buffer in A, since every key tile adds to every row; it is converted to dq at the end.
// Each key belongs to one block, so dk and dv are written once, without atomics; dq's atomics
// make its float32 sums' order, and so its last bits, vary between runs.
//
// Shared-memory rows have an odd pitch (E | 1 elements), so that lanes reading one dim of 32
// different keys hit 32 different banks. With E = Ev = 128 a block needs about 97 KB (forward)
// and 113 KB (backward, 105 KB for double): every GPU of compute capability 8.0 and 9.0 gives
// that much; the entries check the device's limit and raise DeviceError where it is smaller.
// Head dims above 128 (kMaxAttentionHeadDim) would need more registers per lane than the
// fixed chunks of 32 dims below give; they raise ValueError.

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 8;
constexpr int kBlockThreads = kWarps * kWarpSize;
constexpr int kDimChunks = kMaxAttentionHeadDim / kWarpSize;  // dims a lane holds: d = t + 32 c
constexpr unsigned kFullMask = 0xffffffffu;

// Tile sizes per accumulation type (Note [CUDA flash attention]): Br query rows and Bc keys.
template <typename A>
struct Tiles;
template <>
struct Tiles<float> {
  static constexpr int kForwardRows = 64, kForwardKeys = 64;
  static constexpr int kBackwardRows = 32, kBackwardKeys = 64;
};
template <>
struct Tiles<double> {
  static constexpr int kForwardRows = 32, kForwardKeys = 32;
  static constexpr int kBackwardRows = 16, kBackwardKeys = 32;
};

__device__ __forceinline__ float dev_exp(float v) { return ::expf(v); }
__device__ __forceinline__ double dev_exp(double v) { return ::exp(v); }
__device__ __forceinline__ float dev_log(float v) { return ::logf(v); }
__device__ __forceinline__ double dev_log(double v) { return ::log(v); }

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const A other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// The sizes of one problem: q [N, H, L, E], k [N, H, S, E], v [N, H, S, Ev].
struct AttentionShape {
  int64_t batch, heads, queries, keys, qk_dim, v_dim;
};

// A [N, H, rows, dims] operand with a unit stride along dims: row i of (n, h) starts at
// data + n batch + h head + i row.
template <typename P>
struct Rows {
  P* data;
  int64_t batch, head, row;
  __device__ __forceinline__ P* at(int64_t n, int64_t h, int64_t i) const {
    return data + n * batch + h * head + i * row;
  }
};

// A [N, H, rows, dims] tensor as Rows: read-only (rows_in) or written (rows_out).
template <typename T>
Rows<const T> rows_in(const Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}
template <typename T>
Rows<T> rows_out(const Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

enum class MaskKind { kNone, kBool, kAdditive };

// What is added to scale q_i . k_j before the softmax: the additive mask (0 without one), or
// -inf where (i, j) lies outside the problem (a tile's padding), above the causal diagonal, or
// false in a boolean mask. The mask is [N, H, L, S] with any strides (0 on broadcast dims).
struct ScoreBias {
  int64_t queries, keys;
  bool causal;
  MaskKind kind;
  const void* mask;
  int64_t stride[4];

  template <typename T>
  __device__ __forceinline__ math_t<T> at(int64_t n, int64_t h, int64_t i, int64_t j) const {
    using A = math_t<T>;
    if (i >= queries || j >= keys || (causal && j > i)) return neg_inf<A>();
    if (kind == MaskKind::kNone) return A(0);
    const int64_t offset = n * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
    if (kind == MaskKind::kBool)
      return static_cast<const uint8_t*>(mask)[offset] != 0 ? A(0) : neg_inf<A>();
    return to_math(static_cast<const T*>(mask)[offset]);
  }
};

// Note [Dropout mask] (tensor/index.h) for element (n, h, i, j) of a row-major [N, H, L, S]
// tensor, idx = ((n H + h) L + i) S + j: kept when the uniform of lane idx % 4 of
// philox4x32(seed, first + idx / 4) is >= p, compared in double as dropout_kernel compares it.
struct Dropout {
  double p;  // 0: no dropout
  uint64_t seed, first;

  __device__ __forceinline__ bool keeps(uint64_t idx) const {
    const philox::Lanes r = philox::philox4x32(seed, first + idx / 4);
    return static_cast<double>(philox::uniform_float(r[static_cast<int>(idx % 4)])) >= p;
  }
};

// rows x dims values of (n, h) from row `first` on into a shared tile of row pitch `pitch`,
// widened to A; rows at or past `valid` are zeros. Warp per row, lanes along the dims.
template <typename T>
__device__ void load_tile(math_t<T>* tile, int pitch, const Rows<const T>& src, int64_t n,
                          int64_t h, int64_t first, int64_t valid, int rows, int64_t dims) {
  using A = math_t<T>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int r = warp; r < rows; r += kWarps) {
    const T* row = r < valid ? src.at(n, h, first + r) : nullptr;
    for (int64_t d = lane; d < dims; d += kWarpSize)
      tile[r * pitch + d] = row ? to_math(row[d]) : A(0);
  }
}

// An odd row pitch >= dims, so that 32 rows read at one dim fall in 32 banks.
__host__ __device__ __forceinline__ int pitch_of(int64_t dims) {
  return static_cast<int>(dims | 1);
}

// ---------------------------------------------------------------- forward

template <typename T>
struct ForwardArgs {
  Rows<const T> q, k, v;
  Rows<T> out;
  math_t<T>* lse;  // [N, H, L] contiguous
  AttentionShape shape;
  ScoreBias bias;
  math_t<T> scale;
  Dropout dropout;
  math_t<T> keep_scale;  // 1 / (1 - p)
};

template <int kRows, int kKeys, typename A>
size_t forward_shared_bytes(const AttentionShape& s) {
  return sizeof(A) * (static_cast<size_t>(kRows + kKeys) * pitch_of(s.qk_dim) +
                      static_cast<size_t>(kKeys) * pitch_of(s.v_dim));
}

// Note [CUDA flash attention], forward: block (n H + h) tiles + tile, 8 warps; warp w owns
// kRows / 8 query rows, lane t keys t + 32 c of a key tile and dims t + 32 c of o.
template <typename T, int kRows, int kKeys>
__global__ void __launch_bounds__(kBlockThreads) attention_forward_kernel(ForwardArgs<T> args) {
  using A = math_t<T>;
  constexpr int kRowsPerWarp = kRows / kWarps;
  constexpr int kKeysPerLane = kKeys / kWarpSize;
  static_assert(kRowsPerWarp * kWarps == kRows && kKeysPerLane * kWarpSize == kKeys);
  extern __shared__ __align__(16) unsigned char attention_shared[];

  const AttentionShape& shape = args.shape;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t tiles = (shape.queries + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / tiles;  // n H + h
  const int64_t n = bh / shape.heads, h = bh % shape.heads;
  const int64_t row0 = (blockIdx.x % tiles) * kRows;
  const int qk_pitch = pitch_of(shape.qk_dim), v_pitch = pitch_of(shape.v_dim);
  A* q_tile = reinterpret_cast<A*>(attention_shared);  // [kRows, qk_pitch]
  A* k_tile = q_tile + kRows * qk_pitch;               // [kKeys, qk_pitch]
  A* v_tile = k_tile + kKeys * qk_pitch;               // [kKeys, v_pitch]

  load_tile(q_tile, qk_pitch, args.q, n, h, row0, shape.queries - row0, kRows, shape.qk_dim);

  A row_max[kRowsPerWarp], row_sum[kRowsPerWarp], o[kRowsPerWarp][kDimChunks];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    row_max[r] = neg_inf<A>();
    row_sum[r] = A(0);
#pragma unroll
    for (int d = 0; d < kDimChunks; ++d) o[r][d] = A(0);
  }

  const int64_t key_end =
      args.bias.causal ? imin(shape.keys, row0 + kRows) : shape.keys;  // causal: j <= i_last
  for (int64_t key0 = 0; key0 < key_end; key0 += kKeys) {
    __syncthreads();  // the previous tile's readers are done (and, the first time, Q is loaded)
    load_tile(k_tile, qk_pitch, args.k, n, h, key0, shape.keys - key0, kKeys, shape.qk_dim);
    load_tile(v_tile, v_pitch, args.v, n, h, key0, shape.keys - key0, kKeys, shape.v_dim);
    __syncthreads();

    // 1. score[r][c] = q_(row r) . k_(key lane + 32 c)
    A score[kRowsPerWarp][kKeysPerLane] = {};
    for (int64_t e = 0; e < shape.qk_dim; ++e) {
      A key_value[kKeysPerLane];
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c)
        key_value[c] = k_tile[(lane + kWarpSize * c) * qk_pitch + e];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const A query_value = q_tile[(warp * kRowsPerWarp + r) * qk_pitch + e];
#pragma unroll
        for (int c = 0; c < kKeysPerLane; ++c) score[r][c] += query_value * key_value[c];
      }
    }

    // 2. the online-softmax update; score becomes the weight p (times z with dropout)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = row0 + warp * kRowsPerWarp + r;
      A tile_max = neg_inf<A>();
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) {
        const int64_t j = key0 + lane + kWarpSize * c;
        score[r][c] = score[r][c] * args.scale + args.bias.template at<T>(n, h, i, j);
        tile_max = score[r][c] > tile_max ? score[r][c] : tile_max;
      }
      tile_max = warp_max(tile_max);
      const A new_max = tile_max > row_max[r] ? tile_max : row_max[r];
      const A base = new_max == neg_inf<A>() ? A(0) : new_max;
      const A alpha = dev_exp(row_max[r] - base);
      A tile_sum = A(0);
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) {
        score[r][c] = dev_exp(score[r][c] - base);
        tile_sum += score[r][c];
      }
      row_sum[r] = alpha * row_sum[r] + warp_sum(tile_sum);
      row_max[r] = new_max;
#pragma unroll
      for (int d = 0; d < kDimChunks; ++d) o[r][d] *= alpha;
      if (args.dropout.p > 0) {
#pragma unroll
        for (int c = 0; c < kKeysPerLane; ++c) {
          const int64_t j = key0 + lane + kWarpSize * c;
          if (i < shape.queries && j < shape.keys) {
            const uint64_t idx = static_cast<uint64_t>((bh * shape.queries + i) * shape.keys + j);
            score[r][c] *= args.dropout.keeps(idx) ? args.keep_scale : A(0);
          }
        }
      }
    }

    // 3. o += p v over the tile's keys, p_(row r, key) shuffled from lane key % 32
#pragma unroll
    for (int c = 0; c < kKeysPerLane; ++c) {
      for (int source = 0; source < kWarpSize; ++source) {
        const int key = kWarpSize * c + source;
        if (key0 + key >= shape.keys) break;  // the same for the whole warp
        A weight[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
          weight[r] = __shfl_sync(kFullMask, score[r][c], source);
#pragma unroll
        for (int d = 0; d < kDimChunks; ++d) {
          const int64_t dim = lane + kWarpSize * d;
          if (dim >= shape.v_dim) break;
          const A value = v_tile[key * v_pitch + dim];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) o[r][d] += weight[r] * value;
        }
      }
    }
  }

  // out = o / l, lse = m + log l; l = 0: a fully masked row, out 0 and lse -inf
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = row0 + warp * kRowsPerWarp + r;
    if (i >= shape.queries) break;
    const A inverse = row_sum[r] == A(0) ? A(0) : A(1) / row_sum[r];
    T* out_row = args.out.at(n, h, i);
#pragma unroll
    for (int d = 0; d < kDimChunks; ++d) {
      const int64_t dim = lane + kWarpSize * d;
      if (dim < shape.v_dim) out_row[dim] = from_math<T>(o[r][d] * inverse);
    }
    if (lane == 0)
      args.lse[bh * shape.queries + i] =
          row_sum[r] == A(0) ? neg_inf<A>() : row_max[r] + dev_log(row_sum[r]);
  }
}

// ---------------------------------------------------------------- backward

// D_i = dout_i . out_i, in A. A warp per row (n H + h) L + i, lanes along the Ev dims.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    attention_delta_kernel(Rows<const T> dout, Rows<const T> out, AttentionShape shape,
                           math_t<T>* delta) {
  using A = math_t<T>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t rows = shape.batch * shape.heads * shape.queries;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < rows;
       row += int64_t(gridDim.x) * kWarps) {
    const int64_t bh = row / shape.queries, i = row % shape.queries;
    const int64_t n = bh / shape.heads, h = bh % shape.heads;
    const T* g = dout.at(n, h, i);
    const T* y = out.at(n, h, i);
    A sum = A(0);
    for (int64_t d = lane; d < shape.v_dim; d += kWarpSize) sum += to_math(g[d]) * to_math(y[d]);
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
  }
}

template <typename T>
struct BackwardArgs {
  Rows<const T> q, k, v, dout;
  Rows<T> dk, dv;
  const math_t<T>* lse;    // [N, H, L] contiguous
  const math_t<T>* delta;  // [N, H, L] contiguous: D
  math_t<T>* dq_sum;       // [N, H, L, E] contiguous, zeroed: dq in A
  AttentionShape shape;
  ScoreBias bias;
  math_t<T> scale;
  Dropout dropout;
  math_t<T> keep_scale;  // 1 / (1 - p)
};

template <int kRows, int kKeys, typename A>
size_t backward_shared_bytes(const AttentionShape& s) {
  const size_t qk = pitch_of(s.qk_dim), v = pitch_of(s.v_dim);
  return sizeof(A) * ((kRows + kKeys) * (qk + v) + 2 * kRows * kKeys + 2 * kRows);
}

// Note [CUDA flash attention], backward: block (n H + h) tiles + tile, 8 warps. Steps 1 and 3:
// warp w owns kRows / 8 query rows (lane t: keys t + 32 c, then dims t + 32 c); step 2: warp w
// owns kKeys / 8 keys (lane t: dims t + 32 c of their dk and dv).
template <typename T, int kRows, int kKeys>
__global__ void __launch_bounds__(kBlockThreads) attention_backward_kernel(BackwardArgs<T> args) {
  using A = math_t<T>;
  constexpr int kRowsPerWarp = kRows / kWarps;  // steps 1 and 3
  constexpr int kKeysPerLane = kKeys / kWarpSize;
  constexpr int kKeysPerWarp = kKeys / kWarps;  // step 2
  static_assert(kRowsPerWarp * kWarps == kRows && kKeysPerLane * kWarpSize == kKeys);
  extern __shared__ __align__(16) unsigned char attention_shared[];

  const AttentionShape& shape = args.shape;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t tiles = (shape.keys + kKeys - 1) / kKeys;
  const int64_t bh = blockIdx.x / tiles;  // n H + h
  const int64_t n = bh / shape.heads, h = bh % shape.heads;
  const int64_t key0 = (blockIdx.x % tiles) * kKeys;
  const int64_t valid_keys = imin(kKeys, shape.keys - key0);
  const int qk_pitch = pitch_of(shape.qk_dim), v_pitch = pitch_of(shape.v_dim);
  A* k_tile = reinterpret_cast<A*>(attention_shared);  // [kKeys, qk_pitch]
  A* v_tile = k_tile + kKeys * qk_pitch;               // [kKeys, v_pitch]
  A* q_tile = v_tile + kKeys * v_pitch;                // [kRows, qk_pitch]
  A* dout_tile = q_tile + kRows * qk_pitch;            // [kRows, v_pitch]
  A* p_tile = dout_tile + kRows * v_pitch;             // [kRows, kKeys]: P~ = p z
  A* ds_tile = p_tile + kRows * kKeys;                 // [kRows, kKeys]: dS
  A* lse_tile = ds_tile + kRows * kKeys;               // [kRows]
  A* delta_tile = lse_tile + kRows;                    // [kRows]

  load_tile(k_tile, qk_pitch, args.k, n, h, key0, valid_keys, kKeys, shape.qk_dim);
  load_tile(v_tile, v_pitch, args.v, n, h, key0, valid_keys, kKeys, shape.v_dim);

  A dk[kKeysPerWarp][kDimChunks] = {}, dv[kKeysPerWarp][kDimChunks] = {};
  // causal: the rows before key0 attend to none of the tile's keys
  const int64_t row_begin = args.bias.causal ? key0 / kRows * kRows : 0;
  for (int64_t row0 = row_begin; row0 < shape.queries; row0 += kRows) {
    const int64_t valid_rows = imin(kRows, shape.queries - row0);
    __syncthreads();  // the previous row tile's readers are done
    load_tile(q_tile, qk_pitch, args.q, n, h, row0, valid_rows, kRows, shape.qk_dim);
    load_tile(dout_tile, v_pitch, args.dout, n, h, row0, valid_rows, kRows, shape.v_dim);
    for (int r = threadIdx.x; r < kRows; r += kBlockThreads) {
      const bool valid = r < valid_rows;
      lse_tile[r] = valid ? args.lse[bh * shape.queries + row0 + r] : neg_inf<A>();
      delta_tile[r] = valid ? args.delta[bh * shape.queries + row0 + r] : A(0);
    }
    __syncthreads();

    // 1. score = q . k and dprob = dout . v for the warp's rows and the lane's keys, then
    //    P~ = p z and dS = p (dprob z - D) into shared memory
    A score[kRowsPerWarp][kKeysPerLane] = {}, dprob[kRowsPerWarp][kKeysPerLane] = {};
    for (int64_t e = 0; e < shape.qk_dim; ++e) {
      A key_value[kKeysPerLane];
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c)
        key_value[c] = k_tile[(lane + kWarpSize * c) * qk_pitch + e];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const A query_value = q_tile[(warp * kRowsPerWarp + r) * qk_pitch + e];
#pragma unroll
        for (int c = 0; c < kKeysPerLane; ++c) score[r][c] += query_value * key_value[c];
      }
    }
    for (int64_t d = 0; d < shape.v_dim; ++d) {
      A value[kKeysPerLane];
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c)
        value[c] = v_tile[(lane + kWarpSize * c) * v_pitch + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const A dout_value = dout_tile[(warp * kRowsPerWarp + r) * v_pitch + d];
#pragma unroll
        for (int c = 0; c < kKeysPerLane; ++c) dprob[r][c] += dout_value * value[c];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t i = row0 + row;
      const A lse = lse_tile[row];
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) {
        const int key = lane + kWarpSize * c;
        const int64_t j = key0 + key;
        A prob = A(0);  // lse = -inf: a fully masked row, no gradient
        if (lse != neg_inf<A>())
          prob = dev_exp(score[r][c] * args.scale + args.bias.template at<T>(n, h, i, j) - lse);
        A keep = A(1);
        if (args.dropout.p > 0 && i < shape.queries && j < shape.keys) {
          const uint64_t idx = static_cast<uint64_t>((bh * shape.queries + i) * shape.keys + j);
          keep = args.dropout.keeps(idx) ? args.keep_scale : A(0);
        }
        p_tile[row * kKeys + key] = prob * keep;
        ds_tile[row * kKeys + key] = prob * (dprob[r][c] * keep - delta_tile[row]);
      }
    }
    __syncthreads();

    // 2. dv_j += P~_ij dout_i ; dk_j += dS_ij q_i (scaled at the end), for the warp's keys
    for (int row = 0; row < valid_rows; ++row) {
      A weight[kKeysPerWarp], ds[kKeysPerWarp];
#pragma unroll
      for (int t = 0; t < kKeysPerWarp; ++t) {
        weight[t] = p_tile[row * kKeys + warp * kKeysPerWarp + t];
        ds[t] = ds_tile[row * kKeys + warp * kKeysPerWarp + t];
      }
#pragma unroll
      for (int d = 0; d < kDimChunks; ++d) {
        const int64_t dim = lane + kWarpSize * d;
        if (dim < shape.v_dim) {
          const A dout_value = dout_tile[row * v_pitch + dim];
#pragma unroll
          for (int t = 0; t < kKeysPerWarp; ++t) dv[t][d] += weight[t] * dout_value;
        }
        if (dim < shape.qk_dim) {
          const A query_value = q_tile[row * qk_pitch + dim];
#pragma unroll
          for (int t = 0; t < kKeysPerWarp; ++t) dk[t][d] += ds[t] * query_value;
        }
      }
    }

    // 3. dq_i += scale dS_ij k_j for the warp's rows, added into dq_sum
    A dq[kRowsPerWarp][kDimChunks] = {};
    for (int key = 0; key < valid_keys; ++key) {
      A ds[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        ds[r] = ds_tile[(warp * kRowsPerWarp + r) * kKeys + key];
#pragma unroll
      for (int d = 0; d < kDimChunks; ++d) {
        const int64_t dim = lane + kWarpSize * d;
        if (dim >= shape.qk_dim) break;
        const A key_value = k_tile[key * qk_pitch + dim];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) dq[r][d] += ds[r] * key_value;
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = row0 + warp * kRowsPerWarp + r;
      if (i >= shape.queries) break;
      A* dq_row = args.dq_sum + (bh * shape.queries + i) * shape.qk_dim;
#pragma unroll
      for (int d = 0; d < kDimChunks; ++d) {
        const int64_t dim = lane + kWarpSize * d;
        if (dim < shape.qk_dim) atomicAdd(dq_row + dim, args.scale * dq[r][d]);
      }
    }
  }

  // dk = scale sum_i dS_ij q_i and dv, each key written by its own warp
#pragma unroll
  for (int t = 0; t < kKeysPerWarp; ++t) {
    const int64_t j = key0 + warp * kKeysPerWarp + t;
    if (j >= shape.keys) break;
    T* dk_row = args.dk.at(n, h, j);
    T* dv_row = args.dv.at(n, h, j);
#pragma unroll
    for (int d = 0; d < kDimChunks; ++d) {
      const int64_t dim = lane + kWarpSize * d;
      if (dim < shape.qk_dim) dk_row[dim] = from_math<T>(args.scale * dk[t][d]);
      if (dim < shape.v_dim) dv_row[dim] = from_math<T>(dv[t][d]);
    }
  }
}

// ---------------------------------------------------------------- host side

constexpr const char* kOp = "scaled_dot_product_attention";

std::string shapes_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return detail::str("q=", q.shape(), " k=", k.shape(), " v=", v.shape());
}

AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v) {
  LOOM_ASSERT(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, shapes_of(q, k, v));
  const AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  LOOM_CHECK(shape.qk_dim <= kMaxAttentionHeadDim && shape.v_dim <= kMaxAttentionHeadDim,
             ValueError, kOp, ": the CUDA kernels take head dims up to ", kMaxAttentionHeadDim,
             "; got ", shapes_of(q, k, v));
  return shape;
}

// t itself when its last dim has a unit stride (or a single element), else a dense copy: the
// kernels read rows as contiguous runs.
Tensor with_unit_last_stride(const Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : contiguous_as(t, t.dtype());
}

ScoreBias score_bias(const AttentionShape& shape, const kernels::AttentionOptions& options,
                     DType dtype) {
  ScoreBias bias{shape.queries, shape.keys, options.is_causal, MaskKind::kNone, nullptr, {}};
  const Tensor& mask = options.mask;
  if (!mask.defined()) return bias;
  LOOM_ASSERT(mask.dim() == 4 && (mask.dtype() == kBool || mask.dtype() == dtype),
              "mask=", mask.shape(), " ", mask.dtype());
  bias.kind = mask.dtype() == kBool ? MaskKind::kBool : MaskKind::kAdditive;
  bias.mask = mask.data();
  for (int d = 0; d < 4; ++d) bias.stride[d] = mask.stride(d);
  return bias;
}

Dropout dropout_of(const kernels::AttentionOptions& options) {
  return {options.dropout_p > 0 ? options.dropout_p : 0.0, options.seed, options.first};
}

// 1 / (1 - p): the factor of a kept weight (0 when p >= 1 drops every weight).
double keep_scale_of(const kernels::AttentionOptions& options) {
  return options.dropout_p >= 1 ? 0.0 : 1.0 / (1.0 - options.dropout_p);
}

unsigned grid_of(int64_t heads_total, int64_t tiles, const Tensor& q, const Tensor& k,
                 const Tensor& v) {
  const int64_t blocks = heads_total * tiles;
  LOOM_CHECK(blocks <= std::numeric_limits<int32_t>::max(), ValueError, kOp,
             ": too many tiles for one CUDA grid (", blocks, " blocks); got ", shapes_of(q, k, v));
  return static_cast<unsigned>(blocks);
}

// Allows `kernel` `bytes` of dynamic shared memory, after checking the device has them.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, const char* name, const Tensor& q,
                         const Tensor& k, const Tensor& v) {
  const int device = q.device().index;
  int limit = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                  device);
  LOOM_CHECK(bytes <= static_cast<size_t>(limit), DeviceError, kOp, ": the CUDA kernel ", name,
             " needs ", bytes,
             " bytes of shared memory per block for these head dims and cuda:", device,
             " gives at most ", limit, "; got ", shapes_of(q, k, v));
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             device, "cudaFuncSetAttribute(", name, ")");
}

DType accumulation_dtype(DType dtype) { return dtype == kFloat64 ? kFloat64 : kFloat32; }

}  // namespace

kernels::AttentionForward attention_forward(const Tensor& q_in, const Tensor& k_in,
                                            const Tensor& v_in,
                                            const kernels::AttentionOptions& options) {
  const AttentionShape shape = attention_shape(q_in, k_in, v_in);
  const Device device = q_in.device();
  DeviceGuard guard(device.index);
  const Tensor q = with_unit_last_stride(q_in), k = with_unit_last_stride(k_in),
               v = with_unit_last_stride(v_in);
  kernels::AttentionForward result{
      kernels::empty_attention_result(shape.batch, shape.heads, shape.queries, shape.v_dim,
                                      q.dtype(), device),
      empty({shape.batch, shape.heads, shape.queries}, accumulation_dtype(q.dtype()), device)};
  if (shape.batch * shape.heads * shape.queries == 0) return result;
  dispatch_floating_and_16bit(q.dtype(), kOp, [&]<typename T>() {
    using A = math_t<T>;
    constexpr int kRows = Tiles<A>::kForwardRows, kKeys = Tiles<A>::kForwardKeys;
    const ForwardArgs<T> args{rows_in<T>(q),
                              rows_in<T>(k),
                              rows_in<T>(v),
                              rows_out<T>(result.out),
                              result.lse.data_ptr<A>(),
                              shape,
                              score_bias(shape, options, q.dtype()),
                              static_cast<A>(options.scale),
                              dropout_of(options),
                              static_cast<A>(keep_scale_of(options))};
    const auto kernel = attention_forward_kernel<T, kRows, kKeys>;
    const size_t bytes = forward_shared_bytes<kRows, kKeys, A>(shape);
    allow_shared_memory(kernel, bytes, "attention_forward_kernel", q, k, v);
    const unsigned blocks =
        grid_of(shape.batch * shape.heads, ceil_div(shape.queries, kRows), q, k, v);
    kernel<<<blocks, kBlockThreads, bytes, stream_of(q)>>>(args);
    check_launch("attention_forward_kernel", device.index);
  });
  return result;
}

kernels::AttentionGrads attention_backward(const Tensor& dout_in, const Tensor& q_in,
                                           const Tensor& k_in, const Tensor& v_in,
                                           const Tensor& out_in, const Tensor& lse_in,
                                           const kernels::AttentionOptions& options) {
  const AttentionShape shape = attention_shape(q_in, k_in, v_in);
  const Device device = q_in.device();
  const DType dtype = q_in.dtype();
  DeviceGuard guard(device.index);
  const Tensor q = with_unit_last_stride(q_in), k = with_unit_last_stride(k_in),
               v = with_unit_last_stride(v_in), out = with_unit_last_stride(out_in),
               dout = with_unit_last_stride(dout_in);
  // The inputs' strides where they are dense (Note [Fused attention]).
  kernels::AttentionGrads grads{kernels::empty_attention_grad(q_in, dtype),
                                kernels::empty_attention_grad(k_in, dtype),
                                kernels::empty_attention_grad(v_in, dtype)};
  const DType acc_dtype = accumulation_dtype(dtype);
  const Tensor lse = contiguous_as(lse_in, acc_dtype);
  const Tensor delta = empty({shape.batch, shape.heads, shape.queries}, acc_dtype, device);
  const Tensor dq_sum =
      empty({shape.batch, shape.heads, shape.queries, shape.qk_dim}, acc_dtype, device);
  cuda::fill_(dq_sum, 0.0);
  dispatch_floating_and_16bit(dtype, kOp, [&]<typename T>() {
    using A = math_t<T>;
    constexpr int kRows = Tiles<A>::kBackwardRows, kKeys = Tiles<A>::kBackwardKeys;
    const cudaStream_t stream = stream_of(q);
    const int64_t rows = shape.batch * shape.heads * shape.queries;
    if (rows > 0) {
      // a warp per row: kWarps rows per block
      attention_delta_kernel<T><<<blocks_for(rows, kWarps), kBlockThreads, 0, stream>>>(
          rows_in<T>(dout), rows_in<T>(out), shape, delta.data_ptr<A>());
      check_launch("attention_delta_kernel", device.index);
    }
    if (shape.batch * shape.heads * shape.keys == 0) return;
    const BackwardArgs<T> args{rows_in<T>(q),
                               rows_in<T>(k),
                               rows_in<T>(v),
                               rows_in<T>(dout),
                               rows_out<T>(grads.dk),
                               rows_out<T>(grads.dv),
                               lse.data_ptr<A>(),
                               delta.data_ptr<A>(),
                               dq_sum.data_ptr<A>(),
                               shape,
                               score_bias(shape, options, dtype),
                               static_cast<A>(options.scale),
                               dropout_of(options),
                               static_cast<A>(keep_scale_of(options))};
    const auto kernel = attention_backward_kernel<T, kRows, kKeys>;
    const size_t bytes = backward_shared_bytes<kRows, kKeys, A>(shape);
    allow_shared_memory(kernel, bytes, "attention_backward_kernel", q, k, v);
    const unsigned blocks =
        grid_of(shape.batch * shape.heads, ceil_div(shape.keys, kKeys), q, k, v);
    kernel<<<blocks, kBlockThreads, bytes, stream>>>(args);
    check_launch("attention_backward_kernel", device.index);
  });
  cuda::copy_(grads.dq, dq_sum);  // A to dtype, [N, L, H, E] memory
  return grads;
}

}  // namespace loom::cuda
