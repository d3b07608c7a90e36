// tests/dist/doctor_test.cpp — loomrun --doctor (dist/doctor.h): the checks one by one, a
// healthy run on one host where every line is ✓, and each ✗ provoked: MASTER_PORT in use, --gpus
// without a GPU, a checkpoint dir that cannot be written, threads over the cores, a collective
// that cannot connect, and on two hosts (network namespaces, tests/dist/hosts.h) data and a
// build that differ between them.

#include "dist/doctor.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/hosts.h"
#include "scratch_dir.h"

namespace {

using namespace loom::dist;
namespace fs = std::filesystem;
using loom::test::Hosts;
using loom::test::ScratchDir;

const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/apps/loomrun";
const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";
const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::string read(const std::string& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const std::string& file, const std::string& text) { std::ofstream(file) << text; }

// The exit status of pid, waiting up to `limit`; -1 after killing it.
int wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------- the checks alone

TEST(DoctorChecks, ProgramFlags) {
  const ProgramFlags f =
      parse_program_flags({"--gpus", "2", "--data=d", "--threads", "3", "--batch-size", "32",
                           "--lr", "0.1", "--scale-lr", "--checkpoint-dir", "c", "--threads=4"});
  EXPECT_EQ(f.gpus, 2);
  EXPECT_EQ(f.backend, "nccl");  // the apps' default with --gpus
  EXPECT_EQ(f.data, "d");
  EXPECT_EQ(f.threads, 4);  // the last one counts
  EXPECT_EQ(f.batch_size, "32");
  EXPECT_EQ(f.lr, "0.1");
  EXPECT_TRUE(f.scale_lr);
  EXPECT_EQ(f.checkpoint_dir, "c");
  EXPECT_EQ(parse_program_flags({"--gpus", "2", "--backend", "gloo"}).backend, "gloo");
  EXPECT_EQ(parse_program_flags({}).backend, "gloo");
}

TEST(DoctorChecks, Devices) {
  ProgramFlags cpu;
  EXPECT_TRUE(check_devices(cpu, 0, 0, 2, 0, "").ok);
  ProgramFlags gpus = parse_program_flags({"--gpus", "1"});
  const DoctorCheck none = check_devices(gpus, 1, 0, 1, 0, "the CUDA driver sees no GPU");
  EXPECT_FALSE(none.ok);
  EXPECT_NE(none.line.find("no CUDA device is visible on node 1"), std::string::npos) << none.line;
  EXPECT_NE(none.fix.find("leave out --gpus"), std::string::npos) << none.fix;
  // Two nccl ranks on one GPU: the map and the ways out.
  const DoctorCheck shared = check_devices(gpus, 0, 1, 2, 1, "");
  EXPECT_FALSE(shared.ok);
  EXPECT_NE(shared.line.find("LOCAL_RANK 1 -> cuda:0"), std::string::npos) << shared.line;
  EXPECT_NE(shared.fix.find("--backend gloo"), std::string::npos) << shared.fix;
  const DoctorCheck own = check_devices(gpus, 0, 1, 2, 2, "");
  EXPECT_TRUE(own.ok);
  EXPECT_NE(own.line.find("LOCAL_RANK 1 -> cuda:1"), std::string::npos) << own.line;
  // gloo lets ranks share a GPU.
  EXPECT_TRUE(
      check_devices(parse_program_flags({"--gpus", "1", "--backend", "gloo"}), 0, 1, 2, 1, "").ok);
  EXPECT_FALSE(check_devices(parse_program_flags({"--backend", "nccl"}), 0, 0, 1, 1, "").ok);
}

TEST(DoctorChecks, ThreadsAndTheLrRule) {
  EXPECT_TRUE(check_threads(2, "OMP_NUM_THREADS", 2, 4, 0).ok);
  const DoctorCheck over = check_threads(64, "--threads", 2, 4, 1);
  EXPECT_FALSE(over.ok);
  EXPECT_NE(over.line.find("64 (--threads) x 2 local ranks = 128 > 4 cores"), std::string::npos)
      << over.line;
  EXPECT_NE(over.fix.find("--threads 2"), std::string::npos) << over.fix;

  const DoctorCheck scaled =
      lr_rule(parse_program_flags({"--batch-size", "32", "--lr", "0.1", "--scale-lr"}), 4);
  EXPECT_TRUE(scaled.ok);
  EXPECT_NE(scaled.line.find("global batch = --batch-size 32 x 4 ranks = 128"), std::string::npos)
      << scaled.line;
  EXPECT_NE(scaled.line.find("--scale-lr: 0.1 x 4 = 0.4, the linear scaling rule"),
            std::string::npos)
      << scaled.line;
  const DoctorCheck as_is = lr_rule(parse_program_flags({"--lr", "0.1"}), 4);
  EXPECT_NE(as_is.line.find("lr 0.1 used as is"), std::string::npos) << as_is.line;
}

TEST(DoctorChecks, DataNamesTheFirstDifference) {
  ScratchDir dir;
  fs::create_directories(dir.file("a/sub"));
  fs::create_directories(dir.file("b/sub"));
  write(dir.file("a/sub/x.bin"), "0123456789");
  write(dir.file("b/sub/x.bin"), "01234567890");
  write(dir.file("a/y.bin"), "y");
  write(dir.file("b/y.bin"), "y");
  const DataSummary a = summarize_data(dir.file("a")), b = summarize_data(dir.file("b"));
  ASSERT_TRUE(a.error.empty()) << a.error;
  EXPECT_EQ(a.files, 2);
  EXPECT_EQ(a.bytes, 11);
  EXPECT_TRUE(compare_data("d", 0, a, nullptr).ok);
  EXPECT_TRUE(compare_data("d", 1, a, &a).ok);
  const DoctorCheck differs = compare_data("d", 1, b, &a);
  EXPECT_FALSE(differs.ok);
  EXPECT_NE(differs.line.find("on node 1 differs from rank 0's: 2 files, 12 bytes here, 2 files, "
                              "11 bytes on rank 0"),
            std::string::npos)
      << differs.line;
  EXPECT_NE(differs.line.find("sub/x.bin: 11 bytes here, 10 on rank 0"), std::string::npos)
      << differs.line;
  const DataSummary missing = summarize_data(dir.file("none"));
  EXPECT_FALSE(compare_data("none", 0, missing, nullptr).ok);
  EXPECT_NE(missing.error.find("does not exist"), std::string::npos) << missing.error;
}

TEST(DoctorChecks, CheckpointDirAndBuild) {
  ScratchDir dir;
  const DoctorCheck fresh = check_checkpoint_dir(dir.file("c/d"), 0, 3);
  EXPECT_TRUE(fresh.ok) << fresh.line;
  EXPECT_TRUE(fs::is_directory(dir.file("c/d")));
  EXPECT_TRUE(fs::is_empty(dir.file("c/d")));  // the probe is gone
  write(dir.file("file"), "x");
  const DoctorCheck under_file = check_checkpoint_dir(dir.file("file/ckpt"), 1, 3);
  EXPECT_FALSE(under_file.ok);
  EXPECT_NE(under_file.line.find("Not a directory"), std::string::npos) << under_file.line;

  EXPECT_NE(resolve_program("sh"), "");  // on PATH
  EXPECT_EQ(resolve_program("no-such-program-here"), "");
  EXPECT_EQ(resolve_program(dir.file("file")), "");  // not executable
  const BuildSummary sh = summarize_build("sh");
  ASSERT_TRUE(sh.error.empty()) << sh.error;
  EXPECT_TRUE(compare_build("sh", 1, sh, &sh).ok);
  BuildSummary other = sh;
  other.hash = "0000";
  const DoctorCheck differs = compare_build("sh", 1, sh, &other);
  EXPECT_FALSE(differs.ok);
  EXPECT_NE(differs.line.find("sh on node 1 differs from rank 0's"), std::string::npos)
      << differs.line;
}

TEST(DoctorChecks, LaunchFailures) {
  LaunchOptions o;
  o.master_port = 29400;
  const DoctorCheck port =
      launch_failure(o, "TCPStore: cannot serve on 127.0.0.1:29400: the port is already in use");
  EXPECT_FALSE(port.ok);
  EXPECT_EQ(port.line.rfind("MASTER_PORT 29400 free on the master host", 0), 0u) << port.line;
  EXPECT_NE(port.fix.find("ss -ltnp 'sport = :29400'"), std::string::npos) << port.fix;
  EXPECT_NE(port.fix.find("--master-port"), std::string::npos) << port.fix;
  o.node_rank = 1;
  o.master_addr = "10.0.0.1";
  const DoctorCheck store = launch_failure(o, "cannot connect");
  EXPECT_NE(store.line.find("store at 10.0.0.1:29400 reachable from node 1"), std::string::npos);
  EXPECT_NE(store.fix.find("firewall"), std::string::npos) << store.fix;
}

// ---------------------------------------------------------------- loomrun --doctor, one host

struct Outcome {
  int status = -1;
  std::string output;
};

class Doctor : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kLoomrun) || !fs::exists(kApp)) GTEST_SKIP() << "the apps are not built";
  }
  // loomrun --nproc-per-node 2 --doctor resnet18_cifar ARGS, stdout and stderr together.
  Outcome doctor(const std::string& args, const std::string& env = "",
                 const std::string& launcher = "--master-port 0") const {
    const std::string log = dir_.file("doctor.log");
    const std::string command = "env " + env + " " + kLoomrun + " --nproc-per-node 2 " + launcher +
                                " --doctor " + kApp + " --dataset synthetic " + args + " > " + log +
                                " 2>&1";
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(log)};
  }

  ScratchDir dir_;
};

TEST_F(Doctor, AHealthyRunPassesEveryCheckOnEveryRank) {
  const Outcome r = doctor("--checkpoint-dir " + dir_.file("ckpt") +
                           " --batch-size 32 --lr 0.1 --scale-lr --threads 1");
  std::fprintf(stderr, "%s", r.output.c_str());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "✗"), 0) << r.output;
  EXPECT_NE(r.output.find("node 0, rank 0 (local rank 0):"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("node 0, rank 1 (local rank 1):"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "✓ store at 127.0.0.1:"), 2) << r.output;
  EXPECT_EQ(count(r.output, "✓ allreduce over gloo, 2 ranks"), 2) << r.output;
  EXPECT_EQ(count(r.output, "; gloo over shared memory (allreduce,"), 2) << r.output;  // one host
  EXPECT_EQ(count(r.output, "writable on node 0"), 2) << r.output;
  EXPECT_NE(r.output.find("the same as rank 0's (sha256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("✓ MASTER_PORT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("global batch = --batch-size 32 x 2 ranks = 64"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("checks passed, 0 failed"), std::string::npos) << r.output;
}

TEST_F(Doctor, APortInUseIsNamedWithItsFix) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const Outcome r = doctor("", "", "--master-port " + port);
  close(fd);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("✗ MASTER_PORT " + port + " free on the master host"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ss -ltnp 'sport = :" + port + "'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("another --master-port"), std::string::npos) << r.output;
}

TEST_F(Doctor, GpusWithoutAGpuFail) {
  const Outcome r = doctor("--gpus 1 --backend gloo");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "✗ devices: --gpus 1, but no CUDA device is visible"), 2) << r.output;
  EXPECT_NE(r.output.find("fix: run on a host whose GPUs"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "✓ allreduce over gloo"), 2) << r.output;  // the rest still runs
}

TEST_F(Doctor, ACheckpointDirThatCannotBeWrittenFails) {
  write(dir_.file("file"), "a regular file");
  const Outcome r = doctor("--checkpoint-dir " + dir_.file("file/ckpt"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "✗ checkpoint dir: cannot create " + dir_.file("file/ckpt")), 2)
      << r.output;
  EXPECT_NE(r.output.find("Not a directory"), std::string::npos) << r.output;
}

TEST_F(Doctor, ThreadsOverTheCoresFail) {
  const Outcome r = doctor("--threads 64");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("✗ threads: 64 (--threads) x 2 local ranks = 128 >"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--nproc-per-node"), std::string::npos) << r.output;
}

TEST_F(Doctor, ACollectiveThatCannotConnectFails) {
  const Outcome r = doctor("", "LOOM_GLOO_IFACE=nosuchif");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count(r.output, "✗ allreduce over gloo, 2 ranks"), 2) << r.output;
  EXPECT_NE(r.output.find("nosuchif"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LOOM_GLOO_IFACE"), std::string::npos) << r.output;
}

// ---------------------------------------------------------------- two hosts

class DoctorTwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hosts_.available()) GTEST_SKIP() << "no test hosts: " << hosts_.why_not();
    if (!fs::exists(kLoomrun) || !fs::exists(kApp)) GTEST_SKIP() << "the apps are not built";
    for (int host : {0, 1}) fs::create_directories(workdir(host) + "/data");
  }
  std::string workdir(int host) const { return dir_.file("host" + std::to_string(host)); }

  // loomrun --doctor on both hosts, each in its own working directory; both exit statuses.
  std::pair<Outcome, Outcome> doctor(const std::string& program, const std::string& args) {
    pid_t pids[2];
    for (int host : {0, 1}) {
      pids[host] = hosts_.spawn(
          host,
          "sh -c \"cd '" + workdir(host) + "' && env LOOM_JOB_SECRET=" + kSecret + " " + kLoomrun +
              " --nnodes 2 --node-rank " + std::to_string(host) + " --master-addr " +
              Hosts::address(0) + " --master-port 29400 --rdzv-timeout 30 --doctor " + program +
              " " + args + "\"",
          dir_.file("host" + std::to_string(host) + ".log"));
    }
    std::pair<Outcome, Outcome> runs;
    Outcome* out[2] = {&runs.first, &runs.second};
    for (int host : {0, 1}) {
      out[host]->status = wait_for(pids[host], std::chrono::seconds(60));
      out[host]->output = read(dir_.file("host" + std::to_string(host) + ".log"));
    }
    return runs;
  }

  Hosts hosts_;
  ScratchDir dir_;
};

TEST_F(DoctorTwoHosts, DataThatDiffersBetweenHostsIsNamed) {
  write(workdir(0) + "/data/train.bin", "0123456789");
  write(workdir(1) + "/data/train.bin", "0123456789");
  write(workdir(1) + "/data/extra.bin", "only on host 1");
  const auto [a, b] = doctor(kApp, "--dataset synthetic --data data --threads 1");
  std::fprintf(stderr, "host 0:\n%shost 1:\n%s", a.output.c_str(), b.output.c_str());
  EXPECT_EQ(a.status, 1) << a.output;
  EXPECT_EQ(b.status, 1) << b.output;
  EXPECT_NE(a.output.find("✗ data: --data data on node 1 differs from rank 0's: 2 files, 24 "
                          "bytes here, 1 file, 10 bytes on rank 0 (first difference: extra.bin "
                          "only here)"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("✓ store at " + Hosts::address(0) + ":29400 reachable from node 1"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("✓ allreduce over gloo, 2 ranks, on node 1"), std::string::npos)
      << a.output;
  // The test hosts are network namespaces of one machine: they keep TCP, and say why.
  EXPECT_NE(a.output.find("; gloo over tcp (no shared memory: rank 1: its namespaces"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("1 failed"), std::string::npos) << a.output;
  EXPECT_NE(b.output.find("1 failed (node 0's loomrun prints"), std::string::npos) << b.output;
}

TEST_F(DoctorTwoHosts, ABuildThatDiffersBetweenHostsIsNamed) {
  for (int host : {0, 1}) fs::copy_file(kApp, workdir(host) + "/prog");
  std::ofstream(workdir(1) + "/prog", std::ios::app) << '\0';
  const auto [a, b] = doctor("./prog", "--dataset synthetic --threads 1");
  EXPECT_EQ(a.status, 1) << a.output;
  EXPECT_EQ(b.status, 1) << b.output;
  EXPECT_NE(a.output.find("✗ build: ./prog on node 1 differs from rank 0's"), std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("1 failed"), std::string::npos) << a.output;
}

}  // namespace
