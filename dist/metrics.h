// dist/metrics.h — a classifier's metrics as sums (loss x samples, correct predictions, samples)
// so that ranks can add theirs up with one allreduce: the mean loss and the accuracy of the whole
// job are those of the summed totals, whatever share each rank saw.
#pragma once

#include <vector>

#include "dist/job.h"
#include "tensor/tensor.h"

namespace loom::dist {

// Sums over the samples a rank saw.
struct Totals {
  double loss = 0, correct = 0, seen = 0;
  double mean_loss() const { return seen > 0 ? loss / seen : 0.0; }
  double accuracy() const { return seen > 0 ? correct / seen : 0.0; }
};

// Totals summed where the logits are: reading a number back from a GPU waits for all its queued
// work, so the sums stay on the device until someone reads them.
class RunningTotals {
 public:
  explicit RunningTotals(Device device);
  // `loss` is the batch's mean (a 0-d tensor), logits [N, classes], labels [N].
  void add(const Tensor& loss, const Tensor& logits, const Tensor& labels);
  double seen() const { return seen_; }
  Totals read() const;  // waits for the device

 private:
  Tensor loss_, correct_;
  double seen_ = 0;
};

// Element-wise sums over the job's ranks of a few numbers (an allreduce on the rank's device,
// which nccl needs); the numbers themselves in a job of one. Call on every rank.
std::vector<double> sum_over_ranks(const Job& job, std::vector<double> values);
Totals sum_over_ranks(const Job& job, const Totals& totals);

}  // namespace loom::dist
