// tensor/cpu/loss.cpp — softmax family and losses on the CPU (the loops behind the front in
// tensor/loss.cpp). Softmax runs along rows when its dim is the last one, else along lanes (a
// block of the inner positions processed side by side, so memory is read contiguously); cross
// entropy runs one position (a row of C classes) at a time. Reductions sum fixed-size blocks of
// positions into partials, then add the partials in order: the result does not depend on the
// number of threads.

#include "tensor/cpu/loss.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

namespace {

using kernels::class_layout;
using kernels::ClassLayout;
using kernels::contiguous;
using kernels::DimLayout;
using kernels::reshape;
using kernels::to_dtype;
using kernels::transpose;

constexpr int64_t kLanes = 256;  // inner positions a softmax lane block handles at once

// ---------------------------------------------------------------- softmax

enum class SoftmaxKind { Softmax, LogSoftmax, SoftmaxBackward, LogSoftmaxBackward };

// Contiguous runs as Eigen arrays: Eigen's exp is vectorised, std::exp is a scalar libm call.
template <typename T>
using Run = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstRun = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// One row (inner == 1): a = x or y, b = dy for the backward kinds; out written.
template <typename T, SoftmaxKind kind>
void softmax_row(const T* a, const T* b, T* out, int64_t n) {
  if (n == 0) return;
  const ConstRun<T> in(a, n);
  Run<T> o(out, n);
  if constexpr (kind == SoftmaxKind::Softmax) {
    o = (in - in.maxCoeff()).exp();
    o *= static_cast<T>(1.0 / static_cast<double>(o.sum()));
  } else if constexpr (kind == SoftmaxKind::LogSoftmax) {
    const T mx = in.maxCoeff();
    const T log_sum = static_cast<T>(std::log(static_cast<double>((in - mx).exp().sum())));
    o = (in - mx) - log_sum;
  } else if constexpr (kind == SoftmaxKind::SoftmaxBackward) {
    const ConstRun<T> dy(b, n);
    o = in * (dy - (dy * in).sum());
  } else {
    const ConstRun<T> dy(b, n);
    o = dy - in.exp() * dy.sum();
  }
}

// `lanes` (<= kLanes) neighbouring inner positions at once: element j of lane i is at
// j * stride + i, so every inner loop reads a contiguous run of lanes.
template <typename T, SoftmaxKind kind>
void softmax_lanes(const T* a, const T* b, T* out, int64_t n, int64_t stride, int64_t lanes) {
  Eigen::Array<double, Eigen::Dynamic, 1> acc =
      Eigen::Array<double, Eigen::Dynamic, 1>::Zero(lanes);
  auto in = [&](int64_t j) { return ConstRun<T>(a + j * stride, lanes); };
  auto dy = [&](int64_t j) { return ConstRun<T>(b + j * stride, lanes); };
  auto o = [&](int64_t j) { return Run<T>(out + j * stride, lanes); };
  if constexpr (kind == SoftmaxKind::Softmax || kind == SoftmaxKind::LogSoftmax) {
    Eigen::Array<T, Eigen::Dynamic, 1> mx =
        Eigen::Array<T, Eigen::Dynamic, 1>::Constant(lanes, -std::numeric_limits<T>::infinity());
    for (int64_t j = 0; j < n; ++j) mx = mx.max(in(j));
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (kind == SoftmaxKind::Softmax) {
        o(j) = (in(j)-mx).exp();
        acc += o(j).template cast<double>();
      } else {
        acc += (in(j)-mx).exp().template cast<double>();
      }
    }
    if constexpr (kind == SoftmaxKind::Softmax) {
      const Eigen::Array<T, Eigen::Dynamic, 1> inv = acc.inverse().template cast<T>();
      for (int64_t j = 0; j < n; ++j) o(j) *= inv;
    } else {
      const Eigen::Array<T, Eigen::Dynamic, 1> log_sum = acc.log().template cast<T>();
      for (int64_t j = 0; j < n; ++j) o(j) = (in(j)-mx) - log_sum;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (kind == SoftmaxKind::SoftmaxBackward)
        acc += (dy(j) * in(j)).template cast<double>();
      else
        acc += dy(j).template cast<double>();
    }
    const Eigen::Array<T, Eigen::Dynamic, 1> total = acc.template cast<T>();
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (kind == SoftmaxKind::SoftmaxBackward)
        o(j) = in(j) * (dy(j) - total);
      else
        o(j) = dy(j) - in(j).exp() * total;
    }
  }
}

// Runs a softmax-family kernel over a (x or y) and b (dy, or undefined; of a's shape) along the
// lines of l.
template <SoftmaxKind kind>
Tensor softmax_family(const char* op, const Tensor& a, const Tensor& b, const DimLayout& l) {
  const Tensor ac = contiguous(a);
  const Tensor bc = b.defined() ? contiguous(to_dtype(b, a.dtype())) : Tensor();
  Tensor out = empty(a.sizes(), a.dtype(), a.device());
  dispatch_floating(a.dtype(), op, [&]<typename T>() {
    const T* ap = ac.data_ptr<T>();
    const T* bp = bc.defined() ? bc.data_ptr<T>() : nullptr;
    T* op_ = out.data_ptr<T>();
    if (l.inner == 1) {
      // Rows split across threads.
      parallel_for(0, l.outer, grain_for(l.n), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
          softmax_row<T, kind>(ap + r * l.n, bp ? bp + r * l.n : nullptr, op_ + r * l.n, l.n);
      });
      return;
    }
    // Lane blocks (outer index, block of kLanes inner positions) split across threads.
    const int64_t blocks = (l.inner + kLanes - 1) / kLanes;
    const int64_t work = l.n * std::min(l.inner, kLanes);
    parallel_for(0, l.outer * blocks, grain_for(work), [&](int64_t lo, int64_t hi) {
      for (int64_t u = lo; u < hi; ++u) {
        const int64_t o = u / blocks, i0 = (u % blocks) * kLanes;
        const int64_t base = o * l.n * l.inner + i0;
        softmax_lanes<T, kind>(ap + base, bp ? bp + base : nullptr, op_ + base, l.n, l.inner,
                               std::min(kLanes, l.inner - i0));
      }
    });
  });
  return out;
}

// ---------------------------------------------------------------- class losses

// Sums f(p) over positions [0, count) in fixed blocks (partials added in block order), so the
// result does not depend on the thread count. f(lo, hi) returns the sum of its block.
template <typename F>
double blocked_sum(int64_t count, int64_t per_item_work, F&& block_sum) {
  const int64_t block = grain_for(per_item_work);
  const int64_t blocks = (count + block - 1) / block;
  std::vector<double> partial(blocks, 0.0);
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k)
      partial[k] = block_sum(k * block, std::min(count, (k + 1) * block));
  });
  double total = 0;
  for (double v : partial) total += v;
  return total;
}

// The per-position gradient scale: dloss itself (None), or dloss's one value times `scale`.
struct GradScale {
  Tensor per_position;  // contiguous, x's dtype, for None
  double value = 0;
};

GradScale grad_scale(const Tensor& dloss, Reduction reduction, double divisor, DType dtype) {
  if (reduction == Reduction::None) return {contiguous(to_dtype(dloss, dtype)), 0.0};
  const double g = dloss.item<double>();
  return {Tensor(), reduction == Reduction::Mean ? g / divisor : g};
}

}  // namespace

// ---------------------------------------------------------------- softmax

Tensor softmax(const Tensor& x, const DimLayout& l) {
  return softmax_family<SoftmaxKind::Softmax>("softmax", x, Tensor(), l);
}
Tensor log_softmax(const Tensor& x, const DimLayout& l) {
  return softmax_family<SoftmaxKind::LogSoftmax>("log_softmax", x, Tensor(), l);
}
Tensor softmax_backward(const Tensor& dy, const Tensor& y, const DimLayout& l) {
  return softmax_family<SoftmaxKind::SoftmaxBackward>("softmax_backward", y, dy, l);
}
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, const DimLayout& l) {
  return softmax_family<SoftmaxKind::LogSoftmaxBackward>("log_softmax_backward", y, dy, l);
}

// ---------------------------------------------------------------- class losses

// Each position's row of C logits is made contiguous first ([N, C, S] -> [N, S, C] when S > 1);
// positions then split across threads.
kernels::CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target,
                                                   Reduction reduction, int64_t ignore_index,
                                                   double label_smoothing, int64_t count) {
  const char* op = "cross_entropy";
  const ClassLayout l = class_layout(logits.sizes());
  const Tensor rows =
      contiguous(l.s == 1 ? logits : transpose(reshape(logits, {l.n, l.c, l.s}), 1, 2));
  const Tensor tc = contiguous(target);
  kernels::CrossEntropyForward out;
  out.count = scalar_tensor(static_cast<double>(count), kInt64);
  out.lse = empty({l.n, l.s}, kFloat64, logits.device());
  const bool per_position = reduction == Reduction::None;
  out.loss = per_position ? empty(target.sizes(), logits.dtype(), logits.device())
                          : empty({}, logits.dtype(), logits.device());
  const double ls = label_smoothing;
  dispatch_floating(logits.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const T* xp = rows.data_ptr<T>();
      const I* tp = tc.data_ptr<I>();
      double* lse = out.lse.data_ptr<double>();
      T* lp = per_position ? out.loss.data_ptr<T>() : nullptr;
      const int64_t classes = l.c;
      // The loss of position p (and its lse, stored).
      auto position_loss = [&](int64_t p) -> double {
        const int64_t t = static_cast<int64_t>(tp[p]);
        if (t == ignore_index) {
          lse[p] = 0;
          return 0.0;
        }
        const ConstRun<T> x(xp + p * classes, classes);
        const T mx = x.maxCoeff();
        const double log_z = double(mx) + std::log(static_cast<double>((x - mx).exp().sum()));
        lse[p] = log_z;
        double loss = log_z - double(x[t]);
        if (ls > 0) {
          const double sum_x = x.template cast<double>().sum();
          loss = (1.0 - ls) * loss + ls * (classes * log_z - sum_x) / classes;
        }
        return loss;
      };
      if (per_position) {
        parallel_for(0, l.positions(), grain_for(classes), [&](int64_t lo, int64_t hi) {
          for (int64_t p = lo; p < hi; ++p) lp[p] = static_cast<T>(position_loss(p));
        });
        return;
      }
      const double total = blocked_sum(l.positions(), classes, [&](int64_t lo, int64_t hi) {
        double s = 0;
        for (int64_t p = lo; p < hi; ++p) s += position_loss(p);
        return s;
      });
      const double value = reduction == Reduction::Mean
                               ? (count == 0 ? std::numeric_limits<double>::quiet_NaN()
                                             : total / static_cast<double>(count))
                               : total;
      out.loss.data_ptr<T>()[0] = static_cast<T>(value);
    });
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, Reduction reduction, int64_t ignore_index,
                              double label_smoothing, const Tensor& count) {
  const char* op = "cross_entropy_backward";
  const ClassLayout l = class_layout(logits.sizes());
  const Tensor rows =
      contiguous(l.s == 1 ? logits : transpose(reshape(logits, {l.n, l.c, l.s}), 1, 2));
  const Tensor tc = contiguous(target), lsec = contiguous(to_dtype(lse, kFloat64));
  const GradScale g = grad_scale(dloss, reduction, count.item<double>(), logits.dtype());
  Tensor drows = empty(rows.sizes(), logits.dtype(), logits.device());
  const double ls = label_smoothing;
  dispatch_floating(logits.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const T* xp = rows.data_ptr<T>();
      const double* lp = lsec.data_ptr<double>();
      const T* gp = g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr;
      const I* tp = tc.data_ptr<I>();
      T* dp = drows.data_ptr<T>();
      const int64_t classes = l.c;
      const T uniform = static_cast<T>(ls / classes), on_target = static_cast<T>(1.0 - ls);
      // Positions split across threads.
      parallel_for(0, l.positions(), grain_for(classes), [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) {
          T* d = dp + p * classes;
          const int64_t t = static_cast<int64_t>(tp[p]);
          if (t == ignore_index) {
            std::fill(d, d + classes, T(0));
            continue;
          }
          const ConstRun<T> x(xp + p * classes, classes);
          const T scale = gp ? gp[p] : static_cast<T>(g.value);
          // lse as hi + lo in T: x - hi is exact near the top logits, so softmax keeps
          // float precision even when lse is large.
          const T hi = static_cast<T>(lp[p]), lo = static_cast<T>(lp[p] - double(hi));
          Run<T>(d, classes) = scale * (((x - hi) - lo).exp() - uniform);
          d[t] -= scale * on_target;
        }
      });
    });
  });
  if (l.s == 1) return reshape(drows, logits.sizes());
  return reshape(contiguous(transpose(drows, 1, 2)), logits.sizes());
}

// Positions split across threads; each reads (and its backward writes) one element.
kernels::NllLossForward nll_loss_forward(const Tensor& log_probs, const Tensor& target,
                                         const Tensor& weight, Reduction reduction,
                                         int64_t ignore_index) {
  const char* op = "nll_loss";
  const ClassLayout l = class_layout(log_probs.sizes());
  const Tensor xc = contiguous(log_probs), tc = contiguous(target);
  const Tensor wc = weight.defined() ? contiguous(to_dtype(weight, log_probs.dtype())) : Tensor();
  kernels::NllLossForward out;
  const bool per_position = reduction == Reduction::None;
  out.loss = per_position ? empty(target.sizes(), log_probs.dtype(), log_probs.device())
                          : empty({}, log_probs.dtype(), log_probs.device());
  dispatch_floating(log_probs.dtype(), op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const T* xp = xc.data_ptr<T>();
      const T* wp = wc.defined() ? wc.data_ptr<T>() : nullptr;
      const I* tp = tc.data_ptr<I>();
      // Position p = (b, s): its class weight (0 when ignored) and value at the target.
      auto weight_of = [&](int64_t p) -> double {
        const int64_t t = static_cast<int64_t>(tp[p]);
        return t == ignore_index ? 0.0 : (wp ? double(wp[t]) : 1.0);
      };
      auto loss_of = [&](int64_t p) -> double {
        const int64_t t = static_cast<int64_t>(tp[p]);
        if (t == ignore_index) return 0.0;
        const int64_t b = p / l.s, s = p % l.s;
        return -weight_of(p) * double(xp[(b * l.c + t) * l.s + s]);
      };
      if (per_position) {
        T* lp = out.loss.data_ptr<T>();
        parallel_for(0, l.positions(), kParallelGrain, [&](int64_t lo, int64_t hi) {
          for (int64_t p = lo; p < hi; ++p) lp[p] = static_cast<T>(loss_of(p));
        });
      } else {
        const double total = blocked_sum(l.positions(), 1, [&](int64_t lo, int64_t hi) {
          double s = 0;
          for (int64_t p = lo; p < hi; ++p) s += loss_of(p);
          return s;
        });
        double total_weight = 0;
        for (int64_t p = 0; p < l.positions(); ++p) total_weight += weight_of(p);
        out.total_weight = total_weight;
        // 0 / 0 is NaN when every target is ignored, as PyTorch.
        out.loss.data_ptr<T>()[0] =
            static_cast<T>(reduction == Reduction::Mean ? total / total_weight : total);
      }
    });
  });
  return out;
}

Tensor nll_loss_backward(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                         const Tensor& weight, Reduction reduction, int64_t ignore_index,
                         double total_weight) {
  const char* op = "nll_loss_backward";
  const ClassLayout l = class_layout(input_shape);
  const DType dtype = dloss.dtype();
  const Tensor tc = contiguous(target);
  const Tensor wc = weight.defined() ? contiguous(to_dtype(weight, dtype)) : Tensor();
  const GradScale g = grad_scale(dloss, reduction, total_weight, dtype);
  Tensor dx = zeros(input_shape, dtype, dloss.device());
  dispatch_floating(dtype, op, [&]<typename T>() {
    dispatch_index(target.dtype(), op, [&]<typename I>() {
      const T* wp = wc.defined() ? wc.data_ptr<T>() : nullptr;
      const T* gp = g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr;
      const I* tp = tc.data_ptr<I>();
      T* dp = dx.data_ptr<T>();
      parallel_for(0, l.positions(), kParallelGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) {
          const int64_t t = static_cast<int64_t>(tp[p]);
          if (t == ignore_index) continue;
          const int64_t b = p / l.s, s = p % l.s;
          const T scale = gp ? gp[p] : static_cast<T>(g.value);
          dp[(b * l.c + t) * l.s + s] = -(wp ? wp[t] : T(1)) * scale;
        }
      });
    });
  });
  return dx;
}

// ---------------------------------------------------------------- mse

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  const Tensor xc = contiguous(input), tc = contiguous(target);
  const int64_t n = input.numel();
  const bool per_element = reduction == Reduction::None;
  Tensor out = per_element ? empty(input.sizes(), input.dtype(), input.device())
                           : empty({}, input.dtype(), input.device());
  dispatch_floating(input.dtype(), op, [&]<typename T>() {
    const T *xp = xc.data_ptr<T>(), *tp = tc.data_ptr<T>();
    T* o = out.data_ptr<T>();
    if (per_element) {
      parallel_for(0, n, kParallelGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) o[i] = (xp[i] - tp[i]) * (xp[i] - tp[i]);
      });
      return;
    }
    const double total = blocked_sum(n, 1, [&](int64_t lo, int64_t hi) {
      double s = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const double d = double(xp[i]) - double(tp[i]);
        s += d * d;
      }
      return s;
    });
    o[0] = static_cast<T>(reduction == Reduction::Mean
                              ? (n == 0 ? std::numeric_limits<double>::quiet_NaN() : total / n)
                              : total);
  });
  return out;
}

Tensor mse_loss_backward(const Tensor& dloss, const Tensor& input, const Tensor& target,
                         Reduction reduction) {
  const char* op = "mse_loss_backward";
  const Tensor xc = contiguous(input), tc = contiguous(to_dtype(target, input.dtype()));
  const GradScale g =
      grad_scale(dloss, reduction, static_cast<double>(input.numel()), input.dtype());
  Tensor dx = empty(input.sizes(), input.dtype(), input.device());
  dispatch_floating(input.dtype(), op, [&]<typename T>() {
    const T *xp = xc.data_ptr<T>(), *tp = tc.data_ptr<T>();
    const T* gp = g.per_position.defined() ? g.per_position.data_ptr<T>() : nullptr;
    const T scale = static_cast<T>(2.0 * g.value);
    T* d = dx.data_ptr<T>();
    parallel_for(0, input.numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
      if (gp)
        for (int64_t i = lo; i < hi; ++i) d[i] = T(2) * (xp[i] - tp[i]) * gp[i];
      else
        for (int64_t i = lo; i < hi; ++i) d[i] = scale * (xp[i] - tp[i]);
    });
  });
  return dx;
}

}  // namespace loom::cpu
