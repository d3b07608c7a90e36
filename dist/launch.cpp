// dist/launch.cpp — the launcher of Note [Launcher] (dist/launch.h): fork and exec of the
// workers, a self-pipe that turns SIGCHLD, SIGINT and SIGTERM into wake-ups of one wait loop,
// and the stop sequence (a signal to each worker's process group, SIGKILL after the grace).

#include "dist/launch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <system_error>
#include <thread>

#include "dist/node_agent.h"
#include "tensor/error.h"

extern char** environ;

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace loom::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string errno_text(int err) { return std::system_category().message(err); }

std::string signal_name(int signo) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = sigabbrev_np(signo)) return std::string("SIG") + abbrev;
#endif
  return "signal " + std::to_string(signo);
}

void report(const std::string& line) { std::fputs(("loomrun: " + line + "\n").c_str(), stderr); }

// ---------------------------------------------------------------- signals

// The write end of the self-pipe while a launch runs (-1 otherwise): the handler's only state.
std::atomic<int> g_wake_fd{-1};
std::atomic<bool> g_launch_running{false};

void on_signal(int signo) {
  const int saved_errno = errno;
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const auto byte = static_cast<unsigned char>(signo);
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);  // full pipe: a wake-up is pending
  }
  errno = saved_errno;
}

// Owns SIGINT, SIGTERM and SIGCHLD while a launch runs. Their handler only writes the signal's
// number to a pipe (about the one thing a handler may safely do); the wait loop polls the pipe,
// so a worker's exit and a Ctrl-C both wake it at once, whichever thread took the signal.
class SignalPipe {
 public:
  SignalPipe() {
    LOOM_CHECK(!g_launch_running.exchange(true), DistError,
               "launch: another launch is already running in this process");
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      const int err = errno;
      g_launch_running = false;
      throw DistError("launch: cannot create a pipe: " + errno_text(err));
    }
    g_wake_fd = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) {
      action.sa_flags = SA_RESTART | (kSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
      ::sigaction(kSignals[i], &action, &previous_[i]);
    }
  }
  ~SignalPipe() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
    g_wake_fd = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
    g_launch_running = false;
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Waits up to `timeout` for a signal. Returns SIGINT or SIGTERM when the launcher was told to
  // stop, 0 otherwise (a SIGCHLD, or the timeout: the caller looks at its children either way).
  int wait(milliseconds timeout) {
    pollfd pfd{fds_[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(timeout.count(), 0)));
    int stop_signal = 0;
    if (ready > 0) {
      unsigned char bytes[64];
      ssize_t n;
      while ((n = ::read(fds_[0], bytes, sizeof bytes)) > 0)
        for (ssize_t i = 0; i < n; ++i)
          if (bytes[i] == SIGINT || bytes[i] == SIGTERM) stop_signal = bytes[i];
    }
    return stop_signal;
  }

  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGCHLD};

 private:
  int fds_[2] = {-1, -1};
  struct sigaction previous_[3]{};
};

// ---------------------------------------------------------------- environment and program

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry)
    env.emplace_back(*entry);
  return env;
}

std::optional<std::string> find_env(const std::vector<std::string>& env, const std::string& key) {
  const std::string prefix = key + "=";
  for (const std::string& entry : env)
    if (entry.compare(0, prefix.size(), prefix) == 0) return entry.substr(prefix.size());
  return std::nullopt;
}

void set_env(std::vector<std::string>& env, const std::string& key, const std::string& value) {
  const std::string prefix = key + "=";
  for (std::string& entry : env)
    if (entry.compare(0, prefix.size(), prefix) == 0) {
      entry = prefix + value;
      return;
    }
  env.push_back(prefix + value);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Like execvp's search, done in the launcher, where failing can still say why.
std::string find_program(const std::string& name, const std::vector<std::string>& env) {
  if (name.find('/') != std::string::npos) return name;
  const std::string path = find_env(env, "PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    begin = end + 1;
  }
  throw ValueError("launch: program '" + name + "' not found on PATH=" + path);
}

// ---------------------------------------------------------------- processes

// The descriptor of the heartbeat pipe in every worker (Note [Job health] in dist/health.h).
constexpr int kHeartbeatFd = 3;

struct Worker {
  int local_rank = 0, rank = 0;
  pid_t pid = -1;  // also the id of the worker's process group
  bool running = false;
  int status = 0;        // waitpid's status, once it exited
  int heartbeats = -1;   // the read end of its heartbeat pipe
  bool beating = false;  // it has beaten once: from now on silence means it hangs
  Clock::time_point last_beat{};

  Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    if (heartbeats >= 0) ::close(heartbeats);
  }
  // Reads what the worker beat since the last look.
  void read_heartbeats(Clock::time_point now) {
    if (heartbeats < 0) return;
    char bytes[256];
    while (::read(heartbeats, bytes, sizeof bytes) > 0) {
      beating = true;
      last_beat = now;
    }
  }
};

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }
int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
std::string describe(const Worker& w, const std::string& node) {
  const std::string who = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
                          ")" + (node.empty() ? "" : " on " + node) + " ";
  if (WIFSIGNALED(w.status)) return who + "was killed by signal " + signal_name(WTERMSIG(w.status));
  return who + "exited with status " + std::to_string(exit_code(w.status));
}

// Starts `path` in a new process group. The child runs only async-signal-safe calls between
// fork and exec (other threads of the launcher may hold locks); an exec failure comes back as
// errno through a pipe that exec closes, so success reads end-of-file.
// `heartbeat_fd` (-1: none) becomes the child's descriptor kHeartbeatFd.
pid_t spawn(const std::string& path, const std::vector<std::string>& args,
            const std::vector<std::string>& env, int heartbeat_fd) {
  std::vector<char*> argv, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigset_t all, none, previous;
  sigfillset(&all);
  sigemptyset(&none);

  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0)
    throw DistError("launch: cannot create a pipe: " + errno_text(errno));
  // Blocked across fork, so that no launcher handler runs in the child before exec.
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int signo : SignalPipe::kSignals) ::sigaction(signo, &default_action, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // the launcher killed outright takes its workers
    if (::getppid() != parent) ::_exit(127);  // ... even when that happened just now
    unsigned first_closed = 3;
    if (heartbeat_fd >= 0) {
      if (heartbeat_fd == kHeartbeatFd) {
        ::fcntl(heartbeat_fd, F_SETFD, 0);
      } else {
        ::dup2(heartbeat_fd, kHeartbeatFd);  // the copy does not close on exec
      }
      first_closed = kHeartbeatFd + 1;
    }
#ifdef SYS_close_range
    // Only 0, 1, 2 (and the heartbeat pipe) reach the worker.
    ::syscall(SYS_close_range, first_closed, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    ::execve(path.c_str(), argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(error_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(error_pipe[1]);
  if (pid < 0) {
    ::close(error_pipe[0]);
    throw DistError("launch: fork failed: " + errno_text(fork_errno));
  }
  ::setpgid(pid, pid);  // the child does it too: whichever runs first, the group exists now
  int exec_errno = 0;
  ssize_t n;
  do n = ::read(error_pipe[0], &exec_errno, sizeof exec_errno);
  while (n < 0 && errno == EINTR);
  ::close(error_pipe[0]);
  if (n > 0) {
    ::waitpid(pid, nullptr, 0);
    throw ValueError("launch: cannot run '" + path + "': " + errno_text(exec_errno));
  }
  return pid;
}

// True while a process of group `pgid` lives. kill(-pgid, 0) counts zombies too, and an init
// that does not reap (as in some containers) keeps orphaned zombies forever: /proc decides.
bool group_alive(pid_t pgid) {
  if (::kill(-pgid, 0) != 0) return false;  // ESRCH: empty; EPERM: not ours to wait for
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return true;
  bool alive = false;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const std::string stat_path = std::string("/proc/") + entry->d_name + "/stat";
    FILE* file = std::fopen(stat_path.c_str(), "r");
    if (file == nullptr) continue;
    char line[512];
    const bool got = std::fgets(line, sizeof line, file) != nullptr;
    std::fclose(file);
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and ')': read after the last ')'.
    const char* close_paren = got ? std::strrchr(line, ')') : nullptr;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (close_paren != nullptr &&
        std::sscanf(close_paren + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid &&
        state != 'Z' && state != 'X') {
      alive = true;
      break;
    }
  }
  ::closedir(proc);
  return alive;
}

bool any_running(const std::vector<Worker>& workers) {
  return std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
}
bool any_group_alive(const std::vector<Worker>& workers) {
  return std::any_of(workers.begin(), workers.end(),
                     [](const Worker& w) { return w.pid > 0 && group_alive(w.pid); });
}
void signal_groups(const std::vector<Worker>& workers, int signo) {
  for (const Worker& w : workers)
    if (w.pid > 0) ::kill(-w.pid, signo);  // ESRCH (nothing left in the group) is fine
}

// Collects the workers that exited; returns the index of the first that failed, if one did.
std::optional<size_t> reap(std::vector<Worker>& workers) {
  std::optional<size_t> first_failure;
  for (size_t i = 0; i < workers.size(); ++i) {
    Worker& w = workers[i];
    if (!w.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    w.running = false;
    // ECHILD: reaped behind our back by other code of this process; the status is lost.
    w.status = r == w.pid ? status : (1 << 8);
    if (failed(w.status) && !first_failure) first_failure = i;
  }
  return first_failure;
}

// Sends `signo` to every worker's group and waits until nothing of them is left: SIGKILL after
// `grace`, or at once when the launcher is told to stop again. Returns SIGINT or SIGTERM when
// the launcher received one meanwhile, 0 otherwise.
int stop(std::vector<Worker>& workers, int signo, milliseconds grace, SignalPipe& signals) {
  signal_groups(workers, signo);
  const auto deadline = Clock::now() + grace;
  int stop_signal = 0;
  while (true) {
    reap(workers);  // the statuses of workers we stopped are not news
    if (!any_running(workers) && !any_group_alive(workers)) break;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (const int s = signals.wait(std::min(left, milliseconds(20)))) {
      stop_signal = s;
      report("received " + signal_name(s) + " again, killing the workers");
      break;
    }
  }
  signal_groups(workers, SIGKILL);  // what ignored the first signal, children included
  for (Worker& w : workers) {
    if (!w.running) continue;
    int status = 0;
    pid_t r;
    do r = ::waitpid(w.pid, &status, 0);
    while (r < 0 && errno == EINTR);
    w.running = false;
    w.status = r == w.pid ? status : (1 << 8);
  }
  // Killed orphans (not our children: nothing to wait on) die a moment later: see them go.
  for (int i = 0; i < 400 && any_group_alive(workers); ++i)
    std::this_thread::sleep_for(milliseconds(5));
  return stop_signal;
}

// ---------------------------------------------------------------- one start of the group

struct Outcome {
  int exit_code = 0;         // 0, the first failure's status, or 128 + the launcher's signal
  bool interrupted = false;  // the launcher was told to stop: no restart
};

std::string seconds_text(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// A 256-bit secret from the kernel's random source, in hex (Note [Job secret]).
std::string random_secret() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw DistError("launch: getrandom failed: " + errno_text(errno));
    got += static_cast<size_t>(n);
  }
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (const unsigned char b : raw) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

Outcome run_group(const LaunchOptions& o, const std::string& program,
                  const std::vector<std::string>& command, int round, NodeAgent& agent,
                  const std::string& secret, SignalPipe& signals) {
  std::vector<std::string> base = current_environment();
  const bool user_sets_omp =
      find_env(base, "OMP_NUM_THREADS").has_value() ||
      std::any_of(o.extra_env.begin(), o.extra_env.end(),
                  [](const auto& kv) { return kv.first == "OMP_NUM_THREADS"; });
  const int omp_threads = std::max(1, available_cores() / o.nproc_per_node);
  set_env(base, "WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node));
  set_env(base, "LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set_env(base, "GROUP_RANK", std::to_string(o.node_rank));
  set_env(base, "MASTER_ADDR", o.master_addr);
  set_env(base, "MASTER_PORT", std::to_string(agent.port()));
  set_env(base, "LOOM_AGENT_STORE", "1");
  set_env(base, "LOOM_JOB_SECRET", secret);
  set_env(base, "LOOM_HEARTBEAT_FD", std::to_string(kHeartbeatFd));
  set_env(base, "LOOM_RESTART_COUNT", std::to_string(round));
  if (!user_sets_omp) set_env(base, "OMP_NUM_THREADS", std::to_string(omp_threads));

  const int first_rank = o.node_rank * o.nproc_per_node;
  report("starting " + std::to_string(o.nproc_per_node) + " worker(s), ranks " +
         std::to_string(first_rank) + "-" + std::to_string(first_rank + o.nproc_per_node - 1) +
         " of " + std::to_string(o.nnodes * o.nproc_per_node) + ", master " + o.master_addr + ":" +
         std::to_string(agent.port()) +
         (user_sets_omp ? "" : ", OMP_NUM_THREADS=" + std::to_string(omp_threads)) +
         (round > 0 ? ", restart " + std::to_string(round) : ""));

  std::vector<Worker> workers(o.nproc_per_node);
  try {
    for (int local = 0; local < o.nproc_per_node; ++local) {
      Worker& w = workers[local];
      w.local_rank = local;
      w.rank = first_rank + local;
      std::vector<std::string> env = base;
      set_env(env, "RANK", std::to_string(w.rank));
      set_env(env, "LOCAL_RANK", std::to_string(local));
      for (const auto& [key, value] : o.extra_env) set_env(env, key, value);
      int pipe[2];
      if (::pipe2(pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        throw DistError("launch: cannot create a pipe: " + errno_text(errno));
      w.heartbeats = pipe[0];
      try {
        w.pid = spawn(program, command, env, pipe[1]);
      } catch (...) {
        ::close(pipe[1]);
        throw;
      }
      ::close(pipe[1]);
      w.running = true;
    }
  } catch (...) {
    stop(workers, SIGTERM, o.grace, signals);
    throw;
  }

  // Why the round ends, once it does: a failure here or elsewhere, or the launcher's signal.
  std::string failure;
  Outcome outcome;
  bool local_failure = false;
  while (failure.empty()) {
    const auto now = Clock::now();
    for (Worker& w : workers) w.read_heartbeats(now);
    if (const auto failed = reap(workers)) {
      // A worker that failed after another node reported the round's failure failed because
      // of it (its collective raised, naming that failure): the job's failure is that report.
      if (const auto remote = agent.poll(round)) {
        failure = *remote;
        outcome.exit_code = 1;
        break;
      }
      const Worker& w = workers[*failed];
      failure = describe(w, agent.name());
      outcome.exit_code = exit_code(w.status);
      local_failure = true;
      break;
    }
    for (Worker& w : workers) {
      if (!w.running || !w.beating || o.heartbeat_timeout.count() <= 0 ||
          now - w.last_beat < o.heartbeat_timeout)
        continue;
      failure = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") on " +
                agent.name() + " hung: no heartbeat for " + seconds_text(now - w.last_beat);
      ::kill(-w.pid, SIGKILL);  // whatever holds it, SIGTERM might not get through
      outcome.exit_code = 128 + SIGKILL;
      local_failure = true;
      break;
    }
    if (!failure.empty()) break;
    if (!any_running(workers)) return {};  // every worker succeeded
    if (const auto remote = agent.poll(round)) {
      failure = *remote;
      outcome.exit_code = 1;
      break;
    }
    if (const int s = signals.wait(milliseconds(100))) {  // SIGCHLD wakes it early
      failure = "the launcher of " + agent.name() + " received " + signal_name(s);
      outcome = {128 + s, true};
      local_failure = true;
      break;
    }
  }

  if (local_failure) agent.report_failure(round, failure, outcome.interrupted);
  const int others = static_cast<int>(
      std::count_if(workers.begin(), workers.end(), [](const Worker& x) { return x.running; }));
  report(
      (local_failure ? "" : "the job failed: ") + failure +
      (local_failure
           ? ""
           : " (seen " + seconds_text(agent.failure_age(round)) + " after it was reported)") +
      (others > 0 ? "; stopping the " + std::to_string(others) + " worker(s) of this node" : ""));
  // Workers waiting in a collective learn of the failure from the store (Note [Job health]) and
  // raise DistError naming the peer; they get `drain` to say so and exit before SIGTERM.
  if (!outcome.interrupted) {
    const auto drain_end = Clock::now() + o.drain;
    while (any_running(workers) && Clock::now() < drain_end) {
      reap(workers);
      if (const int s = signals.wait(milliseconds(20))) {
        outcome = {128 + s, true};
        break;
      }
    }
  }
  const int signo = outcome.interrupted ? outcome.exit_code - 128 : SIGTERM;
  if (const int s = stop(workers, signo, o.grace, signals)) outcome = {128 + s, true};
  agent.stopped(round);
  return outcome;
}

// Meets every node's launcher at the start of `round` (the first start or a restart). Returns
// SIGINT or SIGTERM when told to stop meanwhile, else 0; DistError when a node does not come
// within join_timeout, or the job fails meanwhile.
int join(NodeAgent& agent, int round, const LaunchOptions& o, SignalPipe& signals) {
  agent.arrive(round);
  const std::string what = round == 0 ? "start" : "restart " + std::to_string(round);
  const auto start = Clock::now();
  auto next_report = start + std::chrono::seconds(5);
  while (true) {
    const std::vector<int> missing = agent.missing(round);
    if (missing.empty()) return 0;
    if (const auto failure = agent.poll(round))
      throw DistError("launch: the job cannot " + what + ": " + *failure);
    std::string nodes;
    for (const int n : missing) nodes += (nodes.empty() ? "" : ", ") + std::to_string(n);
    const auto now = Clock::now();
    if (now - start > o.join_timeout) {
      agent.report_failure(round, "node(s) " + nodes + " did not come to " + what, true);
      throw DistError("launch: node(s) " + nodes + " did not come to " + what + " within " +
                      seconds_text(o.join_timeout) + " (--rdzv-timeout): ending the job");
    }
    if (now >= next_report) {
      report("waiting for node(s) " + nodes + " to " + what);
      next_report = now + std::chrono::seconds(10);
    }
    if (const int s = signals.wait(milliseconds(100))) {
      agent.report_failure(round,
                           "the launcher of " + agent.name() + " received " + signal_name(s) +
                               " before the workers started",
                           true);
      return s;
    }
  }
}

// After this node's workers all succeeded. Node 0 serves the store that the other nodes'
// workers may still be using: it waits until every node's workers are done.
void finish(NodeAgent& agent, int round, SignalPipe& signals) {
  agent.finish(round);
  if (agent.node_rank() != 0) return;
  auto next_report = Clock::now() + std::chrono::seconds(5);
  while (!agent.all_finished(round)) {
    if (const auto failure = agent.poll(round)) {
      report("the workers of this node finished, but the job failed: " + *failure);
      return;
    }
    if (Clock::now() >= next_report) {
      report("waiting for the other nodes' workers to finish");
      next_report = Clock::now() + std::chrono::seconds(10);
    }
    if (signals.wait(milliseconds(100))) return;
  }
}

}  // namespace

// ---------------------------------------------------------------- public functions

int launch(const LaunchOptions& o, const std::vector<std::string>& command) {
  LOOM_CHECK(!command.empty() && !command[0].empty(), ValueError, "launch: no program to run");
  LOOM_CHECK(o.nproc_per_node >= 1, ValueError, "launch: nproc_per_node must be at least 1; got ",
             o.nproc_per_node);
  LOOM_CHECK(o.nnodes >= 1, ValueError, "launch: nnodes must be at least 1; got ", o.nnodes);
  LOOM_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, ValueError,
             "launch: node_rank must be in [0, nnodes); got node_rank=", o.node_rank,
             " nnodes=", o.nnodes);
  LOOM_CHECK(o.max_restarts >= 0, ValueError, "launch: max_restarts must be >= 0; got ",
             o.max_restarts);
  LOOM_CHECK(o.grace.count() >= 0 && o.drain.count() >= 0, ValueError,
             "launch: grace and drain must be >= 0 ms; got ", o.grace.count(), " and ",
             o.drain.count());
  LOOM_CHECK(!o.master_addr.empty(), ValueError, "launch: master_addr is empty");
  LOOM_CHECK(o.master_port != 0 || o.nnodes == 1, ValueError,
             "launch: master_port 0 (any free port) works on one node only, the other nodes "
             "could not learn it; got nnodes=",
             o.nnodes);
  LOOM_CHECK(!o.secret.empty() || o.nnodes == 1, ValueError, "launch: ", o.nnodes,
             " nodes need a secret that every node's launcher is given (Note [Job secret]): "
             "export LOOM_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n') on every "
             "node, or give each --secret-file with the same file");
  for (const auto& [key, value] : o.extra_env)
    LOOM_CHECK(!key.empty() && key.find('=') == std::string::npos, ValueError,
               "launch: bad environment variable name '", key, "'");

  SignalPipe signals;  // from here on, SIGINT and SIGTERM are the launcher's to forward
  std::vector<std::string> env = current_environment();
  for (const auto& [key, value] : o.extra_env) set_env(env, key, value);
  const std::string program = find_program(command[0], env);
  const std::string secret = o.secret.empty() ? random_secret() : o.secret;

  NodeAgent agent({.nnodes = o.nnodes,
                   .node_rank = o.node_rank,
                   .nproc_per_node = o.nproc_per_node,
                   .max_restarts = o.max_restarts,
                   .master_addr = o.master_addr,
                   .master_port = o.master_port,
                   .secret = secret,
                   .rdzv_id = o.rdzv_id,
                   .bind_all = o.store_bind_all,
                   .join_timeout = o.join_timeout,
                   .node_timeout = o.node_timeout});
  for (int round = 0;; ++round) {
    if (const int s = join(agent, round, o, signals)) return 128 + s;
    const Outcome outcome = run_group(o, program, command, round, agent, secret, signals);
    if (outcome.exit_code == 0) {
      finish(agent, round, signals);
      return 0;
    }
    if (outcome.interrupted || agent.job_stopped()) return outcome.exit_code;
    if (round >= o.max_restarts) {
      if (o.max_restarts > 0)
        report("giving up after " + std::to_string(o.max_restarts) + " restart(s)");
      agent.wait_stopped(round);
      return outcome.exit_code;
    }
    report("restarting the workers (restart " + std::to_string(round + 1) + " of " +
           std::to_string(o.max_restarts) + ")" +
           (o.nnodes > 1 ? ", with every node's launcher" : ""));
  }
}

uint16_t find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw DistError("find_free_port: socket failed: " + errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const int err = errno;
    ::close(fd);
    throw DistError("find_free_port: cannot bind a port: " + errno_text(err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string current_executable() {
  std::string buffer(256, '\0');
  while (true) {
    const ssize_t n = ::readlink("/proc/self/exe", buffer.data(), buffer.size());
    if (n < 0)
      throw DistError("current_executable: readlink /proc/self/exe failed: " + errno_text(errno));
    if (static_cast<size_t>(n) < buffer.size()) {
      buffer.resize(n);
      return buffer;
    }
    buffer.resize(buffer.size() * 2);
  }
}

std::vector<std::string> strip_flag(const std::vector<std::string>& args, const std::string& flag,
                                    bool has_value) {
  std::vector<std::string> kept;
  const std::string with_value = flag + "=";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      kept.insert(kept.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (arg == flag) {
      if (has_value) ++i;  // and its value
      continue;
    }
    if (arg.compare(0, with_value.size(), with_value) == 0) continue;
    kept.push_back(arg);
  }
  return kept;
}

}  // namespace loom::dist
