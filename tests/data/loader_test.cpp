// tests/data/loader_test.cpp — samplers and the DataLoader: each index once per epoch, the same
// batches whatever the worker count, drop_last, resuming with skip_batches or load_state,
// exceptions from workers, stopping early without deadlock, the wait clock.

#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "data/synthetic.h"
#include "test_util.h"

using namespace loom;
using data::Batch;
using data::DataLoader;
using data::LoaderOptions;

namespace {

// n images [1, 2, 2] whose pixels are all index % 251, labels index % 7.
std::shared_ptr<const data::Dataset> indexed(int64_t n) {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k) pixels.push_back(static_cast<uint8_t>(i % 251));
    labels.push_back(i % 7);
  }
  return std::make_shared<data::TensorDataset>(tensor<uint8_t>(pixels, {n, 1, 2, 2}),
                                               tensor<int64_t>(labels, {n}), 7);
}

// Wraps a dataset: raises IOError at one index, or sleeps in every get.
class Faulty : public data::Dataset {
 public:
  Faulty(std::shared_ptr<const data::Dataset> inner, int64_t bad_index, int sleep_us = 0)
      : inner_(std::move(inner)), bad_index_(bad_index), sleep_us_(sleep_us) {}
  int64_t size() const override { return inner_->size(); }
  data::Example get(int64_t index) const override {
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (index == bad_index_) throw IOError(detail::str("Faulty: bad record ", index));
    return inner_->get(index);
  }
  Shape image_shape() const override { return inner_->image_shape(); }
  int64_t num_classes() const override { return inner_->num_classes(); }

 private:
  std::shared_ptr<const data::Dataset> inner_;
  int64_t bad_index_;
  int sleep_us_;
};

std::vector<Batch> epoch_of(DataLoader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(std::move(*batch));
  return out;
}

LoaderOptions options(int64_t batch_size, int workers, bool shuffle = true, uint64_t seed = 0) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.num_workers = workers;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

data::Pipeline cifar_pipeline() {
  return data::compose(data::RandomCrop(32, 4), data::RandomHorizontalFlip(), data::ToFloat(),
                       data::Normalize({0.49f, 0.48f, 0.45f}, {0.25f, 0.24f, 0.26f}));
}

}  // namespace

TEST(Samplers, PermutationsArePinnedAndPerEpoch) {
  const auto p = data::random_permutation(10, 0, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, data::SequentialSampler(10).indices(3));
  EXPECT_EQ(p, data::RandomSampler(10, 0).indices(0));
  EXPECT_NE(p, data::random_permutation(10, 0, 1));
  EXPECT_NE(p, data::random_permutation(10, 1, 0));
  // Pinned, so that every machine (and every later version) shuffles alike.
  EXPECT_EQ(p, (std::vector<int64_t>{3, 6, 2, 4, 0, 7, 1, 5, 8, 9}));
  EXPECT_TRUE(data::random_permutation(0, 0, 0).empty());
  EXPECT_EQ(data::RandomSampler(5, 0).size(), 5);
}

TEST(DataLoader, EveryIndexOncePerEpochWithItsImageAndLabel) {
  DataLoader loader(indexed(103), data::Pipeline(), options(10, 2));
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  std::vector<int64_t> first_order;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<Batch> batches = epoch_of(loader, epoch);
    ASSERT_EQ(batches.size(), 11u);
    std::multiset<int64_t> seen;
    std::vector<int64_t> order;
    for (size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      EXPECT_EQ(batch.index, static_cast<int64_t>(b));
      EXPECT_EQ(batch.epoch, epoch);
      const int64_t rows = b < 10 ? 10 : 3;
      ASSERT_EQ(batch.images.sizes(), (Shape{rows, 1, 2, 2}));
      ASSERT_EQ(batch.images.dtype(), kFloat32);
      ASSERT_EQ(batch.labels.sizes(), (Shape{rows}));
      const auto pixels = batch.images.to_vector<double>();
      const auto labels = batch.labels.to_vector<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t index = batch.indices[r];
        EXPECT_EQ(labels[r], index % 7);
        EXPECT_EQ(pixels[r * 4 + 3], index % 251);
        seen.insert(index);
        order.push_back(index);
      }
    }
    EXPECT_EQ(seen.size(), 103u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 103u);
    EXPECT_EQ(*seen.rbegin(), 102);
    if (epoch == 0)
      first_order = order;
    else
      EXPECT_NE(order, first_order);  // shuffled anew each epoch
  }
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
}

TEST(DataLoader, SameBatchesWhateverTheWorkerCount) {
  auto dataset = std::make_shared<data::Synthetic>(70, Shape{3, 32, 32}, 10, 1);
  std::vector<std::vector<Batch>> runs;
  for (int workers : {0, 1, 3}) {
    LoaderOptions o = options(16, workers, true, 42);
    o.prefetch_batches = 2;
    DataLoader loader(dataset, cifar_pipeline(), o);
    runs.push_back(epoch_of(loader, 3));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t b = 0; b < runs[0].size(); ++b) {
      EXPECT_EQ(runs[r][b].indices, runs[0][b].indices);
      EXPECT_EQ(runs[r][b].images.to_vector<float>(), runs[0][b].images.to_vector<float>());
      EXPECT_EQ(runs[r][b].labels.to_vector<int64_t>(), runs[0][b].labels.to_vector<int64_t>());
    }
  }
  EXPECT_EQ(runs[0][0].images.sizes(), (Shape{16, 3, 32, 32}));
}

TEST(DataLoader, DropLastAndSequential) {
  LoaderOptions o = options(10, 1, /*shuffle=*/false);
  o.drop_last = true;
  DataLoader loader(indexed(103), data::Pipeline(), o);
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  const auto batches = epoch_of(loader, 0);
  ASSERT_EQ(batches.size(), 10u);
  EXPECT_EQ(batches[9].indices.front(), 90);
  EXPECT_EQ(batches[9].indices.back(), 99);
  o.drop_last = false;
  o.batch_size = 200;
  DataLoader one(indexed(103), data::Pipeline(), o);
  EXPECT_EQ(one.batches_per_epoch(), 1);
  o.drop_last = true;
  DataLoader none(indexed(103), data::Pipeline(), o);
  EXPECT_EQ(none.batches_per_epoch(), 0);
  EXPECT_TRUE(epoch_of(none, 0).empty());
}

TEST(DataLoader, SamplerDecidesTheOrder) {
  class Evens : public data::Sampler {
   public:
    std::vector<int64_t> indices(int64_t epoch) const override {
      std::vector<int64_t> out;
      for (int64_t i = epoch % 2; i < 20; i += 2) out.push_back(i);
      return out;
    }
  };
  DataLoader loader(indexed(20), data::Pipeline(), options(4, 2), std::make_shared<Evens>());
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  const auto batches = epoch_of(loader, 1);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].indices, (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(batches[2].indices, (std::vector<int64_t>{17, 19}));
}

TEST(DataLoader, SkipBatchesResumesTheSameEpoch) {
  auto dataset = std::make_shared<data::Synthetic>(50, Shape{3, 32, 32}, 10, 2);
  DataLoader loader(dataset, cifar_pipeline(), options(8, 2, true, 7));
  const auto full = epoch_of(loader, 2);
  for (int workers : {0, 2}) {
    DataLoader resumed(dataset, cifar_pipeline(), options(8, workers, true, 7));
    const auto tail = epoch_of(resumed, 2, 4);
    ASSERT_EQ(tail.size(), full.size() - 4);
    for (size_t b = 0; b < tail.size(); ++b) {
      EXPECT_EQ(tail[b].index, full[b + 4].index);
      EXPECT_EQ(tail[b].indices, full[b + 4].indices);
      EXPECT_EQ(tail[b].images.to_vector<float>(), full[b + 4].images.to_vector<float>());
    }
  }
  EXPECT_TRUE(epoch_of(loader, 2, loader.batches_per_epoch()).empty());
  EXPECT_LOOM_ERROR(loader.start_epoch(2, 8), ValueError, {"skip_batches 8", "[0, 7]"});
  EXPECT_LOOM_ERROR(loader.start_epoch(-1), ValueError, {"epoch"});
}

TEST(DataLoader, SaveAndLoadState) {
  auto dataset = std::make_shared<data::Synthetic>(40, Shape{1, 4, 4}, 3, 2);
  DataLoader loader(dataset, data::compose(data::RandomHorizontalFlip()), options(6, 2, true, 5));
  loader.start_epoch(1);
  for (int i = 0; i < 3; ++i) loader.next();
  NamedTensors tensors;
  std::map<std::string, std::string> meta;
  loader.save_state(tensors, meta, "loader.");
  EXPECT_EQ(meta["loader.epoch"], "1");
  EXPECT_EQ(meta["loader.batch"], "3");
  const auto expected = loader.next();

  SafetensorsFile file{tensors, meta};
  DataLoader resumed(dataset, data::compose(data::RandomHorizontalFlip()), options(6, 1, true, 5));
  resumed.load_state(file, "loader.");
  EXPECT_EQ(resumed.epoch(), 1);
  const auto got = resumed.next();
  ASSERT_TRUE(got && expected);
  EXPECT_EQ(got->indices, expected->indices);
  EXPECT_EQ(got->images.to_vector<float>(), expected->images.to_vector<float>());

  DataLoader other_seed(dataset, data::Pipeline(), options(6, 1, true, 6));
  EXPECT_LOOM_ERROR(other_seed.load_state(file, "loader."), ValueError, {"seed 5", "seed 6"});
  EXPECT_LOOM_ERROR(resumed.load_state(file, "x."), ValueError, {"x.seed"});
}

TEST(DataLoader, WorkerExceptionsReachNextInOrder) {
  for (int workers : {0, 1, 3}) {
    auto dataset = std::make_shared<Faulty>(indexed(100), /*bad_index=*/53);
    DataLoader loader(dataset, data::Pipeline(), options(10, workers, /*shuffle=*/false));
    loader.start_epoch(0);
    for (int b = 0; b < 5; ++b) ASSERT_TRUE(loader.next().has_value()) << workers;
    EXPECT_LOOM_ERROR(loader.next(), IOError, {"bad record 53"});
    EXPECT_LOOM_ERROR(loader.next(), IOError, {"bad record 53"});  // the epoch stays failed
    // A new epoch starts afresh; skipping past the bad batch works.
    EXPECT_EQ(epoch_of(loader, 0, 6).size(), 4u);
  }
}

TEST(DataLoader, StoppingEarlyJoinsCleanly) {
  auto slow = std::make_shared<Faulty>(indexed(400), -1, /*sleep_us=*/50);
  LoaderOptions o = options(4, 3);
  o.prefetch_batches = 2;
  for (int round = 0; round < 3; ++round) {
    DataLoader loader(slow, data::Pipeline(), o);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    loader.start_epoch(1);  // abandons epoch 0 midway
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
  }  // destroyed with workers blocked on a full window or mid-batch
  DataLoader never_started(slow, data::Pipeline(), o);
  EXPECT_LOOM_ERROR(never_started.next(), ValueError, {"start_epoch"});
}

TEST(DataLoader, WaitClockPerEpoch) {
  auto slow = std::make_shared<Faulty>(indexed(40), -1, /*sleep_us=*/200);
  DataLoader loader(slow, data::Pipeline(), options(10, 1));
  epoch_of(loader, 0);
  EXPECT_GT(loader.wait_seconds(), 0.001);  // 40 slow gets, partly waited for
  loader.start_epoch(1);
  EXPECT_EQ(loader.wait_seconds(), 0.0);
}

TEST(DataLoader, ConstructionErrors) {
  EXPECT_LOOM_ERROR(DataLoader(indexed(10), data::Pipeline(), options(0, 1)), ValueError,
                    {"batch_size"});
  EXPECT_LOOM_ERROR(DataLoader(nullptr, data::Pipeline(), options(1, 1)), ValueError, {"null"});
  EXPECT_LOOM_ERROR(DataLoader(indexed(10), data::compose(data::RandomCrop(3)), options(1, 1)),
                    ShapeError, {"RandomCrop", "[1, 2, 2]"});
}
