// dist/metrics.cpp — RunningTotals and the sums over ranks.

#include "dist/metrics.h"

#include "autograd/graph.h"  // NoGradGuard
#include "autograd/ops.h"

namespace loom::dist {

RunningTotals::RunningTotals(Device device)
    : loss_(zeros({}, kFloat64, device)), correct_(zeros({}, kFloat64, device)) {}

void RunningTotals::add(const Tensor& loss, const Tensor& logits, const Tensor& labels) {
  NoGradGuard no_grad;
  const auto n = labels.size(0);
  loss_ = loss_ + loss.to(kFloat64) * static_cast<double>(n);
  correct_ = correct_ + sum(argmax(logits.to(kFloat32), 1) == labels).to(kFloat64);
  seen_ += static_cast<double>(n);
}

Totals RunningTotals::read() const { return {loss_.item(), correct_.item(), seen_}; }

std::vector<double> sum_over_ranks(const Job& job, std::vector<double> values) {
  if (!job.group) return values;
  Tensor t = tensor<double>(values, {static_cast<int64_t>(values.size())}).to(job.device);
  job.group->allreduce(t, ReduceOp::Sum)->wait();
  return t.to_vector<double>();  // copies from the device
}

Totals sum_over_ranks(const Job& job, const Totals& t) {
  const std::vector<double> v = sum_over_ranks(job, std::vector<double>{t.loss, t.correct, t.seen});
  return {v[0], v[1], v[2]};
}

}  // namespace loom::dist
