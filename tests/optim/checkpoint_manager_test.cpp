// tests/optim/checkpoint_manager_test.cpp — CheckpointManager: epoch files linked as last,
// keep_last, saves only on the writer, last written only when the state changed, resume after
// a restart (LOOM_RESTART_COUNT), and resuming at another world size (Note [Resuming at another
// world size]).

#include "optim/checkpoint_manager.h"

#include <stdlib.h>

#include <filesystem>

#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace loom::optim {
namespace {

namespace fs = std::filesystem;

class Manager : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = nn::make<nn::Linear>(3, 2);
    optimizer_ = std::make_unique<SGD>(model_->parameters(), SGDOptions{.lr = 0.1});
  }
  void TearDown() override { unsetenv("LOOM_RESTART_COUNT"); }
  CheckpointManager manager(int world, bool writer = true, int keep_last = 0) {
    return CheckpointManager(
        {.dir = dir_.string(), .writer = writer, .keep_last = keep_last, .world_size = world},
        *model_, *optimizer_, nullptr, nullptr, {{"model", "Linear"}});
  }
  test::ScratchDir scratch_;  // Note [Test scratch directories]
  const fs::path dir_ = scratch_.path();
  nn::ModulePtr model_;
  std::unique_ptr<SGD> optimizer_;
};

TEST_F(Manager, EpochFilesAreLinkedAsLastAndTheOldestRemoved) {
  CheckpointManager m = manager(1, true, /*keep_last=*/2);
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {
    m.changed();
    m.save_epoch({.epoch = epoch, .step = epoch * 10});
  }
  EXPECT_FALSE(fs::exists(dir_ / "epoch-001.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "epoch-002.safetensors"));
  EXPECT_TRUE(fs::equivalent(dir_ / "epoch-003.safetensors", dir_ / "last.safetensors"));
  const Metadata meta = read_checkpoint_metadata(m.last_path());
  EXPECT_EQ(meta.at("world_size"), "1");
  EXPECT_EQ(meta.at("model"), "Linear");
  // Nothing changed since epoch 3: save_last writes nothing new.
  const auto before = fs::last_write_time(m.last_path());
  m.save_last({.epoch = 3, .step = 30});
  EXPECT_TRUE(fs::equivalent(dir_ / "epoch-003.safetensors", dir_ / "last.safetensors"));
  EXPECT_EQ(fs::last_write_time(m.last_path()), before);
}

TEST_F(Manager, OnlyTheWriterWrites) {
  CheckpointManager m = manager(2, /*writer=*/false);
  m.save_epoch({.epoch = 1});
  m.changed();
  m.save_last({.epoch = 1, .step = 3});
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(Manager, ARestartedJobResumesFromLast) {
  CheckpointManager m = manager(1);
  EXPECT_EQ(m.resume_path(""), "");
  m.changed();
  m.save_last({.epoch = 0, .step = 4, .batch = 4});
  EXPECT_EQ(m.resume_path(""), "");  // not restarted
  setenv("LOOM_RESTART_COUNT", "1", 1);
  EXPECT_EQ(m.resume_path(""), m.last_path());
  EXPECT_EQ(m.resume_path("other.safetensors"), "other.safetensors");
  const Resumed r = m.resume("", *model_, optimizer_.get(), nullptr, nullptr);
  EXPECT_EQ(r.path, m.last_path());
  EXPECT_EQ(r.progress.step, 4);
  EXPECT_EQ(r.progress.batch, 4);
}

TEST_F(Manager, ResumesAtAnotherWorldSizeWhereTheBatchesDivide) {
  manager(2).save_last({.epoch = 1, .step = 9, .batch = 3});  // 3 batches of 2 ranks
  const std::string path = manager(2).last_path();
  // 4 ranks cannot continue after 3 x 2 batches; 3 ranks and 1 rank can.
  EXPECT_LOOM_ERROR(manager(4).resume(path, *model_, optimizer_.get(), nullptr, nullptr),
                    ValueError, {"written by 2 ranks", "not a multiple of 4"});
  EXPECT_EQ(manager(3).resume(path, *model_, optimizer_.get(), nullptr, nullptr).progress.batch, 2);
  EXPECT_EQ(manager(1).resume(path, *model_, optimizer_.get(), nullptr, nullptr).progress.batch, 6);
  // At the end of an epoch any world size continues.
  manager(2).save_last({.epoch = 2, .step = 12, .batch = 0});
  EXPECT_EQ(manager(4).resume(path, *model_, optimizer_.get(), nullptr, nullptr).progress.epoch, 2);
}

// A world size that is not a whole positive integer is refused, as load_checkpoint refuses its
// other integers, instead of being read as "unknown".
TEST_F(Manager, AMalformedWorldSizeIsRefused) {
  manager(2).save_last({.epoch = 1, .step = 9, .batch = 3});
  const std::string path = manager(2).last_path();
  SafetensorsFile file = load_safetensors(path);
  for (const std::string bad : {"2x", "0", "-1"}) {
    file.metadata["world_size"] = bad;
    save_safetensors(path, file.tensors, file.metadata);
    EXPECT_LOOM_ERROR(manager(1).resume(path, *model_, optimizer_.get(), nullptr, nullptr),
                      ValueError, {path, "world_size", bad});
  }
}

}  // namespace
}  // namespace loom::optim
