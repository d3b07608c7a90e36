// tests/dist/multiprocess.h — runs a test body in real processes, one per rank. The parent forks
// every rank before any thread exists (forking a process with threads, OpenMP's included, is
// unsafe), rank 0 serves a TCPStore on a free port and passes the port to the others through a
// pipe, and the parent fails the test when a rank fails, crashes or outlives the deadline (it
// is then killed, so a bug cannot hang ctest).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group.h"
#include "dist/store.h"
#include "tensor/accelerator.h"

namespace loom::test {

struct Rank {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<dist::TCPStore> store;  // rank 0 serves it
};

// This rank's gloo group, with a short timeout so that a test that deadlocks fails quickly.
inline std::shared_ptr<dist::ProcessGroup> gloo_group(Rank& r) {
  return dist::make_gloo_process_group(r.store, r.rank, r.world_size,
                                       {.timeout = std::chrono::seconds(10)});
}

namespace multiprocess {

// In the child: connect to the job's store, run the body, then hold rank 0's server up until
// every rank is done with it. The exit status: 0 ok, 1 a failed expectation, 2 an exception.
inline int run_rank(int rank, int world_size, const std::function<void(Rank&)>& body,
                    int port_pipe[2], std::chrono::milliseconds store_timeout) {
  try {
    Rank r;
    r.rank = rank;
    r.world_size = world_size;
    dist::TCPStoreOptions options;
    options.timeout = store_timeout;
    if (rank == 0) {
      ::close(port_pipe[0]);
      options.is_server = true;
      options.port = 0;
      r.store = std::make_shared<dist::TCPStore>(options);
      const uint16_t port = r.store->port();
      for (int i = 1; i < world_size; ++i)
        if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) return 3;
      ::close(port_pipe[1]);
    } else {
      ::close(port_pipe[1]);
      pollfd p{port_pipe[0], POLLIN, 0};
      uint16_t port = 0;
      if (::poll(&p, 1, static_cast<int>(store_timeout.count())) != 1 ||
          ::read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) {
        std::fprintf(stderr, "rank %d: rank 0 never announced its store's port\n", rank);
        return 3;
      }
      ::close(port_pipe[0]);
      options.port = port;
      r.store = std::make_shared<dist::TCPStore>(options);
    }
    body(r);
    r.store->set("harness/done/" + std::to_string(rank), std::string("1"));
    if (rank == 0) {
      std::vector<std::string> keys;
      for (int i = 0; i < world_size; ++i) keys.push_back("harness/done/" + std::to_string(i));
      r.store->wait(keys, store_timeout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: uncaught exception: %s\n", rank, e.what());
    return 2;
  }
  return ::testing::Test::HasFailure() ? 1 : 0;
}

}  // namespace multiprocess

// Runs body(rank) in world_size forked processes and fails the calling test if any of them
// fails. Expectations inside the body are reported by the rank that made them.
inline void run_ranks(int world_size, const std::function<void(Rank&)>& body,
                      std::chrono::milliseconds deadline = std::chrono::seconds(10),
                      std::chrono::milliseconds store_timeout = std::chrono::seconds(5)) {
  int port_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  std::fflush(nullptr);
  std::cout.flush();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int status = multiprocess::run_rank(rank, world_size, body, port_pipe, store_timeout);
      std::cout.flush();
      std::fflush(nullptr);
      ::_exit(status);  // no atexit handlers, no gtest teardown in the child
    }
    ASSERT_GT(pid, 0) << "fork failed";
    pids.push_back(pid);
  }
  ::close(port_pipe[0]);
  ::close(port_pipe[1]);

  const auto give_up = std::chrono::steady_clock::now() + deadline;
  std::vector<int> statuses(world_size, -1);
  std::vector<bool> running(world_size, true);
  int left = world_size;
  while (left > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (!running[rank]) continue;
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        statuses[rank] = status;
        running[rank] = false;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > give_up) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (!running[rank]) continue;
        ::kill(pids[rank], SIGKILL);
        ::waitpid(pids[rank], nullptr, 0);
        statuses[rank] = 0;  // reported here, not below
        ADD_FAILURE() << "rank " << rank << " was still running after " << deadline.count()
                      << " ms and was killed";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const int status = statuses[rank];
    if (WIFSIGNALED(status)) {
      ADD_FAILURE() << "rank " << rank << " was killed by signal " << WTERMSIG(status);
    } else if (WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "rank " << rank << " failed (exit status " << WEXITSTATUS(status) << ")";
    }
  }
}

// How many GPUs a child process sees. The parent must not initialise CUDA itself (the ranks are
// forked from it, and CUDA does not survive a fork), so a forked child answers instead.
inline int visible_gpus() {
  static const int count = [] {
    if (!cuda_is_built()) return 0;
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
  }();
  return count;
}

// Skips a multi-process test that needs n GPUs (asked of a forked child, see visible_gpus).
#define LOOM_SKIP_WITHOUT_GPUS(n)                                                \
  do {                                                                           \
    if (!::loom::cuda_is_built()) GTEST_SKIP() << "loom was built without CUDA"; \
    if (::loom::test::visible_gpus() < (n))                                      \
      GTEST_SKIP() << "fewer than " << (n) << " GPUs visible";                   \
  } while (0)

}  // namespace loom::test
