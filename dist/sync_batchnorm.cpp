// dist/sync_batchnorm.cpp — SyncBatchNorm's forward and backward (Note [SyncBatchNorm]).

#include "dist/sync_batchnorm.h"

#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph.h"
#include "tensor/accelerator.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/index.h"
#include "tensor/norm.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom::dist {

namespace k = kernels;
using autograd::Grads;
using autograd::Saved;

namespace {

// The global batch must hold more than one value per channel. A rank holding more than one
// itself knows that without looking (the common case: no wait). A rank holding at most one
// reads the global count, waiting for the device if it is there; where the check fails every
// rank holds at most one, so every rank reads and raises here, at the same layer, before the
// running statistics change (a rank raising while another went on to the next collective
// would leave that one waiting).
void check_total(const char* op, int64_t count, const Tensor& total, const Tensor& x) {
  if (count > 1) return;
  double value = 0;
  {
    DeferredChecksHold hold;  // an earlier op's check must not throw on some ranks only
    value = total.item<double>();
  }
  LOOM_CHECK(value > 1, ValueError, op,
             ": expected more than 1 value per channel over all ranks when training; got ", value,
             " (x=", x.sizes(), " on this rank)");
}

class ProcessGroupBatchNormSync : public nn::BatchNormSync {
 public:
  explicit ProcessGroupBatchNormSync(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}

  Tensor forward(nn::BatchNorm2d& bn, const Tensor& input) override {
    const char* op = "SyncBatchNorm";
    // batch_norm's dtypes (Note [Autocast policy]): a 16-bit CUDA x keeps its dtype (the pieces
    // compute in float, with float32 statistics); an autocast region on the CPU widens it.
    const Tensor x = autocast::sync_batch_norm_input(input);
    LOOM_CHECK(x.dim() == 4 && x.size(1) == bn.num_features, ShapeError, op, ": expected x [N, ",
               bn.num_features, ", H, W]; got x=", x.sizes());
    // The parameters and running statistics must be in batch norm's dtype for x. In an autocast
    // region 16-bit weight and bias (FSDP's mixed precision, Note [FSDP mixed precision]) are
    // widened as the plain batch norm widens them, through a cast whose backward narrows their
    // gradients; other dtypes are refused.
    const DType pd = k::batch_norm_param_dtype(x.dtype());
    const auto widened = [&](const Tensor& t) {
      return t.defined() && autocast::is_enabled() && is_16bit_float(t.dtype()) && t.dtype() != pd
                 ? t.to(pd)
                 : t;
    };
    const Tensor weight = widened(bn.weight), bias = widened(bn.bias);
    for (const auto& [name, t] :
         {std::pair{"weight", weight}, std::pair{"bias", bias},
          std::pair{"running_mean", bn.running_mean}, std::pair{"running_var", bn.running_var}})
      LOOM_CHECK(!t.defined() || t.dtype() == pd, DTypeError, op, ": expected ", name, " in ", pd,
                 " for x of dtype ", x.dtype(), "; got ", t.dtype(), " (x=", x.sizes(), ")");
    const int64_t c = bn.num_features;
    const int world = group_->size();

    // This rank's count, mean and biased variance per channel, as one float64 row
    // [count, mean_0..mean_C-1, var_0..var_C-1] for the allgather: float64 moments, rounded to
    // x's dtype only once combined (Note [SyncBatchNorm and world-size invariance]).
    const int64_t count = x.size(0) * x.size(2) * x.size(3);
    // The rows travel on x's device (nccl needs GPU tensors) and are combined there.
    Tensor mine = zeros({2 * c + 1}, kFloat64, x.device());
    if (count > 0) {
      const k::BatchNormStats local = k::batch_norm_stats(x, bn.options.eps, kFloat64);
      k::copy_(k::narrow(mine, 0, 1, c), local.mean);
      k::copy_(k::narrow(mine, 0, 1 + c, c), local.var);
    }
    k::fill_(k::narrow(mine, 0, 0, 1), static_cast<double>(count));
    std::vector<Tensor> rows;
    for (int r = 0; r < world; ++r) rows.push_back(empty({2 * c + 1}, kFloat64, x.device()));
    group_->allgather(rows, mine)->wait();

    // Combine, on x's device (with nccl the host does not wait): N = sum n_r, w_r = n_r / N,
    // mean = sum w_r mean_r and var = sum w_r (var_r + (mean_r - mean)^2).
    const Tensor all = k::view(k::cat(rows, 0), {world, 2 * c + 1});
    const Tensor n = k::narrow(all, 1, 0, 1);  // [W, 1]
    const Tensor total = k::sum(n);            // [] float64
    check_total(op, count, total, x);
    const Tensor w = k::div(n, total);
    const Tensor means = k::narrow(all, 1, 1, c), vars = k::narrow(all, 1, 1 + c, c);
    const Tensor mean = k::sum(k::mul(w, means), {0});
    const Tensor spread = k::sub(means, mean);
    const Tensor var = k::sum(k::mul(w, k::add(vars, k::mul(spread, spread))), {0});

    // As batch_norm_forward_train: y from the float64 mean and invstd, backward from them
    // rounded to pd.
    const Tensor invstd = k::batch_norm_invstd(var, bn.options.eps);  // float64
    k::BatchNormStats stats;
    stats.mean = k::to_dtype(mean, pd);
    stats.var = k::to_dtype(var, pd);
    stats.invstd = k::to_dtype(invstd, pd);
    if (bn.running_mean.defined()) {
      // running = (1 - momentum) running + momentum stat, with the unbiased variance
      // var N / (N - 1), as batch_norm_update_running_stats_ computes it from a host count.
      NoGradGuard no_grad;
      const double m = bn.options.momentum;
      const auto update = [m](const Tensor& running, const Tensor& stat) {
        k::copy_(running,
                 k::add(k::mul_scalar(running, 1.0 - m), k::to_dtype(stat, running.dtype()), m));
      };
      update(bn.running_mean, mean);
      update(bn.running_var, k::mul(var, k::div(total, k::add_scalar(total, -1.0))));
    }

    Tensor y = k::batch_norm_elemt(x, mean, invstd, weight, bias);
    std::shared_ptr<ProcessGroup> group = group_;
    // d SyncBatchNorm: dx = weight invstd (dy - sum(dy)/N - x_hat sum(dy x_hat)/N), with the
    // sums over every rank (one allreduce); dweight = sum(dy x_hat), dbias = sum(dy) locally.
    // The local sums are float64 and stay so through the allreduce and into backward_elemt;
    // the global sums are divided by N on the device and given to backward_elemt as the sums
    // over a count of 1: N stays on the device.
    return autograd::record(
        "sync_batch_norm", y, {x, weight, bias},
        /*save=*/{x, weight, stats.mean, stats.invstd, total},
        [group, c, pd](const Grads& dout, Saved& s, Grads& g) {
          const Tensor& dy = dout[0];
          auto [sum_dy, sum_dy_xhat] = k::batch_norm_backward_reduce(dy, s[0], s[2], s[3]);
          if (s.needs_grad(1)) g[1] = k::to_dtype(sum_dy_xhat, pd);
          if (s.needs_grad(2)) g[2] = k::to_dtype(sum_dy, pd);
          Tensor both = k::cat({sum_dy, sum_dy_xhat}, 0);  // float64
          group->allreduce(both, ReduceOp::Sum)->wait();
          if (s.needs_grad(0)) {
            const Tensor means = k::div(both, s[4]);  // sum(dy)/N, sum(dy x_hat)/N
            g[0] =
                k::batch_norm_backward_elemt(dy, s[0], s[2], s[3], s[1], k::narrow(means, 0, 0, c),
                                             k::narrow(means, 0, c, c), 1);
          }
        });
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::shared_ptr<nn::BatchNormSync> make_batchnorm_sync(std::shared_ptr<ProcessGroup> group) {
  LOOM_CHECK(group != nullptr, ValueError, "SyncBatchNorm: the process group is null");
  return std::make_shared<ProcessGroupBatchNormSync>(std::move(group));
}

int convert_sync_batchnorm(nn::Module& model, std::shared_ptr<ProcessGroup> group) {
  std::shared_ptr<nn::BatchNormSync> sync = make_batchnorm_sync(std::move(group));
  int converted = 0;
  model.apply([&](nn::Module& m) {
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
      bn->set_sync(sync);
      ++converted;
    }
  });
  return converted;
}

}  // namespace loom::dist
