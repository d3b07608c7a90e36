// dist/powersgd.h — PowerSGD (Vogels, Karimireddy and Jaggi, 2019) as a DDP communication hook:
// each bucket's matrices travel as two thin low-rank factors instead of their full size, with
// PyTorch's algorithm and options (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
//
// Note [PowerSGD]
// A gradient of shape [n, ...] is read as an n x m matrix M (m its other dimensions' product,
// the bytes as they lie in the bucket). With rank r:
// 1. Error feedback: M += E, the part of the last compressed gradient that did not get through.
// 2. P = M Q (n x r), Q an m x r matrix all ranks hold alike (random at first; with warm start
//    the previous step's Q). Allreduce the P of every matrix in the bucket: one flat buffer.
// 3. Orthonormalise P's columns (Gram-Schmidt). Q = M^T P (m x r); allreduce the Qs.
// 4. The average is approximated by P Q^T / N: the projection of the ranks' summed M onto P's
//    columns, divided by N. E = M - that (this rank's gradient minus the shared approximation).
// A matrix costs (n + m) r elements on the wire instead of n m. Matrices that would not shrink
// min_compression_rate times, and 1-D gradients (biases, norms' affines), are allreduced
// uncompressed in one flat buffer (their error, as PyTorch's, is this rank's value minus the
// average). Before start_powersgd_iter the hook is a plain allreduce: the first steps move
// fast and PowerSGD's approximation is poorest there. Three collectives per bucket, each
// waiting for the last (the uncompressed allreduce and P's go out together): the reducer runs
// the later rounds when backward has ended (PendingReduction::then).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dist/ddp.h"

namespace loom::dist {

// PyTorch's PowerSGDState, its defaults.
struct PowerSGDOptions {
  int matrix_approximation_rank = 1;
  // Plain allreduce for the iterations before this one. With error feedback or warm start it
  // must be 2 or more: the reducer rebuilds its buckets after the first iteration, and the
  // state is kept per bucket.
  int64_t start_powersgd_iter = 1000;
  double min_compression_rate = 2;  // compress a matrix only if n m >= this x (n + m) r
  bool use_error_feedback = true;
  bool warm_start = true;                // start each step's power iteration from the last Q
  double orthogonalization_epsilon = 0;  // added to each column's norm before dividing
  uint64_t random_seed = 0;              // of the first Q (every rank draws the same)
};

// Q's first value for a matrix: standard normals from Philox with `seed`, drawn as `draw`
// (0, 1, ... in the order the hook meets matrices that need one), then orthonormalised.
// [m, r] float64 on the CPU.
Tensor powersgd_initial_q(uint64_t seed, uint64_t draw, int64_t m, int64_t r);

// Gram-Schmidt on the columns of a [n, r] matrix, in place, in float64: each column divided by
// its norm (plus epsilon; a zero column stays zero), then removed from the columns after it.
void orthonormalize_columns(const Tensor& matrix, double epsilon = 0);

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(PowerSGDOptions options = {});
  std::string name() const override;
  PendingReduction start(ProcessGroup& group, GradBucket& bucket) override;

  const PowerSGDOptions& options() const { return options_; }
  int64_t iterations() const { return iterations_; }  // the hook's, counted at each last bucket
  // Elements this hook put on the wire in the last step, and the gradients' elements: their
  // ratio is the compression (1 before start_powersgd_iter).
  int64_t elements_sent() const { return sent_; }
  int64_t elements_in() const { return total_; }

 private:
  struct BucketState {
    Tensor error;  // E, the bucket's shape
    Tensor q;      // every compressed matrix's Q, back to back (warm start)
  };
  PowerSGDOptions options_;
  std::map<int, BucketState> state_;
  int64_t iterations_ = 0;
  uint64_t draws_ = 0;
  int64_t sent_ = 0, total_ = 0, sending_ = 0, counting_ = 0;
};

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options = {});

}  // namespace loom::dist
