// dist/sync_batchnorm.cpp — SyncBatchNorm's forward and backward (Note [SyncBatchNorm]).

#include "dist/sync_batchnorm.h"

#include <cmath>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/cuda/runtime.h"
#include "tensor/elementwise.h"
#include "tensor/index.h"
#include "tensor/norm.h"
#include "tensor/view.h"

namespace loom::dist {

namespace k = kernels;
using autograd::Grads;
using autograd::Saved;

namespace {

class ProcessGroupBatchNormSync : public nn::BatchNormSync {
 public:
  explicit ProcessGroupBatchNormSync(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}

  Tensor forward(nn::BatchNorm2d& bn, const Tensor& x) override {
    // A norm: float32 under autocast (Note [Autocast policy]).
    if (autocast::needs_float32({x})) return forward(bn, autocast::to_float32(x));
    const char* op = "SyncBatchNorm";
    LOOM_CHECK(x.dim() == 4 && x.size(1) == bn.num_features, ShapeError, op, ": expected x [N, ",
               bn.num_features, ", H, W]; got x=", x.sizes());
    const int64_t c = bn.num_features;
    const int world = group_->size();

    // This rank's count, mean and biased variance per channel, as one float64 row
    // [count, mean_0..mean_C-1, var_0..var_C-1] for the allgather.
    const int64_t count = x.size(0) * x.size(2) * x.size(3);
    // The rows travel on x's device (nccl needs GPU tensors) and are combined on the host.
    Tensor mine = zeros({2 * c + 1}, kFloat64, x.device());
    if (count > 0) {
      const k::BatchNormStats local = k::batch_norm_stats(x, bn.options.eps);
      k::copy_(k::narrow(mine, 0, 1, c), local.mean);
      k::copy_(k::narrow(mine, 0, 1 + c, c), local.var);
    }
    k::fill_(k::narrow(mine, 0, 0, 1), static_cast<double>(count));
    std::vector<Tensor> rows;
    for (int r = 0; r < world; ++r) rows.push_back(empty({2 * c + 1}, kFloat64, x.device()));
    group_->allgather(rows, mine)->wait();
    {
      cuda::DeferredChecksHold hold;  // every rank must combine (Note [Deferred device checks])
      for (Tensor& row : rows) row = row.to(kCPU);
    }

    // Combine: N = sum n_r; mean = sum n_r mean_r / N; var = sum n_r (var_r + (mean_r - mean)^2) /
    // N.
    std::vector<double> n(static_cast<size_t>(world));
    double total = 0;
    for (int r = 0; r < world; ++r) total += n[r] = rows[r].data_ptr<double>()[0];
    LOOM_CHECK(total > 1, ValueError, op,
               ": expected more than 1 value per channel over all ranks when training; got ", total,
               " (x=", x.sizes(), " on this rank)");
    std::vector<double> mean(static_cast<size_t>(c), 0.0), var(static_cast<size_t>(c), 0.0);
    for (int r = 0; r < world; ++r) {
      const double* row = rows[r].data_ptr<double>();
      for (int64_t j = 0; j < c; ++j) mean[j] += n[r] * row[1 + j] / total;
    }
    for (int r = 0; r < world; ++r) {
      const double* row = rows[r].data_ptr<double>();
      for (int64_t j = 0; j < c; ++j) {
        const double d = row[1 + j] - mean[j];
        var[j] += n[r] * (row[1 + c + j] + d * d) / total;
      }
    }
    k::BatchNormStats stats;
    stats.count = static_cast<int64_t>(total);
    stats.mean = k::to_dtype(tensor<double>(mean, {c}).to(x.device()), x.dtype());
    stats.var = k::to_dtype(tensor<double>(var, {c}).to(x.device()), x.dtype());
    stats.invstd = k::batch_norm_invstd(stats.var, bn.options.eps);
    if (bn.running_mean.defined()) {
      NoGradGuard no_grad;
      k::batch_norm_update_running_stats_(bn.running_mean, bn.running_var, stats,
                                          bn.options.momentum);
    }

    Tensor y = k::batch_norm_elemt(x, stats.mean, stats.invstd, bn.weight, bn.bias);
    std::shared_ptr<ProcessGroup> group = group_;
    const int64_t global_count = stats.count;
    // d SyncBatchNorm: dx = weight invstd (dy - sum(dy)/N - x_hat sum(dy x_hat)/N), with the
    // sums over every rank (one allreduce); dweight = sum(dy x_hat), dbias = sum(dy) locally.
    return autograd::record(
        "sync_batch_norm", y, {x, bn.weight, bn.bias},
        /*save=*/{x, bn.weight, stats.mean, stats.invstd},
        [group, global_count, c](const Grads& dout, Saved& s, Grads& g) {
          const Tensor& dy = dout[0];
          auto [sum_dy, sum_dy_xhat] = k::batch_norm_backward_reduce(dy, s[0], s[2], s[3]);
          if (s.needs_grad(1)) g[1] = k::clone(sum_dy_xhat);
          if (s.needs_grad(2)) g[2] = k::clone(sum_dy);
          Tensor both =
              k::cat({k::to_dtype(sum_dy, kFloat64), k::to_dtype(sum_dy_xhat, kFloat64)}, 0);
          group->allreduce(both, ReduceOp::Sum)->wait();
          if (s.needs_grad(0))
            g[0] = k::batch_norm_backward_elemt(
                dy, s[0], s[2], s[3], s[1], k::to_dtype(k::narrow(both, 0, 0, c), dy.dtype()),
                k::to_dtype(k::narrow(both, 0, c, c), dy.dtype()), global_count);
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
