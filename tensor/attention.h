// tensor/attention.h — scaled dot-product attention as one fused kernel pair: the forward and the
// backward of softmax(q k^T scale + mask) v without the [L, S] score matrix (Note [Fused
// attention]). The front (tensor/attention.cpp) checks the arguments, brings every shape to the
// four dims the kernels read, and switches between tensor/cpu/attention.cpp and
// tensor/cuda/attention.cu.
#pragma once

#include "tensor/tensor.h"

namespace loom::kernels {

// Note [Fused attention]
// ~~~~~~~~~~~~~~~~~~~~~~
// For one (batch, head), with s_ij = scale q_i . k_j + mask_ij (mask_ij = -inf where a boolean
// mask is false or, with is_causal, where j > i: the top-left aligned lower triangle, as
// PyTorch), attention is out_i = sum_j p_ij v_j with p_ij = exp(s_ij - lse_i) and
// lse_i = log sum_j exp(s_ij). Holding s for a whole head costs L x S values: 16 MiB in float32
// at L = S = 2048, per head and per sequence, in the forward and again in the backward. The
// kernels, after FlashAttention-2 (Dao, 2023), never hold it:
//
// - Forward: the keys are visited block by block. For a block of queries, the running row
//   maximum m_i, the running sum l_i = sum_j exp(s_ij - m_i) and the unnormalised output o_i are
//   kept; a new key block with larger scores rescales l_i and o_i by exp(m_old - m_new) (the
//   online softmax of Milakov and Gimelshein, 2018). At the end out_i = o_i / l_i, and
//   lse_i = m_i + log l_i is saved: one value per query row.
// - Backward: with D_i = dout_i . out_i (= sum_j p_ij dp_ij), each key block recomputes its
//   scores and p_ij = exp(s_ij - lse_i) from the saved lse, then
//     dv_j += p_ij dout_i ; dp_ij = dout_i . v_j ; ds_ij = p_ij (dp_ij - D_i) ;
//     dq_i += scale ds_ij k_j ; dk_j += scale ds_ij q_i.
//   So backward costs one more score computation than the forward, and memory of a few blocks.
// - Dropout (0 < p < 1) applies to p_ij after the softmax, as PyTorch: out_i = sum_j p_ij
//   z_ij v_j / (1 - p), z_ij = 1 when u >= p. u is the uniform that rand() would draw for
//   element (n, h, i, j) of an [N, H, L, S] tensor from (seed, first) (Note [Dropout mask],
//   tensor/index.h), so the backward recomputes z instead of saving it and both devices drop the
//   same elements. D_i is then dout_i . out_i still (out already holds the dropped p), and dp is
//   taken through the dropped, rescaled weights.
// - A row whose every score is -inf (all keys masked) has lse = -inf and gives out_i = 0 and
//   zero gradients (PyTorch's math path gives NaN there; its fused kernels give 0).
// - Statistics (m, l, lse, D) and every accumulation are float32 for 16-bit and float32 inputs,
//   float64 for float64 inputs.
//
// The kernels' contract, which the front establishes:
// - q [N, H, L, E], k [N, H, S, E], v [N, H, S, Ev], any strides with a unit stride in the last
//   dim (a transposed [N, L, H, E] projection is read in place); one dtype: float32, float64,
//   float16 or bfloat16; one device.
// - mask undefined, or [N, H, L, S] (broadcast dims have stride 0) of dtype bool (true: attend)
//   or q's dtype (added to the scores).
// - out [N, H, L, Ev] in q's dtype is allocated as the transpose of a contiguous [N, L, H, Ev]
//   tensor, so out.transpose(1, 2) is contiguous (what a Transformer's output projection reads).
//   dq, dk and dv take the strides of q, k and v where those are dense (so a leaf's gradient is
//   accumulated without a copy), else out's layout (empty_attention_grad). lse [N, H, L] is
//   contiguous, float32 (float64 for float64 inputs).
struct AttentionOptions {
  Tensor mask;
  bool is_causal = false;
  double scale = 1.0;
  double dropout_p = 0.0;  // 0: no dropout
  uint64_t seed = 0;       // dropout's (seed, first), Note [Dropout mask]
  uint64_t first = 0;
};

struct AttentionForward {
  Tensor out;
  Tensor lse;
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// The entries take q [..., L, E], k [..., S, E], v [..., S, Ev] with the same leading dims (none,
// or any number), and a mask broadcastable to [..., L, S]; out is [..., L, Ev] and lse [..., L].
// ShapeError/DTypeError/DeviceError/ValueError naming `scaled_dot_product_attention` and the
// shapes for anything else.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& options);
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& options);

// The [N, H, L, Ev] result laid out as [N, L, H, Ev] (Note [Fused attention]); both backends
// allocate out with it.
Tensor empty_attention_result(int64_t n, int64_t h, int64_t l, int64_t e, DType dtype,
                              Device device);
// The gradient of a 4-D input x: x's strides where x is dense, else empty_attention_result's
// layout. Both backends allocate dq, dk and dv with it (in `dtype`).
Tensor empty_attention_grad(const Tensor& x, DType dtype);

}  // namespace loom::kernels
