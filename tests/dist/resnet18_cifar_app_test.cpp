// tests/dist/resnet18_cifar_app_test.cpp — resnet18_cifar with --nproc: world-size invariance
// (one process at batch 2B and two at batch B with --sync-bn end with the same weights; one step
// at batch 128 as 1 x 128, 2 x 64 and 4 x 32 gives the same gradients), and a
// worker killed mid-training (the launcher stops the other one, reports the rank, leaves no
// process behind, and with --max-restarts the job resumes from its last checkpoint and
// finishes), and the --trace file (every rank's phases, every bucket's allreduce). Small
// synthetic runs.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "apps/checkpoint_updates.h"
#include "scratch_dir.h"
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
  }
  // Under this test's own directory (Note [Test scratch directories]).
  std::string path(const std::string& name) const { return dir_.file(name); }

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

  loom::test::ScratchDir dir_;
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
  // Both ranks on this machine: gloo's collectives go through shared memory, and it says so.
  for (const char* part : {"world size 2 (gloo over shared memory (allreduce,", "global batch 64",
                           "effective lr 0.05", "SyncBatchNorm"})
    EXPECT_NE(log.find(part), std::string::npos) << part << " not in:\n" << log;
  // The memory report (Note [The memory report]), printed by rank 0 alone: the gradients are the
  // DDP buckets, as large as the weights.
  EXPECT_EQ(log.find("memory after the second step"), log.rfind("memory after the second step"));
  std::smatch weights, gradients;
  ASSERT_TRUE(std::regex_search(log, weights, std::regex("\n  weights +([0-9.]+)"))) << log;
  ASSERT_TRUE(std::regex_search(
      log, gradients, std::regex("\n  gradients +([0-9.]+) +[0-9.]+ +\\(in [0-9]+ DDP buckets")))
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

// The numbers of a memory report's line ("  gradients   0.17   0.09  (ZeRO-2 shards)"): what was
// measured and the formula's figure, in MiB.
std::pair<double, double> memory_line(const std::string& log, const std::string& kind) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("\n  " + kind + " +([0-9.]+) +([0-9.]+)")))
    return {-1, -1};
  return {std::stod(m[1]), std::stod(m[2])};
}

// Note [resnet18_cifar under ZeRO]: each stage trains as DDP does (the same losses and accuracy
// to the printed digit, fp16 with a loss scaler, clipping and SyncBatchNorm; ZeRO-3's 16-bit
// gathered weights within 1%), the memory report
// shows the stage's model states beside the formula's, and the run ends with the bytes moved.
TEST_F(AppDist, EachZeroStageTrainsAsDdpDoesAndReportsItsModelStates) {
  // Width 16: 0.7 M parameters, so that the printed MiB resolve 1% of each model state.
  const std::string args =
      "--dataset synthetic --synthetic-size 256 --width 16 --workers 1 --epochs 1 --max-steps 3 "
      "--batch-size 16 --nproc 2 --threads 1 --amp fp16 --grad-clip 1 --sync-bn --optimizer adamw "
      "--lr 1e-3 --print-memory ";
  std::string ddp_epoch;
  double ddp_state = 0;
  for (const std::string stage : {"0", "1", "2", "3"}) {
    SCOPED_TRACE("--zero " + stage);
    const std::string log_file = path("zero" + stage + ".log");
    const std::string trace = path("trace" + stage + ".json");
    const pid_t pid = spawn(args + "--zero " + stage + " --trace " + trace, log_file);
    ASSERT_EQ(wait_for(pid, std::chrono::seconds(120)), 0) << read(log_file);
    const std::string log = read(log_file);
    std::smatch epoch;
    ASSERT_TRUE(std::regex_search(log, epoch,
                                  std::regex("train loss [0-9.]+ +acc [0-9.]+% +test "
                                             "loss [0-9.]+ +acc [0-9.]+%")))
        << log;
    // Measured against the formula: within 1% (the padding is a few elements).
    for (const char* kind : {"weights", "gradients", "optimizer state"}) {
      const auto [measured, formula] = memory_line(log, kind);
      EXPECT_GT(measured, 0) << kind << "\n" << log;
      EXPECT_NEAR(measured, formula, 0.01 * formula + 0.006) << kind << "\n" << log;
    }
    const double state = memory_line(log, "optimizer state").first;
    const double weights = memory_line(log, "weights").first;
    const double gradients = memory_line(log, "gradients").first;
    if (stage == "0") {
      ddp_epoch = epoch[0];
      ddp_state = state;
      EXPECT_NEAR(state, 2 * weights, 0.011) << log;  // AdamW: m and v
      EXPECT_NE(log.find("collectives of rank 0 over 3 training steps (DDP"), std::string::npos);
      continue;
    }
    if (stage != "3") {
      EXPECT_EQ(epoch[0], ddp_epoch) << log;
    } else {
      // FSDP under --amp gathers 16-bit weights (Note [FSDP mixed precision]): close, not equal.
      std::smatch a, b;
      const std::regex losses("train loss ([0-9.]+) .*test loss ([0-9.]+)");
      const std::string mine = epoch[0];
      ASSERT_TRUE(std::regex_search(mine, a, losses) && std::regex_search(ddp_epoch, b, losses));
      for (int i = 1; i <= 2; ++i)
        EXPECT_NEAR(std::stod(a[i]), std::stod(b[i]), 0.01 * std::stod(b[i])) << mine;
    }
    EXPECT_NEAR(state, ddp_state / 2, 0.011) << log;
    EXPECT_NEAR(gradients, stage == "1" ? weights : state / 2, 0.011) << log;
    EXPECT_NE(log.find("collectives of rank 0 over 3 training steps (ZeRO-" + stage),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("reduce_scatter"), std::string::npos) << log;
    // FSDP's trace: each stage's all-gathers and reduce-scatter against the compute, both ranks.
    if (stage == "3") {
      const std::string events = read(trace);
      for (const char* what : {"\"allgather layer1\"", "\"reduce_scatter layer4\"",
                               "\"allgather (root)\"", "\"backward\""})
        EXPECT_NE(events.find(what), std::string::npos) << what;
      EXPECT_NE(log.find("of the reduce-scatter time"), std::string::npos) << log;
    }
  }
}

TEST_F(AppDist, ZeroRefusesWhatItCannotDo) {
  struct Bad {
    std::string args, fragment;
  };
  const Bad cases[] = {
      {"--zero 4 --nproc 2", "--zero"},
      {"--zero 2", "give --nproc N"},
      {"--zero 3 --nproc 2 --checkpoint-dir " + path("c"), "no rank has under ZeRO"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.args);
    const pid_t pid =
        spawn(kRun + "--epochs 1 --max-steps 1 --threads 1 " + c.args, path("bad.log"));
    EXPECT_EQ(wait_for(pid, std::chrono::seconds(60)), 2);
    EXPECT_NE(read(path("bad.log")).find(c.fragment), std::string::npos) << read(path("bad.log"));
    EXPECT_FALSE(fs::exists(path("c")));
  }
}

// max |a - b| / max |a| over the elements of two tensors of one shape.
double tensor_relative_difference(const loom::Tensor& a, const loom::Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double largest = 0, diff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    largest = std::max(largest, std::fabs(x[i]));
    diff = std::max(diff, std::fabs(x[i] - y[i]));
  }
  return largest > 0 ? diff / largest : diff;
}

// One step at the global batch 128 as 1 x 128, 2 x 64 and 4 x 32 gives the same gradients, seen
// as the SGD momentum buffers of the checkpoint (Note [SyncBatchNorm and world-size invariance],
// dist/sync_batchnorm.h): one process runs plain BatchNorm, the others SyncBatchNorm.
TEST_F(AppDist, SyncBnGradientsOfOneStepDoNotDependOnTheWorldSize) {
  const std::string run =
      "--dataset synthetic --synthetic-size 256 --width 8 --workers 1 --threads 1 --seed 0 "
      "--epochs 1 --max-steps 1 --sync-bn ";
  const std::vector<std::pair<int, int>> shapes = {{1, 128}, {2, 64}, {4, 32}};  // ranks x batch
  std::vector<loom::SafetensorsFile> runs;
  for (const auto& [ranks, batch] : shapes) {
    const std::string name = std::to_string(ranks) + "x" + std::to_string(batch);
    const pid_t pid = spawn(run + "--batch-size " + std::to_string(batch) +
                                (ranks > 1 ? " --nproc " + std::to_string(ranks) : "") +
                                " --checkpoint-dir " + path(name),
                            path(name + ".log"));
    ASSERT_EQ(wait_for(pid, std::chrono::seconds(120)), 0) << read(path(name + ".log"));
    runs.push_back(loom::load_safetensors(path(name + "/last.safetensors")));
    EXPECT_EQ(runs.back().metadata.at("loom.step"), "1");
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = i + 1; j < runs.size(); ++j) {
      SCOPED_TRACE(loom::detail::str(shapes[i].first, " ranks against ", shapes[j].first));
      int compared = 0;
      double worst = 0;
      std::string worst_name;
      for (const auto& [name, t] : runs[i].tensors) {
        if (name.rfind("optimizer.", 0) != 0 || name.find("momentum_buffer") == std::string::npos)
          continue;
        const double d = tensor_relative_difference(t, runs[j].at(name));
        if (d > worst) std::tie(worst, worst_name) = std::tie(d, name);
        ++compared;
      }
      EXPECT_EQ(compared, 62);  // every parameter of ResNet-18
      EXPECT_LE(worst, 1e-5) << worst_name;
    }
}

// --trace (dist/trace.h): one Chrome trace of both ranks, in which each of the two steps has its
// data, forward, backward and optimizer boxes one after the other, and one allreduce box per
// bucket of the plan that starts after its step's backward started and ends before that
// backward returned (the reducer waits for every bucket at the end of backward).
TEST_F(AppDist, TheTraceHoldsEveryPhaseOfEveryRankAndEveryBucketsAllreduce) {
  // Width 16: about 2.8 MB of gradients, more than the first bucket's 1 MiB: two buckets.
  const pid_t app = spawn(kRun +
                              "--epochs 1 --max-steps 2 --batch-size 8 --width 16 --nproc 2 "
                              "--print-buckets --trace " +
                              path("trace.json"),
                          path("trace.log"));
  ASSERT_EQ(wait_for(app, std::chrono::seconds(120)), 0) << read(path("trace.log"));
  const std::string log = read(path("trace.log"));
  std::smatch plan;
  ASSERT_TRUE(std::regex_search(
      log, plan, std::regex("DDP bucket plan: [0-9]+ parameters in ([0-9]+) buckets")))
      << log;
  const int buckets = std::stoi(plan[1]);
  EXPECT_GE(buckets, 2) << log;

  const nlohmann::json trace = nlohmann::json::parse(read(path("trace.json")));
  ASSERT_TRUE(trace.contains("traceEvents")) << trace.dump().substr(0, 500);
  constexpr double kTolerance = 1.0;  // microseconds: ts and dur are rounded separately
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    // This rank's boxes in the order it recorded them: a step starts with "data".
    struct Step {
      std::map<std::string, nlohmann::json> phases;
      std::map<int, nlohmann::json> allreduces;  // by bucket
    };
    std::vector<Step> steps;
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (e.value("pid", -1) != rank || e.value("ph", "") != "X") continue;
      const std::string name = e.at("name");
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
      if (name == "data") steps.emplace_back();
      ASSERT_FALSE(steps.empty()) << "before the first data box: " << e.dump();
      const std::string prefix = "allreduce bucket ";
      if (name.rfind(prefix, 0) == 0) {
        const int b = std::stoi(name.substr(prefix.size()));
        EXPECT_EQ(e.at("tid"), 1) << e.dump();
        EXPECT_TRUE(steps.back().allreduces.emplace(b, e).second) << "twice: " << e.dump();
      } else {
        EXPECT_EQ(e.at("tid"), 0) << e.dump();
        EXPECT_TRUE(steps.back().phases.emplace(name, e).second) << "twice: " << e.dump();
      }
    }
    ASSERT_EQ(steps.size(), 2u);
    for (size_t s = 0; s < steps.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const Step& step = steps[s];
      double previous_end = 0;
      for (const char* phase : {"data", "forward", "backward", "optimizer"}) {
        ASSERT_TRUE(step.phases.count(phase)) << phase;
        const double ts = step.phases.at(phase).at("ts"), dur = step.phases.at(phase).at("dur");
        EXPECT_GE(ts, previous_end - kTolerance) << phase << " starts before the last phase ended";
        previous_end = ts + dur;
      }
      EXPECT_EQ(step.phases.size(), 4u);
      const double backward_start = step.phases.at("backward").at("ts");
      const double backward_end =
          backward_start + step.phases.at("backward").at("dur").get<double>();
      ASSERT_EQ(step.allreduces.size(), static_cast<size_t>(buckets));
      for (int b = 0; b < buckets; ++b) {
        ASSERT_TRUE(step.allreduces.count(b)) << "bucket " << b;
        const double ts = step.allreduces.at(b).at("ts"), dur = step.allreduces.at(b).at("dur");
        EXPECT_GE(ts, backward_start - kTolerance) << "bucket " << b;
        EXPECT_LE(ts + dur, backward_end + kTolerance) << "bucket " << b;
      }
    }
  }
  EXPECT_NE(log.find("trace of " + std::to_string(2 * (4 + buckets)) + " events per rank"),
            std::string::npos)
      << log;
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

// Ranks that loaded different data (here: synthetic images of another seed on rank 1, as two
// hosts with different copies of a dataset would) stop at start-up, naming what differs.
TEST_F(AppDist, RanksThatLoadedDifferentDataStopBeforeTraining) {
  const std::string loomrun = std::string(LOOM_BINARY_DIR) + "/apps/loomrun";
  const std::string log = path("differ.log");
  const std::string command = loomrun + " --nproc-per-node 2 --master-port 0 /bin/sh -c 'exec " +
                              kApp + " " + kRun + "--epochs 1 --batch-size 32 --seed $RANK' > " +
                              log + " 2>&1";
  EXPECT_NE(std::system(command.c_str()), 0);
  const std::string out = read(log);
  EXPECT_NE(out.find("rank 1 (local rank 1) loaded other data than rank 0"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("epoch 1/1"), std::string::npos) << "it trained:\n" << out;
}

}  // namespace
