// tests/dist/launch_test.cpp — the launcher (dist/launch.h) with /bin/sh scripts as workers:
// the environment of every rank, a failure stopping the others with no process left behind,
// exit statuses, restarts, signals forwarded, free ports, strip_flag, and the loomrun program.

#include "dist/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensor/error.h"

namespace {

using namespace loom::dist;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Shell helpers every worker script starts with: put FILE VALUE writes atomically (readers
// never see half a file), waitfor FILE waits for it up to 5 s. Scripts run in the test's dir.
const std::string kPrelude =
    "cd \"$TEST_DIR\" || exit 99; ulimit -c 0; "
    "put() { echo \"$2\" > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; }; "
    "waitfor() { n=0; while [ ! -s \"$1\" ] && [ $n -lt 250 ]; do sleep 0.02; n=$((n+1)); "
    "done; }; ";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Alive and not a zombie (an init that does not reap keeps orphaned zombies around).
bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  return line[close + 2] != 'Z' && line[close + 2] != 'X';
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  return std::max(1, CPU_COUNT(&set));
}

// Sets (or, with nullptr, removes) an environment variable of this process for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "loom_launch_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    alarm(60);  // a hung launch kills the test program instead of hanging the suite
  }
  void TearDown() override {
    alarm(0);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  bool exists(const std::string& name) const { return fs::exists(path(name)); }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  int read_int(const std::string& name) const { return std::stoi(read(name)); }
  // Waits (up to 10 s) until a worker wrote `name`.
  bool wait_for(const std::string& name) const {
    for (int i = 0; i < 1000 && !exists(name); ++i) std::this_thread::sleep_for(10ms);
    return exists(name);
  }

  LaunchOptions options(int nproc) const {
    LaunchOptions o;
    o.nproc_per_node = nproc;
    o.master_port = 0;
    o.grace = 1000ms;
    o.drain = 100ms;  // shell workers do not raise DistError: no need to wait for them
    o.extra_env = {{"TEST_DIR", dir_}};
    return o;
  }
  static int run_sh(const LaunchOptions& o, const std::string& script) {
    return launch(o, {"/bin/sh", "-c", kPrelude + script});
  }

  std::string dir_;
};

std::map<std::string, std::string> parse_env(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// ---------------------------------------------------------------- environment

TEST_F(LaunchTest, EveryRankGetsItsEnvironmentAndItsOwnProcessGroup) {
  ScopedEnv no_omp("OMP_NUM_THREADS", nullptr);
  LaunchOptions o = options(3);
  o.master_port = static_cast<uint16_t>(find_free_port());
  ASSERT_EQ(run_sh(o,
                   "env > env.$LOCAL_RANK.tmp; mv env.$LOCAL_RANK.tmp env.$LOCAL_RANK; "
                   "put pid.$LOCAL_RANK $$; put pgid.$LOCAL_RANK $(cut -d' ' -f5 /proc/$$/stat)"),
            0);
  const std::string omp = std::to_string(std::max(1, available_cores() / 3));
  for (int local = 0; local < 3; ++local) {
    SCOPED_TRACE("local rank " + std::to_string(local));
    auto env = parse_env(read("env." + std::to_string(local)));
    EXPECT_EQ(env["RANK"], std::to_string(local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(o.master_port));
    EXPECT_EQ(env["LOOM_RESTART_COUNT"], "0");
    // The launcher serves the store (Note [Launcher]) and made the job's secret.
    EXPECT_EQ(env["LOOM_AGENT_STORE"], "1");
    EXPECT_EQ(env["LOOM_JOB_SECRET"].size(), 64u);
    EXPECT_EQ(env["LOOM_HEARTBEAT_FD"], "3");
    EXPECT_EQ(env["OMP_NUM_THREADS"], omp);
    EXPECT_EQ(env["TEST_DIR"], dir_);
    EXPECT_TRUE(env.count("PATH"));  // the launcher's own environment is passed on
    // Each worker leads its own process group, apart from the launcher's.
    EXPECT_EQ(read_int("pgid." + std::to_string(local)), read_int("pid." + std::to_string(local)));
    EXPECT_NE(read_int("pgid." + std::to_string(local)), getpgrp());
  }
}

TEST_F(LaunchTest, OmpNumThreadsOfTheUserIsKept) {
  {
    ScopedEnv omp("OMP_NUM_THREADS", "5");
    ASSERT_EQ(run_sh(options(2), "put omp.$RANK $OMP_NUM_THREADS"), 0);
    EXPECT_EQ(read_int("omp.0"), 5);
    EXPECT_EQ(read_int("omp.1"), 5);
  }
  {
    ScopedEnv no_omp("OMP_NUM_THREADS", nullptr);
    LaunchOptions o = options(2);
    o.extra_env.emplace_back("OMP_NUM_THREADS", "7");
    ASSERT_EQ(run_sh(o, "put omp.$RANK $OMP_NUM_THREADS"), 0);
    EXPECT_EQ(read_int("omp.0"), 7);
    EXPECT_EQ(read_int("omp.1"), 7);
  }
}

TEST_F(LaunchTest, FreePortIsChosenWhenPortIsZero) {
  ASSERT_EQ(run_sh(options(2), "put port.$RANK $MASTER_PORT"), 0);
  const int port = read_int("port.0");
  EXPECT_EQ(read_int("port.1"), port);
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  // The launcher closed it again: it can be bound (rank 0's store will do just that).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(fd);
  EXPECT_GT(find_free_port(), 0);
}

// ---------------------------------------------------------------- failures

TEST_F(LaunchTest, FailingRankStopsTheOthersAndLeavesNoProcess) {
  // Ranks 0 and 1 sleep 30 s in a child of theirs; rank 2 exits 3 once they have started.
  const std::string script =
      "put pid.$RANK $$; "
      "if [ $RANK = 2 ]; then waitfor child.0; waitfor child.1; exit 3; fi; "
      "sleep 30 & put child.$RANK $!; wait";
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int status = run_sh(options(3), script);
  const double elapsed = seconds_since(start);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 3);
  EXPECT_LT(elapsed, 3.0);  // SIGTERM ends them at once: no waiting for the 30 s
  EXPECT_NE(log.find("loomrun: rank 2 (pid " + std::to_string(read_int("pid.2")) +
                     ") on node 0 (127.0.0.1) exited with status 3"),
            std::string::npos)
      << log;
  for (const char* name : {"pid.0", "pid.1", "pid.2", "child.0", "child.1"})
    EXPECT_FALSE(process_alive(read_int(name))) << name << " is still alive";
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);  // every child was reaped
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(LaunchTest, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  // Rank 0 and its child ignore SIGTERM; rank 1 fails once they run.
  const std::string script =
      "if [ $RANK = 0 ]; then trap '' TERM; sleep 30 & put child.0 $!; put pid.0 $$; wait; fi; "
      "waitfor pid.0; exit 1";
  LaunchOptions o = options(2);
  o.grace = 500ms;
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int status = run_sh(o, script);
  const double elapsed = seconds_since(start);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_GE(elapsed, 0.45);
  EXPECT_LT(elapsed, 3.0);
  EXPECT_FALSE(process_alive(read_int("pid.0")));
  EXPECT_FALSE(process_alive(read_int("child.0")));
}

TEST_F(LaunchTest, ExitStatusOfTheFailingWorkerIsReturned) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_sh(options(2), "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"), 3);
  testing::internal::GetCapturedStderr();

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_sh(options(2), "if [ $RANK = 1 ]; then kill -SEGV $$; fi; sleep 30"), 128 + 11);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("loomrun: rank 1 (pid "), std::string::npos) << log;
  EXPECT_NE(log.find("killed by signal SIGSEGV"), std::string::npos) << log;

  EXPECT_EQ(run_sh(options(1), "exit 0"), 0);
}

// ---------------------------------------------------------------- restarts

TEST_F(LaunchTest, RestartRunsTheGroupAgainWithTheCountIncremented) {
  // Every rank fails on the first start and succeeds on the second.
  LaunchOptions o = options(2);
  o.max_restarts = 3;
  testing::internal::CaptureStderr();
  const int status =
      run_sh(o, "echo $LOOM_RESTART_COUNT >> runs.$RANK; [ $LOOM_RESTART_COUNT -ge 1 ]");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 0);
  EXPECT_NE(log.find("restarting the workers (restart 1 of 3)"), std::string::npos) << log;
  // A rank may be stopped by the other's failure before it writes, so only rank 0 or 1 is
  // sure to have run the first time; both ran the second time, and there was no third.
  const std::string runs0 = read("runs.0"), runs1 = read("runs.1");
  EXPECT_TRUE(runs0 == "0\n1\n" || runs0 == "1\n") << runs0;
  EXPECT_TRUE(runs1 == "0\n1\n" || runs1 == "1\n") << runs1;
  EXPECT_TRUE(runs0 == "0\n1\n" || runs1 == "0\n1\n");
}

TEST_F(LaunchTest, ExhaustedRestartsReturnTheFailure) {
  LaunchOptions o = options(1);
  o.max_restarts = 2;
  testing::internal::CaptureStderr();
  const int status = run_sh(o, "echo $LOOM_RESTART_COUNT >> runs; exit 5");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 5);
  EXPECT_EQ(read("runs"), "0\n1\n2\n");
  EXPECT_NE(log.find("giving up after 2 restart(s)"), std::string::npos) << log;
}

// ---------------------------------------------------------------- signals to the launcher

TEST_F(LaunchTest, SigtermToTheLauncherIsForwardedToTheWorkers) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  const std::string script =
      "trap 'put term.$RANK 1; exit 0' TERM; put pid.$RANK $$; while :; do sleep 0.05; done";
  std::thread sender([&] {
    if (wait_for("pid.0") && wait_for("pid.1")) kill(getpid(), SIGTERM);
  });
  LaunchOptions o = options(2);
  o.max_restarts = 2;  // an interrupted launch does not restart
  testing::internal::CaptureStderr();
  const int status = run_sh(o, script);
  const std::string log = testing::internal::GetCapturedStderr();
  sender.join();
  EXPECT_EQ(status, 128 + SIGTERM);
  EXPECT_TRUE(exists("term.0") && exists("term.1")) << "the workers did not get SIGTERM";
  EXPECT_NE(log.find("received SIGTERM"), std::string::npos) << log;
  EXPECT_EQ(log.find("restarting"), std::string::npos) << log;
  // The launcher's handlers are gone again.
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST_F(LaunchTest, SecondSignalKillsAtOnce) {
  // SIGINT is forwarded as SIGINT; the workers note it and carry on. The grace is long: the
  // second SIGINT cuts it short.
  const std::string script =
      "trap 'put got.$RANK 1' INT; put pid.$RANK $$; while :; do sleep 0.05; done";
  std::thread sender([&] {
    if (!wait_for("pid.0") || !wait_for("pid.1")) return;
    kill(getpid(), SIGINT);
    if (wait_for("got.0") && wait_for("got.1")) kill(getpid(), SIGINT);
  });
  LaunchOptions o = options(2);
  o.grace = 20000ms;
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int status = run_sh(o, script);
  const double elapsed = seconds_since(start);
  const std::string log = testing::internal::GetCapturedStderr();
  sender.join();
  EXPECT_EQ(status, 128 + SIGINT);
  EXPECT_LT(elapsed, 8.0);
  EXPECT_NE(log.find("received SIGINT again, killing the workers"), std::string::npos) << log;
  EXPECT_FALSE(process_alive(read_int("pid.0")));
  EXPECT_FALSE(process_alive(read_int("pid.1")));
}

TEST_F(LaunchTest, OnlyOneLaunchAtATime) {
  std::thread first([&] { run_sh(options(1), "put started 1; waitfor release"); });
  ASSERT_TRUE(wait_for("started"));
  EXPECT_THROW(run_sh(options(1), "exit 0"), loom::DistError);
  std::ofstream(path("release")) << "1\n";
  first.join();
}

// ---------------------------------------------------------------- bad input

// The seeds' "port already in use": which port, and both ways out.
TEST_F(LaunchTest, APortInUseIsNamedWithItsTwoFixes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  LaunchOptions o = options(1);
  o.master_port = ntohs(addr.sin_port);
  try {
    run_sh(o, "exit 0");
    ADD_FAILURE() << "a launch on a port in use went ahead";
  } catch (const loom::DistError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(o.master_port)), std::string::npos) << what;
    EXPECT_NE(what.find("ss -ltnp"), std::string::npos) << what;
    EXPECT_NE(what.find("--master-port"), std::string::npos) << what;
  }
  close(fd);
}

TEST_F(LaunchTest, BadOptionsRaiseValueError) {
  LaunchOptions o = options(1);
  EXPECT_THROW(launch(o, {}), loom::ValueError);
  o.nproc_per_node = 0;
  EXPECT_THROW(run_sh(o, "exit 0"), loom::ValueError);
  o = options(1);
  o.nnodes = 2;
  o.node_rank = 2;
  o.master_port = 29400;
  EXPECT_THROW(run_sh(o, "exit 0"), loom::ValueError);
  o.node_rank = 1;
  o.master_port = 0;  // the other node could not learn a port picked here
  EXPECT_THROW(run_sh(o, "exit 0"), loom::ValueError);
  o.master_port = 29400;  // several nodes cannot agree on a secret by themselves
  try {
    run_sh(o, "exit 0");
    ADD_FAILURE() << "two nodes without a secret were accepted";
  } catch (const loom::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_JOB_SECRET"), std::string::npos) << e.what();
  }
  o = options(1);
  o.extra_env.emplace_back("A=B", "1");
  EXPECT_THROW(run_sh(o, "exit 0"), loom::ValueError);
}

TEST_F(LaunchTest, ProgramIsFoundOnPathOrReported) {
  EXPECT_EQ(launch(options(2), {"sh", "-c", "exit 0"}), 0);
  try {
    launch(options(2), {"loom-no-such-program-here"});
    ADD_FAILURE() << "no error";
  } catch (const loom::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'loom-no-such-program-here' not found"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(path("not_executable")) << "#!/bin/sh\nexit 0\n";
  try {
    launch(options(2), {path("not_executable")});
    ADD_FAILURE() << "no error";
  } catch (const loom::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
  }
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// ---------------------------------------------------------------- helpers for self-launch

TEST(StripFlag, RemovesTheFlagWithItsValue) {
  using V = std::vector<std::string>;
  EXPECT_EQ(strip_flag(V{"--epochs", "1", "--nproc", "2", "--lr=0.1"}, "--nproc", true),
            (V{"--epochs", "1", "--lr=0.1"}));
  EXPECT_EQ(strip_flag(V{"--nproc=2", "--epochs", "1"}, "--nproc", true), (V{"--epochs", "1"}));
  EXPECT_EQ(strip_flag(V{"--nproc", "2", "a", "--nproc=4"}, "--nproc", true), (V{"a"}));
  EXPECT_EQ(strip_flag(V{"a", "--nproc"}, "--nproc", true), (V{"a"}));  // value missing
  EXPECT_EQ(strip_flag(V{"--nprocs", "3", "--nproc-x=1"}, "--nproc", true),
            (V{"--nprocs", "3", "--nproc-x=1"}));
  EXPECT_EQ(strip_flag(V{"--verbose", "x", "--verbose=true"}, "--verbose", false), (V{"x"}));
  EXPECT_EQ(strip_flag(V{"a", "--", "--nproc", "2"}, "--nproc", true),
            (V{"a", "--", "--nproc", "2"}));
  EXPECT_EQ(strip_flag(V{}, "--nproc", true), V{});
}

TEST(CurrentExecutable, IsThisTestProgram) {
  const std::string exe = current_executable();
  EXPECT_TRUE(fs::path(exe).is_absolute()) << exe;
  EXPECT_EQ(fs::path(exe).filename(), "test_launch_test");
  EXPECT_TRUE(fs::exists(exe));
}

// ---------------------------------------------------------------- the loomrun program

TEST_F(LaunchTest, LoomrunProgram) {
  const std::string loomrun = LOOM_BINARY_DIR "/apps/loomrun";
  if (!fs::exists(loomrun)) GTEST_SKIP() << loomrun << " is not built";
  const std::string quiet = " > /dev/null 2>&1";
  auto run = [&](const std::string& args) {
    const int status = std::system(
        ("cd '" + dir_ + "' && TEST_DIR='" + dir_ + "' '" + loomrun + "' " + args).c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  // Everything from the program on reaches the workers, our own flag names included.
  EXPECT_EQ(run("--nproc-per-node 2 --master-port 0 /bin/sh -c "
                "'echo \"$RANK $WORLD_SIZE $*\" > out.$RANK' prog --nnodes 5 --epochs=1" +
                quiet),
            0);
  EXPECT_EQ(read("out.0"), "0 2 --nnodes 5 --epochs=1\n");
  EXPECT_EQ(read("out.1"), "1 2 --nnodes 5 --epochs=1\n");
  // torchrun's spellings, the exit status of the failing worker, restarts.
  EXPECT_EQ(run("--nproc_per_node=2 --standalone /bin/sh -c 'exit 4'" + quiet), 4);
  EXPECT_EQ(run("--standalone --max-restarts 1 /bin/sh -c "
                "'echo $LOOM_RESTART_COUNT >> runs; [ $LOOM_RESTART_COUNT = 1 ]'" +
                quiet),
            0);
  EXPECT_EQ(read("runs"), "0\n1\n");
  // Usage errors exit 2.
  EXPECT_EQ(run(quiet), 2);
  EXPECT_EQ(run("--nproc-per-node" + quiet), 2);
  EXPECT_EQ(run("--nproc-per-node 0 /bin/true" + quiet), 2);
  EXPECT_EQ(run("--no-such-flag /bin/true" + quiet), 2);
  EXPECT_EQ(run("--help" + quiet), 0);
}

}  // namespace
