// tensor/cpu/attention.cpp — the fused attention's CPU loops (Note [Fused attention],
// tensor/attention.h). Every inner loop runs over a block's keys or a row's features with unit
// stride, so the compiler vectorises it; the scores live in a block of kQueryRows x kKeys values
// per thread and never in a tensor.

#include "tensor/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/vec_math.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/philox.h"

namespace loom::cpu {

namespace {

constexpr int64_t kQueryRows = 32;  // query rows a forward work item holds
constexpr int64_t kKeys = 64;       // keys a block holds (the scores' row length)

template <typename T>
constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

// Rows of a [N, H, rows, features] tensor with a unit stride in the last dim.
template <typename P>
struct Rows {
  P* base;
  int64_t sn, sh, sr;
  Rows(const Tensor& t, P* data)
      : base(data), sn(t.strides()[0]), sh(t.strides()[1]), sr(t.strides()[2]) {}
  P* operator()(int64_t n, int64_t h, int64_t i) const { return base + n * sn + h * sh + i * sr; }
};

// The mask of one (n, h): bool (attend where true) or additive, read through its strides.
template <typename T>
struct Mask {
  const bool* keep = nullptr;
  const T* add = nullptr;
  int64_t sn = 0, sh = 0, sl = 0, ss = 0;

  explicit Mask(const Tensor& m) {
    if (!m.defined()) return;
    sn = m.strides()[0], sh = m.strides()[1], sl = m.strides()[2], ss = m.strides()[3];
    if (m.dtype() == kBool) {
      keep = m.data_ptr<bool>();
    } else {
      add = m.data_ptr<T>();
    }
  }
  // Applies row i's mask to the scores of keys [j0, j0 + cols).
  void apply(int64_t n, int64_t h, int64_t i, int64_t j0, int64_t cols, T* s) const {
    const int64_t at = n * sn + h * sh + i * sl + j0 * ss;
    if (keep != nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        if (!keep[at + c * ss]) s[c] = kMinusInf<T>;
      }
    } else if (add != nullptr) {
      for (int64_t c = 0; c < cols; ++c) s[c] += add[at + c * ss];
    }
  }
};

// Dropout's keep-and-rescale factors for row i's keys [j0, j0 + cols): 1/(1-p) or 0 (Note
// [Fused attention]: element (n, h, i, j) of an [N, H, L, S] tensor, Note [Dropout mask]).
template <typename T>
void dropout_factors(const kernels::AttentionOptions& o, int64_t row_index, int64_t s_len,
                     int64_t j0, int64_t cols, T* z) {
  const T kept = static_cast<T>(1.0 / (1.0 - o.dropout_p));
  const uint64_t first_element = static_cast<uint64_t>(row_index * s_len + j0);
  uint64_t counter = ~uint64_t{0};
  philox::Lanes lanes{};
  for (int64_t c = 0; c < cols; ++c) {
    const uint64_t e = first_element + static_cast<uint64_t>(c);
    if (e / 4 != counter) {
      counter = e / 4;
      lanes = philox::philox4x32(o.seed, o.first + counter);
    }
    const bool keep = static_cast<double>(philox::uniform_float(lanes[e % 4])) >= o.dropout_p;
    z[c] = keep ? kept : T(0);
  }
}

// s[c] = scale q . k_c for the keys of a block, with the block's keys transposed in kt [E][kKeys].
template <typename T>
void block_scores(const T* q_scaled, const T* kt, int64_t e_len, int64_t cols, T* s) {
  std::fill(s, s + cols, T(0));
  for (int64_t e = 0; e < e_len; ++e) {
    const T a = q_scaled[e];
    const T* kr = kt + e * kKeys;
    for (int64_t c = 0; c < cols; ++c) s[c] += a * kr[c];
  }
}

// dst[e][c] = rows(n, h, j0 + c)[e]: a block of keys (or values) transposed, kKeys per row.
template <typename T>
void transpose_block(const Rows<const T>& src, int64_t n, int64_t h, int64_t j0, int64_t cols,
                     int64_t features, T* dst) {
  for (int64_t c = 0; c < cols; ++c) {
    const T* r = src(n, h, j0 + c);
    for (int64_t e = 0; e < features; ++e) dst[e * kKeys + c] = r[e];
  }
}

template <typename T>
kernels::AttentionForward forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const kernels::AttentionOptions& o) {
  const int64_t n_len = q.size(0), h_len = q.size(1), l_len = q.size(2), e_len = q.size(3);
  const int64_t s_len = k.size(2), ev_len = v.size(3);
  Tensor out = kernels::empty_attention_result(n_len, h_len, l_len, ev_len, q.dtype(), kCPU);
  Tensor lse = empty({n_len, h_len, l_len}, q.dtype());
  const Rows<const T> qr(q, q.data_ptr<T>()), kr(k, k.data_ptr<T>()), vr(v, v.data_ptr<T>());
  const Rows<T> outr(out, out.data_ptr<T>());
  T* lse_data = lse.data_ptr<T>();
  const Mask<T> mask(o.mask);
  const T scale = static_cast<T>(o.scale);
  const bool dropout = o.dropout_p > 0.0;

  const int64_t blocks = (l_len + kQueryRows - 1) / kQueryRows;
  const int64_t items = n_len * h_len * blocks;
  const int64_t work = kQueryRows * std::max<int64_t>(s_len, 1) * (e_len + ev_len);
  parallel_for(0, items, grain_for(work), [&](int64_t lo, int64_t hi) {
    std::vector<T> qs(kQueryRows * e_len), kt(e_len * kKeys), s(kKeys), z(kKeys);
    std::vector<T> acc(kQueryRows * ev_len), m(kQueryRows), l(kQueryRows);
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t bh = item / blocks, i0 = (item % blocks) * kQueryRows;
      const int64_t n = bh / h_len, h = bh % h_len;
      const int64_t rows = std::min(kQueryRows, l_len - i0);
      for (int64_t r = 0; r < rows; ++r) {
        const T* src = qr(n, h, i0 + r);
        for (int64_t e = 0; e < e_len; ++e) qs[r * e_len + e] = src[e] * scale;
      }
      std::fill(m.begin(), m.end(), kMinusInf<T>);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      // With is_causal, row i sees keys j <= i: the block's last row sees keys below i0 + rows.
      const int64_t key_end = o.is_causal ? std::min(s_len, i0 + rows) : s_len;
      for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
        const int64_t cols = std::min(kKeys, key_end - j0);
        transpose_block(kr, n, h, j0, cols, e_len, kt.data());
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          block_scores(&qs[r * e_len], kt.data(), e_len, cols, s.data());
          if (o.is_causal) {
            for (int64_t c = std::max<int64_t>(i + 1 - j0, 0); c < cols; ++c) s[c] = kMinusInf<T>;
          }
          mask.apply(n, h, i, j0, cols, s.data());
          T block_max = kMinusInf<T>;
          for (int64_t c = 0; c < cols; ++c) block_max = std::max(block_max, s[c]);
          const T m_new = std::max(m[r], block_max);
          if (m_new == kMinusInf<T>) continue;  // every key so far masked: nothing to add
          const T alpha = exp_nonpositive(m[r] - m_new);
          T sum = 0;
          for (int64_t c = 0; c < cols; ++c) {
            s[c] = exp_nonpositive(s[c] - m_new);
            sum += s[c];
          }
          m[r] = m_new;
          l[r] = l[r] * alpha + sum;
          if (dropout) {
            dropout_factors(o, bh * l_len + i, s_len, j0, cols, z.data());
            for (int64_t c = 0; c < cols; ++c) s[c] *= z[c];
          }
          T* a = &acc[r * ev_len];
          if (alpha != T(1)) {
            for (int64_t d = 0; d < ev_len; ++d) a[d] *= alpha;
          }
          for (int64_t c = 0; c < cols; ++c) {
            const T p = s[c];
            if (p == T(0)) continue;
            const T* vrow = vr(n, h, j0 + c);
            for (int64_t d = 0; d < ev_len; ++d) a[d] += p * vrow[d];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
        T* dst = outr(n, h, i0 + r);
        for (int64_t d = 0; d < ev_len; ++d) dst[d] = acc[r * ev_len + d] * inv;
        lse_data[bh * l_len + i0 + r] = l[r] > T(0) ? m[r] + std::log(l[r]) : kMinusInf<T>;
      }
    }
  });
  return {out, lse};
}

template <typename T>
kernels::AttentionGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse,
                                 const kernels::AttentionOptions& o) {
  const int64_t n_len = q.size(0), h_len = q.size(1), l_len = q.size(2), e_len = q.size(3);
  const int64_t s_len = k.size(2), ev_len = v.size(3);
  kernels::AttentionGrads g;
  g.dq = kernels::empty_attention_grad(q, q.dtype());
  g.dk = kernels::empty_attention_grad(k, q.dtype());
  g.dv = kernels::empty_attention_grad(v, q.dtype());
  const Rows<const T> qr(q, q.data_ptr<T>()), kr(k, k.data_ptr<T>()), vr(v, v.data_ptr<T>());
  const Rows<const T> outr(out, out.data_ptr<T>()), doutr(dout, dout.data_ptr<T>());
  const Rows<T> dqr(g.dq, g.dq.data_ptr<T>()), dkr(g.dk, g.dk.data_ptr<T>());
  const Rows<T> dvr(g.dv, g.dv.data_ptr<T>());
  const T* lse_data = lse.data_ptr<T>();
  const Mask<T> mask(o.mask);
  const T scale = static_cast<T>(o.scale);
  const bool dropout = o.dropout_p > 0.0;

  const int64_t work =
      std::max<int64_t>(l_len, 1) * std::max<int64_t>(s_len, 1) * (2 * e_len + 2 * ev_len);
  parallel_for(0, n_len * h_len, grain_for(work), [&](int64_t lo, int64_t hi) {
    std::vector<T> diag(l_len), kt(e_len * kKeys), vt(ev_len * kKeys), qs(e_len);
    std::vector<T> s(kKeys), dp(kKeys), z(kKeys, T(1)), dk(kKeys * e_len), dv(kKeys * ev_len);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t n = bh / h_len, h = bh % h_len;
      const T* row_lse = lse_data + bh * l_len;
      // D_i = dout_i . out_i; and dq starts at zero, accumulated over the key blocks.
      for (int64_t i = 0; i < l_len; ++i) {
        const T* a = doutr(n, h, i);
        const T* b = outr(n, h, i);
        T sum = 0;
        for (int64_t d = 0; d < ev_len; ++d) sum += a[d] * b[d];
        diag[i] = sum;
        std::fill(dqr(n, h, i), dqr(n, h, i) + e_len, T(0));
      }
      for (int64_t j0 = 0; j0 < s_len; j0 += kKeys) {
        const int64_t cols = std::min(kKeys, s_len - j0);
        transpose_block(kr, n, h, j0, cols, e_len, kt.data());
        transpose_block(vr, n, h, j0, cols, ev_len, vt.data());
        std::fill(dk.begin(), dk.end(), T(0));
        std::fill(dv.begin(), dv.end(), T(0));
        // With is_causal, key j is seen by the rows i >= j: the block's first key by i >= j0.
        for (int64_t i = o.is_causal ? j0 : 0; i < l_len; ++i) {
          const T lse_i = row_lse[i];
          if (lse_i == kMinusInf<T>) continue;  // a fully masked row: no gradient
          const T* q_i = qr(n, h, i);
          for (int64_t e = 0; e < e_len; ++e) qs[e] = q_i[e] * scale;
          block_scores(qs.data(), kt.data(), e_len, cols, s.data());
          if (o.is_causal) {
            for (int64_t c = std::max<int64_t>(i + 1 - j0, 0); c < cols; ++c) s[c] = kMinusInf<T>;
          }
          mask.apply(n, h, i, j0, cols, s.data());
          for (int64_t c = 0; c < cols; ++c) s[c] = exp_nonpositive(s[c] - lse_i);  // p_ij
          if (dropout) dropout_factors(o, bh * l_len + i, s_len, j0, cols, z.data());
          // dv_j += p_ij z_ij dout_i ; dp_ij = dout_i . v_j
          const T* dout_i = doutr(n, h, i);
          std::fill(dp.begin(), dp.begin() + cols, T(0));
          for (int64_t d = 0; d < ev_len; ++d) {
            const T a = dout_i[d];
            const T* vrow = &vt[d * kKeys];
            for (int64_t c = 0; c < cols; ++c) dp[c] += a * vrow[c];
          }
          for (int64_t c = 0; c < cols; ++c) {
            const T pz = s[c] * z[c];
            if (pz == T(0)) continue;
            T* dvc = &dv[c * ev_len];
            for (int64_t d = 0; d < ev_len; ++d) dvc[d] += pz * dout_i[d];
          }
          // ds_ij = p_ij (z_ij dp_ij - D_i); dq_i += scale ds_ij k_j ; dk_j += scale ds_ij q_i
          T* dq_i = dqr(n, h, i);
          for (int64_t c = 0; c < cols; ++c) {
            const T ds = s[c] * (z[c] * dp[c] - diag[i]) * scale;
            if (ds == T(0)) continue;
            const T* k_j = kr(n, h, j0 + c);
            T* dkc = &dk[c * e_len];
            for (int64_t e = 0; e < e_len; ++e) {
              dq_i[e] += ds * k_j[e];
              dkc[e] += ds * q_i[e];
            }
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          std::memcpy(dkr(n, h, j0 + c), &dk[c * e_len], sizeof(T) * e_len);
          std::memcpy(dvr(n, h, j0 + c), &dv[c * ev_len], sizeof(T) * ev_len);
        }
      }
    }
  });
  return g;
}

}  // namespace

kernels::AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kernels::AttentionOptions& options) {
  return dispatch_floating(q.dtype(), "scaled_dot_product_attention",
                           [&]<typename T>() { return forward<T>(q, k, v, options); });
}

kernels::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           const kernels::AttentionOptions& options) {
  return dispatch_floating(q.dtype(), "scaled_dot_product_attention_backward", [&]<typename T>() {
    return backward<T>(dout, q, k, v, out, lse, options);
  });
}

}  // namespace loom::cpu
