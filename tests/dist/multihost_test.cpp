// tests/dist/multihost_test.cpp — loomrun across two hosts made of network namespaces
// (tests/dist/hosts.h): a job on two hosts trains as the same job on one host does, to the bit
// (DDP with SyncBatchNorm, the ZeRO stages), under torchrun's rendezvous names too, with gloo
// finding the interface that reaches the other host or taking LOOM_GLOO_IFACE's; a worker killed,
// hung or raising on one host stops every worker of both within the bound, each launcher
// naming the rank, its host and how it ended, and no process is left; --max-restarts restarts
// both hosts together from the last --checkpoint-every checkpoint and ends with the weights of
// the run that was never interrupted; a host that does not come back ends the job, naming it.
// Skipped where network namespaces cannot be made (not root, no iproute2).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/hosts.h"
#include "loom.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using loom::test::Hosts;

const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/apps/loomrun";
const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";
const std::string kSecret = "0123456789abcdef0123456789abcdef";
// A small synthetic ResNet run; one thread per rank, so that one host and two compute alike.
const std::string kTrain =
    " --dataset synthetic --synthetic-size 256 --width 4 --workers 1 --lr 0.05 "
    "--schedule cosine --threads 1 --batch-size 32 --epochs 1";

std::string read(const std::string& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits for pid up to `limit`: its exit status (128 + signal), or -1 after killing it.
int wait_for(pid_t pid, std::chrono::seconds limit) {
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

// The children of `parent` (a launcher's workers).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  return std::getline(stat, line) && line.substr(line.rfind(')') + 2, 1) != "Z";
}

// Waits until `parent` has `n` children (the workers are up); them, or fewer after 60 s.
std::vector<pid_t> wait_for_workers(pid_t parent, size_t n) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  std::vector<pid_t> workers;
  while ((workers = children_of(parent)).size() < n && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return workers;
}

// Waits until `log` holds `text` (up to 60 s).
bool wait_for_text(const std::string& log, const std::string& text) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (read(log).find(text) == std::string::npos && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return read(log).find(text) != std::string::npos;
}

// Every tensor of two safetensors files equal to the bit.
void expect_identical(const std::string& a_path, const std::string& b_path) {
  const loom::SafetensorsFile a = loom::load_safetensors(a_path);
  const loom::SafetensorsFile b = loom::load_safetensors(b_path);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const loom::Tensor& u = b.at(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.contiguous().data(), u.contiguous().data(), t.nbytes()), 0)
        << name << " differs";
  }
}

// The epoch line's losses and accuracies ("train loss 2.3379  acc 9.42%  test loss ...").
std::string epoch_figures(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m,
                         std::regex("train loss [0-9.]+ +acc [0-9.]+% +test loss [0-9.]+ +acc "
                                    "[0-9.]+%")))
    return "(no epoch line)";
  return m[0];
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hosts_.available()) GTEST_SKIP() << "no test hosts: " << hosts_.why_not();
    if (!fs::exists(kApp) || !fs::exists(kLoomrun)) GTEST_SKIP() << "the apps are not built";
  }
  std::string path(const std::string& name) const { return dir_.file(name); }

  // loomrun on `host` of two, `nproc` workers each, running resnet18_cifar with `args`.
  pid_t launch(int host, int nproc, const std::string& launcher_flags, const std::string& args,
               const std::string& log, const std::string& env = "") const {
    return hosts_.spawn(host,
                        "env LOOM_JOB_SECRET=" + kSecret + " " + env + " " + kLoomrun +
                            " --nnodes 2 --node-rank " + std::to_string(host) +
                            " --nproc-per-node " + std::to_string(nproc) + " --master-addr " +
                            Hosts::address(0) + " --master-port 29400 " + launcher_flags + " " +
                            kApp + " " + args,
                        log);
  }
  // The same training on this machine alone, --nproc 2: the reference.
  std::string one_host(const std::string& args, const std::string& name) const {
    const std::string log = path(name + ".log");
    const std::string command = kApp + " " + args + " --nproc 2 > " + log + " 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << read(log);
    return read(log);
  }

  Hosts hosts_;
  loom::test::ScratchDir dir_;
};

TEST_F(MultiHost, TwoHostsTrainAsOneHostDoesToTheBit) {
  // DDP with SyncBatchNorm: the final weights, optimizer state included, to the bit.
  const std::string ddp = kTrain + " --max-steps 3 --sync-bn --checkpoint-dir ";
  one_host(ddp + path("one"), "one");
  const pid_t a = launch(0, 1, "", ddp + path("two"), path("a.log"));
  const pid_t b = launch(1, 1, "", ddp + path("two"), path("b.log"));
  ASSERT_EQ(wait_for(a, std::chrono::seconds(120)), 0) << read(path("a.log"));
  ASSERT_EQ(wait_for(b, std::chrono::seconds(120)), 0) << read(path("b.log"));
  expect_identical(path("one/last.safetensors"), path("two/last.safetensors"));
  EXPECT_NE(read(path("a.log")).find("world size 2"), std::string::npos) << read(path("a.log"));

  // Each ZeRO stage: the same losses and accuracies as on one host. Stage 2 goes by torchrun's
  // names for the rendezvous and takes gloo's interface from LOOM_GLOO_IFACE.
  for (const int stage : {1, 2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const std::string args = kTrain + " --max-steps 3 --zero " + std::to_string(stage);
    const std::string reference = one_host(args, "zero" + std::to_string(stage));
    const std::string flags = stage == 2 ? "--rdzv-endpoint " + Hosts::address(0) +
                                               ":29401 --rdzv-id zero2 --rdzv-backend c10d"
                                         : "";
    const pid_t x =
        launch(0, 1, flags, args, path("x.log"), stage == 2 ? "LOOM_GLOO_IFACE=veth0" : "");
    const pid_t y =
        launch(1, 1, flags, args, path("y.log"), stage == 2 ? "LOOM_GLOO_IFACE=veth1" : "");
    ASSERT_EQ(wait_for(x, std::chrono::seconds(120)), 0) << read(path("x.log"));
    ASSERT_EQ(wait_for(y, std::chrono::seconds(120)), 0) << read(path("y.log"));
    const std::string log = read(path("x.log"));
    EXPECT_EQ(epoch_figures(log), epoch_figures(reference)) << log << "\n" << reference;
    EXPECT_NE(log.find("ZeRO-" + std::to_string(stage)), std::string::npos) << log;
    if (stage == 2) {
      EXPECT_NE(log.find("master " + Hosts::address(0) + ":29401"), std::string::npos) << log;
    }
  }
}

TEST_F(MultiHost, LaunchersOfAnotherJobAreRefused) {
  const pid_t a = hosts_.spawn(0,
                               "env LOOM_JOB_SECRET=" + kSecret + " " + kLoomrun +
                                   " --nnodes 2 --node-rank 0 --master-addr " + Hosts::address(0) +
                                   " --master-port 29400 --rdzv-id one --rdzv-timeout 20 sleep 30",
                               path("a.log"));
  const pid_t b = hosts_.spawn(1,
                               "env LOOM_JOB_SECRET=" + kSecret + " " + kLoomrun +
                                   " --nnodes 2 --node-rank 1 --master-addr " + Hosts::address(0) +
                                   " --master-port 29400 --rdzv-id two --rdzv-timeout 20 true",
                               path("b.log"));
  EXPECT_EQ(wait_for(b, std::chrono::seconds(30)), 1);
  const std::string log = read(path("b.log"));
  EXPECT_NE(log.find("run another job (rdzv-id one"), std::string::npos)
      << log << "\nthe first launcher's log:\n"
      << read(path("a.log"));
  // A launcher with another secret does not get in at all.
  const pid_t c = hosts_.spawn(1,
                               "env LOOM_JOB_SECRET=another-secret-of-32-characters " + kLoomrun +
                                   " --nnodes 2 --node-rank 1 --master-addr " + Hosts::address(0) +
                                   " --master-port 29400 --rdzv-id one --rdzv-timeout 5 true",
                               path("c.log"));
  EXPECT_EQ(wait_for(c, std::chrono::seconds(30)), 1);
  EXPECT_NE(read(path("c.log")).find("LOOM_JOB_SECRET differs"), std::string::npos)
      << read(path("c.log"));
  kill(a, SIGTERM);
  EXPECT_NE(wait_for(a, std::chrono::seconds(30)), -1);
}

// How a failure on host 1 ends the job: `provoke` acts on host 1's launcher and its workers
// once both hosts train; every rank must be gone, and both launchers done, within `bound`.
struct Ended {
  int status_a = -1, status_b = -1;
  double seconds = 0;  // from the provocation until both launchers returned
  std::string log_a, log_b;
};

class MultiHostFailure : public MultiHost {
 protected:
  // `provoke` empty: host 1 fails by itself (env_b), maybe before its workers are seen.
  Ended run_and_provoke(const std::string& flags, const std::string& env_b,
                        const std::function<void(pid_t, const std::vector<pid_t>&)>& provoke) {
    const std::string args = kTrain + " --synthetic-size 2048 --epochs 50";
    const pid_t a = launch(0, 2, flags, args, path("a.log"));
    const pid_t b = launch(1, 2, flags, args, path("b.log"), env_b);
    Ended ended;
    const std::vector<pid_t> workers_a = wait_for_workers(a, 2);
    const std::vector<pid_t> workers_b = wait_for_workers(b, 2);
    const auto start = Clock::now();
    if (provoke) {
      EXPECT_EQ(workers_a.size(), 2u) << read(path("a.log"));
      EXPECT_EQ(workers_b.size(), 2u) << read(path("b.log"));
      EXPECT_TRUE(wait_for_text(path("a.log"), "steps per epoch")) << read(path("a.log"));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a few steps in
      provoke(b, workers_b);
    }
    ended.status_b = wait_for(b, std::chrono::seconds(60));
    ended.status_a = wait_for(a, std::chrono::seconds(60));
    ended.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (provoke) {
      std::fprintf(stderr,
                   "[ measured ] from the provocation until both launchers returned: "
                   "%.2f s\n",
                   ended.seconds);
    }
    ended.log_a = read(path("a.log"));
    ended.log_b = read(path("b.log"));
    for (const pid_t w : workers_a) EXPECT_FALSE(alive(w)) << "host 0's worker " << w << " lives";
    for (const pid_t w : workers_b) EXPECT_FALSE(alive(w)) << "host 1's worker " << w << " lives";
    for (int host : {0, 1})
      EXPECT_TRUE(hosts_.pids(host).empty()) << "processes left on host " << host;
    return ended;
  }
};

TEST_F(MultiHostFailure, AWorkerKilledOnOneHostStopsBothHostsInSeconds) {
  const Ended e = run_and_provoke("", "", [](pid_t, const std::vector<pid_t>& workers) {
    kill(workers[1], SIGKILL);  // rank 3
  });
  const std::string what = "rank 3 (pid ";
  EXPECT_EQ(e.status_b, 128 + SIGKILL) << e.log_b;
  EXPECT_EQ(e.status_a, 1) << e.log_a;
  EXPECT_LT(e.seconds, 15.0) << e.log_a;
  for (const std::string* log : {&e.log_a, &e.log_b}) {
    EXPECT_NE(log->find(what), std::string::npos) << *log;
    EXPECT_NE(log->find("on node 1 (" + Hosts::address(1) + ") was killed by signal SIGKILL"),
              std::string::npos)
        << *log;
  }
  EXPECT_NE(e.log_a.find("the job failed: rank 3"), std::string::npos) << e.log_a;
  // Host 0's ranks raised DistError naming the peer, rather than waiting for a timeout.
  EXPECT_NE(e.log_a.find("cannot finish: rank 3"), std::string::npos) << e.log_a;
}

TEST_F(MultiHostFailure, AHungWorkerIsSeenByItsHeartbeatAndStopsBothHosts) {
  const Ended e =
      run_and_provoke("--heartbeat-timeout 3", "", [](pid_t, const std::vector<pid_t>& workers) {
        kill(workers[0], SIGSTOP);  // rank 2 hangs
      });
  EXPECT_NE(e.status_a, 0) << e.log_a;
  EXPECT_NE(e.status_b, 0) << e.log_b;
  EXPECT_LT(e.seconds, 20.0) << e.log_a;  // 3 s of silence, then seconds to stop
  for (const std::string* log : {&e.log_a, &e.log_b})
    EXPECT_NE(log->find("rank 2 (pid "), std::string::npos) << *log;
  EXPECT_NE(e.log_b.find("hung: no heartbeat for"), std::string::npos) << e.log_b;
  EXPECT_NE(e.log_a.find("cannot finish: rank 2"), std::string::npos) << e.log_a;
}

TEST_F(MultiHostFailure, AWorkerThatRaisesOnOneHostStopsBothHosts) {
  // Host 1's ranks may hold 12 MiB: the first training step raises OutOfMemoryError there.
  const Ended e = run_and_provoke("", "LOOM_MAX_MEMORY=12MiB", nullptr);
  EXPECT_EQ(e.status_a, 1) << e.log_a;
  EXPECT_EQ(e.status_b, 2) << e.log_b;
  EXPECT_LT(e.seconds, 30.0) << e.log_a;  // from the start: joining, and the first step
  EXPECT_NE(e.log_b.find("out of memory on cpu"), std::string::npos) << e.log_b;
  for (const std::string* log : {&e.log_a, &e.log_b})
    EXPECT_TRUE(std::regex_search(*log, std::regex("rank [23] \\(pid [0-9]+\\) on node 1 \\(" +
                                                   Hosts::address(1) + "\\) exited with status 2")))
        << *log;
}

TEST_F(MultiHost, ARestartOfBothHostsEndsWithTheWeightsOfTheUninterruptedRun) {
  const std::string args = kTrain + " --synthetic-size 2048 --checkpoint-every 4 --checkpoint-dir ";
  one_host(args + path("one"), "one");
  const pid_t a = launch(0, 1, "--max-restarts 1", args + path("two"), path("a.log"));
  const pid_t b = launch(1, 1, "--max-restarts 1", args + path("two"), path("b.log"));
  const std::vector<pid_t> workers = wait_for_workers(b, 1);
  ASSERT_EQ(workers.size(), 1u) << read(path("b.log"));
  // Killed after the first --checkpoint-every checkpoint, in the middle of the epoch.
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path("two/last.safetensors")) && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  ASSERT_EQ(wait_for(a, std::chrono::seconds(120)), 0) << read(path("a.log"));
  ASSERT_EQ(wait_for(b, std::chrono::seconds(120)), 0) << read(path("b.log"));
  for (const std::string& log : {read(path("a.log")), read(path("b.log"))})
    EXPECT_NE(log.find("restart 1"), std::string::npos) << log;
  const std::string log = read(path("a.log"));
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_EQ(log.find("0 steps done"), std::string::npos) << "resumed from the start:\n" << log;
  expect_identical(path("one/last.safetensors"), path("two/last.safetensors"));
}

TEST_F(MultiHost, AHostThatDoesNotComeBackEndsTheJobNamingIt) {
  const std::string args = kTrain + " --synthetic-size 2048 --epochs 50";
  const std::string flags = "--max-restarts 1 --rdzv-timeout 4";
  const pid_t a = launch(0, 1, flags, args, path("a.log"));
  const pid_t b = launch(1, 1, flags, args, path("b.log"));
  ASSERT_EQ(wait_for_workers(b, 1).size(), 1u) << read(path("b.log"));
  ASSERT_TRUE(wait_for_text(path("a.log"), "steps per epoch")) << read(path("a.log"));
  kill(b, SIGKILL);  // host 1's launcher, and with it its worker, is gone for good
  const auto start = Clock::now();
  EXPECT_EQ(wait_for(a, std::chrono::seconds(60)), 1) << read(path("a.log"));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
  const std::string log = read(path("a.log"));
  EXPECT_NE(log.find("node(s) 1 did not come to restart 1 within 4.0 s"), std::string::npos) << log;
  EXPECT_TRUE(hosts_.pids(0).empty());
}

}  // namespace
