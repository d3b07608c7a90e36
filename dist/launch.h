// dist/launch.h — the process launcher of data parallelism: torchrun's behaviour for loom
// programs. launch() starts one worker process per local rank with PyTorch's environment
// (DESIGN.md decision 9), watches them, stops them all when one fails, and can restart the
// group. apps/loomrun is its command line; an app can also re-launch itself (`--nproc N`).
//
// Note [Launcher]
//   Every worker runs `command` in its own process group (the launcher signals the group, so
//   whatever the worker started goes too) with, besides the launcher's own environment:
//     RANK = node_rank * nproc_per_node + LOCAL_RANK     LOCAL_RANK = 0 .. nproc_per_node-1
//     WORLD_SIZE = nnodes * nproc_per_node                LOCAL_WORLD_SIZE = nproc_per_node
//     MASTER_ADDR, MASTER_PORT, GROUP_RANK = node_rank    LOOM_RESTART_COUNT = 0, 1, ...
//     OMP_NUM_THREADS = max(1, cores / nproc_per_node), unless already set (the ranks of one
//                       machine split its cores: DESIGN.md decision 5)
//   then extra_env, which overrides all of the above. Workers start with file descriptors
//   0, 1 and 2 only; should the launcher be killed outright (SIGKILL), each worker gets
//   SIGKILL too (what a worker started itself is its own to clean up).
//   - When every worker exits 0, launch() returns 0.
//   - When one exits non-zero or is killed by a signal, the launcher reports it on stderr
//     ("loomrun: rank 1 (pid 4242) killed by signal SIGSEGV"), sends SIGTERM to the other
//     workers' groups, SIGKILL after `grace`, and returns once no process of the group is left.
//   - SIGINT or SIGTERM sent to the launcher is forwarded to the workers the same way (a second
//     one sends SIGKILL at once); launch() then returns 128 + that signal, without restarting.
//
// Note [Restarts]
//   With max_restarts > 0, a failed group is stopped and the whole group started again, up to
//   max_restarts times, with LOOM_RESTART_COUNT incremented. The launcher keeps no state of
//   its own: a worker that sees LOOM_RESTART_COUNT > 0 is expected to resume from its last
//   checkpoint (model, optimizer, scheduler, data loader, step), or it starts over. When the
//   restarts are exhausted, launch() returns the status of the last failure: the worker's exit
//   status, or 128 + signal. With master_port 0 each start gets a fresh port. With nnodes > 1
//   each node's launcher sees only its own workers: the others learn of a failure through
//   their workers' collectives failing, and restart on their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::dist {

struct LaunchOptions {
  int nproc_per_node = 1;                 // workers on this machine
  int nnodes = 1;                         // machines taking part
  int node_rank = 0;                      // this machine's index, 0 .. nnodes-1
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the store
  uint16_t master_port = 29500;           // 0: any free port (single node only)
  int max_restarts = 0;                   // see Note [Restarts]
  std::vector<std::pair<std::string, std::string>> extra_env;  // set last, override the rest
  std::chrono::milliseconds grace{5000};                       // SIGTERM -> SIGKILL
};

// Starts the workers of `command` (a program, found on PATH when it has no '/', and its
// arguments) and waits for them: see Note [Launcher]. Returns 0 when all succeed, else the
// failing worker's exit status (128 + signal when killed). ValueError for bad options or a
// program that cannot be found or run; DistError when the system refuses (fork, pipe, ...).
// One launch at a time per process: it owns SIGINT, SIGTERM and SIGCHLD while it runs.
int launch(const LaunchOptions& options, const std::vector<std::string>& command);

// Binds a TCP socket to port 0 on every interface, reads the port the kernel chose, closes
// it. Another process may take the port before it is used: good enough for one machine.
uint16_t find_free_port();

// The path of the running program (/proc/self/exe), for an app that re-launches itself:
//   std::vector<std::string> args(argv + 1, argv + argc);
//   args = strip_flag(args, "--nproc", /*has_value=*/true);
//   args.insert(args.begin(), current_executable());
//   return launch(options, args);
std::string current_executable();

// args without every occurrence of `flag`: "--nproc 2" and "--nproc=2" when has_value,
// "--nproc" and "--nproc=..." otherwise. Arguments after "--" are kept as they are.
std::vector<std::string> strip_flag(const std::vector<std::string>& args, const std::string& flag,
                                    bool has_value);

}  // namespace loom::dist
