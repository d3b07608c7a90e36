// dist/sampler.cpp — DistributedSampler and ShardSampler.

#include "dist/sampler.h"

#include <numeric>

namespace loom::dist {

DistributedSampler::DistributedSampler(int64_t n, int rank, int world, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), rank_(rank), world_(world), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  LOOM_CHECK(n >= 0 && world >= 1 && rank >= 0 && rank < world, ValueError,
             "DistributedSampler: expected n >= 0 and 0 <= rank < world_size; got n=", n,
             " rank=", rank, " world_size=", world);
  per_rank_ = drop_last ? n / world : (n + world - 1) / world;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = data::random_permutation(n_, seed_, epoch);
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const int64_t total = per_rank_ * world_;
  // Pad by repeating the permutation from its start (as often as needed), or cut.
  for (int64_t i = 0; static_cast<int64_t>(all.size()) < total; ++i) all.push_back(all[i]);
  all.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

ShardSampler::ShardSampler(int64_t n, int rank, int world) : n_(n), rank_(rank), world_(world) {
  LOOM_CHECK(n >= 0 && world >= 1 && rank >= 0 && rank < world, ValueError,
             "ShardSampler: expected n >= 0 and 0 <= rank < world_size; got n=", n, " rank=", rank,
             " world_size=", world);
}

std::vector<int64_t> ShardSampler::indices(int64_t) const {
  std::vector<int64_t> out;
  for (int64_t i = rank_; i < n_; i += world_) out.push_back(i);
  return out;
}

}  // namespace loom::dist
