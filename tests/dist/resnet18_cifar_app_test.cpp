// tests/dist/resnet18_cifar_app_test.cpp — resnet18_cifar with --nproc: world-size invariance
// (one process at batch 2B and two at batch B with --sync-bn end with the same weights), and a
// worker killed mid-training (the launcher stops the other one, reports the rank, leaves no
// process behind, and with --max-restarts the job resumes from its last checkpoint and
// finishes). Small synthetic runs.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "apps/checkpoint_updates.h"
#include "test_util.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";

class AppDist : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kApp)) GTEST_SKIP() << kApp << " is not built";
    dir_ = fs::temp_directory_path() /
           ("loom_app_dist_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Starts the app with its output in `log`; returns its pid.
  pid_t spawn(const std::string& args, const std::string& log) {
    const std::string command = "exec " + kApp + " " + args + " > " + log + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    return pid;
  }
  // Waits for pid (at most `limit`); its exit status, or -1 (it is then killed).
  static int wait_for(pid_t pid, std::chrono::seconds limit) {
    const auto end = Clock::now() + limit;
    int status = 0;
    while (Clock::now() < end) {
      if (waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The pids whose parent is `parent` (the launcher's workers).
  static std::vector<pid_t> children_of(pid_t parent) {
    std::vector<pid_t> out;
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      char state = 0;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == parent && state != 'Z') out.push_back(static_cast<pid_t>(std::stoi(name)));
    }
    return out;
  }
  static bool alive(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    return line.substr(line.rfind(')') + 2, 1) != "Z";
  }

  fs::path dir_;
};

const std::string kRun =
    "--dataset synthetic --synthetic-size 256 --width 4 --workers 1 --lr 0.05 --schedule cosine ";

TEST_F(AppDist, OneProcessAndTwoWithSyncBnEndWithTheSameWeights) {
  // Two steps: float rounding differs between the runs (other reduction orders), and a small
  // ResNet with batch norm amplifies it step by step (about 10x per step here).
  const std::string steps = "--epochs 1 --max-steps 2 --sync-bn ";
  const pid_t one =
      spawn(kRun + steps + "--batch-size 64 --threads 1 --checkpoint-dir " + path("one"),
            path("one.log"));
  ASSERT_EQ(wait_for(one, std::chrono::seconds(120)), 0) << read(path("one.log"));
  const pid_t two = spawn(
      kRun + steps + "--batch-size 32 --nproc 2 --print-memory --checkpoint-dir " + path("two"),
      path("two.log"));
  ASSERT_EQ(wait_for(two, std::chrono::seconds(120)), 0) << read(path("two.log"));
  const std::string log = read(path("two.log"));
  for (const char* part : {"world size 2", "global batch 64", "effective lr 0.05", "SyncBatchNorm"})
    EXPECT_NE(log.find(part), std::string::npos) << part << " not in:\n" << log;
  // The memory report (Note [The memory report]), printed by rank 0 alone: the gradients are the
  // DDP buckets, as large as the weights.
  EXPECT_EQ(log.find("memory after the first step"), log.rfind("memory after the first step"));
  std::smatch weights, gradients;
  ASSERT_TRUE(std::regex_search(log, weights, std::regex("\n  weights +([0-9.]+)"))) << log;
  ASSERT_TRUE(std::regex_search(log, gradients,
                                std::regex("\n  gradients +([0-9.]+) +\\(in [0-9]+ DDP buckets")))
      << log;
  EXPECT_EQ(weights[1], gradients[1]);

  const loom::SafetensorsFile a = loom::load_safetensors(path("one/last.safetensors"));
  const loom::SafetensorsFile b = loom::load_safetensors(path("two/last.safetensors"));
  EXPECT_EQ(a.metadata.at("loom.step"), "2");
  EXPECT_EQ(b.metadata.at("loom.step"), "2");
  int compared = 0;
  for (const auto& [name, t] : a.tensors) {
    if (name.rfind("optimizer.", 0) == 0 || t.dtype() != loom::kFloat32) continue;
    EXPECT_TRUE(loom::test::tensors_close(b.at(name), t, 1e-3, 1e-4)) << name;
    ++compared;
  }
  EXPECT_GT(compared, 60);
}

// Under DDP (Note [Gradient accumulation]): two ranks accumulating 4 micro-batches of 32 (the
// first 3 inside no_sync) take the step two ranks take on batches of 128, with frozen batch
// norm; with batch norm in training mode the steps differ.
TEST_F(AppDist, AccumulatingUnderDdpIsOneStepOnTheWholeBatchWithFrozenBatchNorm) {
  using namespace loom::test;
  const std::string run =
      "--dataset synthetic --synthetic-size 512 --width 4 --workers 1 --epochs 1 --lr 0.1 "
      "--schedule cosine --momentum 0 --weight-decay 0 --nproc 2 ";
  const pid_t init = spawn(run + "--batch-size 128 --max-steps 0 --checkpoint-dir " + path("init"),
                           path("init.log"));
  ASSERT_EQ(wait_for(init, std::chrono::seconds(120)), 0) << read(path("init.log"));
  const Parameters before = checkpoint_parameters(path("init/last.safetensors"));
  std::map<std::string, Parameters> updates;
  for (const std::string bn : {"--freeze-bn ", ""})
    for (const bool accumulate : {false, true}) {
      const std::string name = std::string(bn.empty() ? "train_bn_" : "frozen_bn_") +
                               (accumulate ? "accumulated" : "big");
      const pid_t pid =
          spawn(run + bn + (accumulate ? "--batch-size 32 --accumulate 4 " : "--batch-size 128 ") +
                    "--max-steps 1 --checkpoint-dir " + path(name),
                path(name + ".log"));
      ASSERT_EQ(wait_for(pid, std::chrono::seconds(120)), 0) << read(path(name + ".log"));
      const std::string log = read(path(name + ".log"));
      EXPECT_NE(log.find("global batch 256"), std::string::npos) << log;
      updates[name] = update(before, checkpoint_parameters(path(name + "/last.safetensors")));
    }
  EXPECT_GT(norm(updates["frozen_bn_big"]), 1e-4);
  EXPECT_LT(relative_difference(updates["frozen_bn_accumulated"], updates["frozen_bn_big"]), 1e-4);
  EXPECT_GT(relative_difference(updates["train_bn_accumulated"], updates["train_bn_big"]), 1e-2);
}

TEST_F(AppDist, AKilledWorkerStopsTheJobOrRestartsItFromTheLastCheckpoint) {
  for (const bool restart : {false, true}) {
    SCOPED_TRACE(restart ? "with --max-restarts 1" : "without restarts");
    fs::remove_all(path("ckpt"));
    const std::string log = path(restart ? "restart.log" : "stop.log");
    const pid_t launcher = spawn(kRun + "--epochs 6 --batch-size 32 --nproc 2 --checkpoint-dir " +
                                     path("ckpt") + (restart ? " --max-restarts 1" : ""),
                                 log);
    // Wait for the first checkpoint, then kill one worker.
    const auto end = Clock::now() + std::chrono::seconds(120);
    while (!fs::exists(path("ckpt/epoch-001.safetensors")) && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(fs::exists(path("ckpt/epoch-001.safetensors"))) << read(log);
    std::vector<pid_t> workers = children_of(launcher);
    ASSERT_EQ(workers.size(), 2u) << read(log);
    ASSERT_EQ(kill(workers[1], SIGKILL), 0);
    const int status = wait_for(launcher, std::chrono::seconds(120));
    const std::string out = read(log);
    EXPECT_NE(out.find("killed by signal SIGKILL"), std::string::npos) << out;
    for (pid_t w : workers) EXPECT_FALSE(alive(w)) << "worker " << w << " was left behind";
    if (restart) {
      EXPECT_EQ(status, 0) << out;
      EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
      EXPECT_TRUE(fs::exists(path("ckpt/epoch-006.safetensors"))) << out;
    } else {
      EXPECT_EQ(status, 128 + SIGKILL) << out;
      EXPECT_FALSE(fs::exists(path("ckpt/epoch-006.safetensors")));
    }
  }
}

}  // namespace
