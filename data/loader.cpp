// data/loader.cpp — samplers and the DataLoader. Workers claim batch numbers in order from a
// shared counter, build them without holding the lock, and park them in a ring of
// prefetch_batches slots; next() takes the slot of the batch it wants, so batches come out in
// order however the workers interleave.

#include "data/loader.h"

#include <chrono>
#include <numeric>
#include <utility>

namespace loom::data {

// ---------------------------------------------------------------- samplers

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  LOOM_CHECK(n >= 0, ValueError, "SequentialSampler: expected n >= 0; got ", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  LOOM_CHECK(n >= 0, ValueError, "RandomSampler: expected n >= 0; got ", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return random_permutation(n_, seed_, epoch);
}

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  LOOM_CHECK(n >= 0 && epoch >= 0, ValueError,
             "random_permutation: expected n >= 0 and epoch >= 0; got n=", n, " epoch=", epoch);
  std::vector<int64_t> out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  PhiloxStream stream(philox_key(seed, kShufflePurpose), 0, static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) std::swap(out[i], out[stream.randint(i + 1)]);
  return out;
}

// ---------------------------------------------------------------- DataLoader

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, Pipeline transforms,
                       LoaderOptions options, std::shared_ptr<const Sampler> sampler)
    : dataset_(std::move(dataset)),
      pipeline_(std::move(transforms)),
      options_(options),
      sampler_(std::move(sampler)) {
  LOOM_CHECK(dataset_ != nullptr, ValueError, "DataLoader: the dataset is null");
  LOOM_CHECK(
      options_.batch_size >= 1 && options_.num_workers >= 0 && options_.prefetch_batches >= 1,
      ValueError,
      "DataLoader: expected batch_size >= 1, num_workers >= 0 and prefetch_batches >= 1; "
      "got batch_size=",
      options_.batch_size, " num_workers=", options_.num_workers,
      " prefetch_batches=", options_.prefetch_batches);
  image_shape_ = dataset_->image_shape();
  sample_shape_ = pipeline_.output_shape(image_shape_);
  if (!sampler_) {
    if (options_.shuffle)
      sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    else
      sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  }
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = epoch_ >= 0 ? static_cast<int64_t>(order_.size()) : sampler_->size();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  LOOM_CHECK(epoch >= 0, ValueError, "DataLoader::start_epoch: expected epoch >= 0; got ", epoch);
  std::vector<int64_t> order = sampler_->indices(epoch);
  const int64_t n = static_cast<int64_t>(order.size()), b = options_.batch_size;
  const int64_t batches = options_.drop_last ? n / b : (n + b - 1) / b;
  LOOM_CHECK(skip_batches >= 0 && skip_batches <= batches, ValueError,
             "DataLoader::start_epoch: skip_batches ", skip_batches, " is outside [0, ", batches,
             "] for an epoch of ", batches, " batches");
  stop_workers();

  epoch_ = epoch;
  order_ = std::move(order);
  num_batches_ = batches;
  wait_seconds_ = 0;
  failed_ = nullptr;
  slots_.assign(static_cast<size_t>(options_.prefetch_batches), Slot{});
  next_claim_ = next_yield_ = skip_batches;
  stop_ = false;
  const int64_t workers = std::min<int64_t>(options_.num_workers, batches - skip_batches);
  for (int64_t w = 0; w < workers; ++w) workers_.emplace_back([this] { worker_loop(); });
}

std::optional<Batch> DataLoader::next() {
  LOOM_CHECK(epoch_ >= 0, ValueError, "DataLoader::next: call start_epoch(epoch) first");
  if (failed_) std::rethrow_exception(failed_);
  if (next_yield_ >= num_batches_) return std::nullopt;

  const auto start = std::chrono::steady_clock::now();
  std::optional<Batch> batch;
  std::exception_ptr error;
  if (workers_.empty()) {
    try {
      batch = build_batch(next_yield_);
    } catch (...) {
      error = std::current_exception();
    }
    ++next_yield_;
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slots_[static_cast<size_t>(next_yield_ % options_.prefetch_batches)];
    ready_.wait(lock, [&] { return slot.ready; });
    batch = std::move(slot.batch);
    error = slot.error;
    slot = Slot{};
    ++next_yield_;
    lock.unlock();
    room_.notify_all();  // the window moved: a worker may claim one more batch
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (error) {
    failed_ = error;
    stop_workers();
    std::rethrow_exception(error);
  }
  return batch;
}

void DataLoader::worker_loop() {
  const int64_t window = options_.prefetch_batches;
  while (true) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      room_.wait(lock, [&] {
        return stop_ || next_claim_ >= num_batches_ || next_claim_ < next_yield_ + window;
      });
      if (stop_ || next_claim_ >= num_batches_) return;
      b = next_claim_++;
    }
    Slot slot;
    slot.ready = true;
    try {
      slot.batch = build_batch(b);
      if (!slot.batch) return;  // stopped
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_[static_cast<size_t>(b % window)] = std::move(slot);
    }
    ready_.notify_all();
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  room_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

// Batch b of the current epoch, or nullopt when stop_ was raised while building it.
std::optional<Batch> DataLoader::build_batch(int64_t b) const {
  const int64_t begin = b * options_.batch_size;
  const int64_t count =
      std::min<int64_t>(options_.batch_size, static_cast<int64_t>(order_.size()) - begin);
  Batch batch;
  batch.epoch = epoch_;
  batch.index = b;
  batch.indices.assign(order_.begin() + begin, order_.begin() + begin + count);
  batch.images = empty({count, sample_shape_[0], sample_shape_[1], sample_shape_[2]}, kFloat32);
  batch.labels = empty({count}, kInt64);
  float* images = batch.images.data_ptr<float>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  const int64_t sample_numel = shape_numel(sample_shape_);
  for (int64_t k = 0; k < count; ++k) {
    if (stop_.load(std::memory_order_relaxed)) return std::nullopt;
    const int64_t index = batch.indices[k];
    const Example example = dataset_->get(index);
    LOOM_CHECK(example.image.defined() && example.image.sizes() == image_shape_, ShapeError,
               "DataLoader: example ", index, " has an image of shape ",
               example.image.defined() ? example.image.sizes() : Shape{},
               " but the dataset's image_shape() is ", image_shape_);
    SampleRng rng(options_.seed, epoch_, index);
    pipeline_.apply(example, rng, images + k * sample_numel);
    labels[k] = example.label;
  }
  return batch;
}

// ---------------------------------------------------------------- checkpoint state

void DataLoader::save_state(NamedTensors&, std::map<std::string, std::string>& meta,
                            const std::string& prefix) const {
  meta[prefix + "epoch"] = std::to_string(std::max<int64_t>(epoch_, 0));
  meta[prefix + "batch"] = std::to_string(epoch_ >= 0 ? next_yield_ : 0);
  meta[prefix + "seed"] = std::to_string(options_.seed);
  meta[prefix + "batch_size"] = std::to_string(options_.batch_size);
}

void DataLoader::load_state(const SafetensorsFile& file, const std::string& prefix) {
  auto number = [&](const std::string& name) -> uint64_t {
    const std::string key = prefix + name;
    const auto it = file.metadata.find(key);
    LOOM_CHECK(it != file.metadata.end(), ValueError, "DataLoader::load_state: no metadata key \"",
               key, "\"");
    try {
      size_t used = 0;
      const uint64_t value = std::stoull(it->second, &used);
      if (used == it->second.size()) return value;
    } catch (const std::exception&) {
    }
    throw ValueError(detail::str("DataLoader::load_state: \"", key, "\" is \"", it->second,
                                 "\", not a non-negative integer"));
  };
  const uint64_t seed = number("seed");
  const int64_t batch_size = static_cast<int64_t>(number("batch_size"));
  LOOM_CHECK(seed == options_.seed && batch_size == options_.batch_size, ValueError,
             "DataLoader::load_state: the checkpoint was written with seed ", seed,
             " and batch_size ", batch_size, "; this loader has seed ", options_.seed,
             " and batch_size ", options_.batch_size, " (its batches would differ)");
  start_epoch(static_cast<int64_t>(number("epoch")), static_cast<int64_t>(number("batch")));
}

}  // namespace loom::data
