// data/loader.h — samplers (the order of an epoch) and the DataLoader: worker threads turn
// dataset examples into float32 batches ahead of the trainer, in order, through a bounded queue.
// Everything a batch holds is a function of (seed, epoch, batch index) alone: see Note [Loader
// determinism].
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"
#include "tensor/safetensors.h"

namespace loom::data {

// Note [Loader determinism]
// The sampler gives the epoch's dataset indices as a function of (its seed, epoch); batch b is
// indices [b * batch_size, (b + 1) * batch_size); each example's augmentation draws come from
// SampleRng(seed, epoch, dataset index) (Note [Sample randomness]). So the batches are the same
// with 0, 1 or 8 workers, on every machine, and a run resumed at (epoch, batch) with
// start_epoch(epoch, batch) sees exactly the batches the interrupted run would have seen.

// The dataset indices of an epoch, in order.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // How many indices every epoch has; by default the length of epoch 0's list.
  virtual int64_t size() const { return static_cast<int64_t>(indices(0).size()); }
};

// 0, 1, ..., n - 1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of [0, n) per epoch, from random_permutation(n, seed, epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// Fisher-Yates driven by a PhiloxStream keyed by philox_key(seed, kShufflePurpose), subsequence
// `epoch`: the same permutation on every machine and thread count. DistributedSampler uses it.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;       // RandomSampler(n, seed) when no sampler is given, else sequential
  bool drop_last = false;    // drop the last, smaller batch
  uint64_t seed = 0;         // shuffling and augmentation
  int num_workers = 2;       // worker threads; 0 builds each batch inside next()
  int prefetch_batches = 4;  // batches built or being built ahead of the consumer, at most
};

struct Batch {
  Tensor images;                 // float32 [B, C, H, W], the pipeline's output
  Tensor labels;                 // int64 [B]
  std::vector<int64_t> indices;  // the dataset index of each row
  int64_t epoch = 0;
  int64_t index = 0;  // the batch's position in its epoch
};

// for (int64_t epoch = start; epoch < epochs; ++epoch) {
//   loader.start_epoch(epoch);
//   while (auto batch = loader.next()) train_step(batch->images, batch->labels);
// }
// A worker's exception (IOError from a reader, ...) is rethrown by next() when the consumer
// reaches the batch it was building, and again by every later next() of that epoch. Stopping
// early (start_epoch again, or destruction) stops and joins the workers.
class DataLoader {
 public:
  // A given sampler decides the order (shuffle is then ignored); its indices must lie in the
  // dataset. The pipeline's output shape is checked against the dataset's image shape here.
  DataLoader(std::shared_ptr<const Dataset> dataset, Pipeline transforms, LoaderOptions options,
             std::shared_ptr<const Sampler> sampler = nullptr);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts (or restarts) an epoch at batch `skip_batches` (for resuming; 0 .. batches_per_epoch).
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The epoch's next batch, in order; nullopt at the end of the epoch. ValueError before the
  // first start_epoch.
  std::optional<Batch> next();

  int64_t batches_per_epoch() const;
  Shape sample_shape() const { return sample_shape_; }  // the pipeline's [C, H, W]
  int64_t epoch() const { return epoch_; }              // -1 before start_epoch
  int64_t position() const { return next_yield_; }      // batches next() returned this epoch
  // Seconds next() spent waiting for (or, with no workers, building) batches this epoch.
  double wait_seconds() const { return wait_seconds_; }
  const LoaderOptions& options() const { return options_; }

  // The checkpoint convention (CONTEXT.md): meta[prefix + "epoch" | "batch" | "seed" |
  // "batch_size"]. load_state restarts at that epoch and batch; ValueError when a key is absent
  // or the seed or batch size differ from this loader's (the batches would not be the same).
  void save_state(NamedTensors& tensors, std::map<std::string, std::string>& meta,
                  const std::string& prefix) const;
  void load_state(const SafetensorsFile& file, const std::string& prefix);

 private:
  struct Slot {
    bool ready = false;
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  std::optional<Batch> build_batch(int64_t b) const;
  void worker_loop();
  void stop_workers();

  std::shared_ptr<const Dataset> dataset_;
  Pipeline pipeline_;
  LoaderOptions options_;
  std::shared_ptr<const Sampler> sampler_;
  Shape image_shape_;   // the dataset's
  Shape sample_shape_;  // the pipeline's output

  // The epoch; written only by the consumer while no worker runs.
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t num_batches_ = 0;
  double wait_seconds_ = 0;
  std::exception_ptr failed_;  // the error next() rethrows for the rest of the epoch

  // Shared with the workers, under mutex_. Batch b goes to slots_[b % prefetch_batches]; a
  // worker claims b only when b < next_yield_ + prefetch_batches, so the slot is free.
  std::mutex mutex_;
  std::condition_variable room_;   // workers wait for the window to move
  std::condition_variable ready_;  // next() waits for its batch
  std::vector<Slot> slots_;
  int64_t next_claim_ = 0;
  int64_t next_yield_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

}  // namespace loom::data
