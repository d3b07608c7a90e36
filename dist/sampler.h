// dist/sampler.h — DistributedSampler: each rank's share of a dataset for one epoch, as
// PyTorch's DistributedSampler: one permutation of the whole dataset from (seed, epoch), the
// same on every rank; padded by repeating its start (or, with drop_last, cut) to a multiple of
// the world size; rank r takes positions r, r + W, r + 2W, ... Every rank gets the same number
// of samples, so every rank takes the same number of steps (collectives stay matched).
// ShardSampler: the evaluation form, rank r takes samples r, r + W, ... with no padding, so that
// metrics summed over ranks count every sample exactly once.
#pragma once

#include <cstdint>
#include <vector>

#include "data/loader.h"

namespace loom::dist {

class DistributedSampler : public data::Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  // The epoch plays the role of PyTorch's set_epoch: the loader passes it (start_epoch).
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return per_rank_; }  // samples per rank per epoch

 private:
  int64_t n_;
  int rank_, world_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t per_rank_;
};

// Rank r of W takes samples r, r + W, ... of n, in order: every sample once over all ranks (no
// padding, so ranks may get one sample more or less: for evaluation, not for training steps).
class ShardSampler : public data::Sampler {
 public:
  ShardSampler(int64_t dataset_size, int rank, int world_size);
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
  int rank_, world_;
};

}  // namespace loom::dist
