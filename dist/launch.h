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
//   The launcher of node 0 serves the job's store (dist/store.h) at MASTER_ADDR:MASTER_PORT, and
//   tells the workers so (LOOM_AGENT_STORE=1: rank 0 connects to it like every other rank), with
//   the job's secret in LOOM_JOB_SECRET (Note [Job secret]) and a heartbeat pipe in
//   LOOM_HEARTBEAT_FD (Note [Job health] in dist/health.h).
//   - When every worker of every node exits 0, launch() returns 0.
//   - When one exits non-zero, is killed by a signal, or hangs (it has beaten once, then stays
//     silent for heartbeat_timeout), the launcher reports it on stderr ("loomrun: rank 1 (pid
//     4242) on node 0 (10.0.0.1) was killed by signal SIGSEGV"), and to every node's launcher
//     through the store; every launcher gives its workers `drain` to raise DistError and exit
//     (their collectives learn of the failure from the store), then sends SIGTERM to the rest,
//     SIGKILL after `grace`, and returns once no process of its workers is left.
//   - SIGINT or SIGTERM sent to the launcher is forwarded to the workers the same way (a second
//     one sends SIGKILL at once); launch() then returns 128 + that signal, without restarting.
//
// Note [Restarts]
//   With max_restarts > 0, a failed group is stopped and the whole group started again, up to
//   max_restarts times, with LOOM_RESTART_COUNT incremented: on every node together (Note
//   [Launchers together]). The launcher keeps no state of the training: a worker that sees
//   LOOM_RESTART_COUNT > 0 is expected to resume from its last checkpoint (model, optimizer,
//   scheduler, data loader, step), or it starts over. When the restarts are exhausted, launch()
//   returns the status of the last failure: the worker's exit status, or 128 + signal (1 on a
//   node whose own workers did not fail). A launcher that was told to stop (SIGINT, SIGTERM)
//   ends the job on every node, without restarts.
//
// Note [Launchers together]
//   The launchers of a job's nnodes machines meet at the store of node 0's launcher (dist/
//   node_agent.h holds their keys). Each round (the start, then each restart) begins when every
//   node's launcher has arrived; a node missing after join_timeout ends the job, naming it.
//   During a round each launcher beats about four times a second and reads the round's
//   failure count; node 0 declares a launcher silent for node_timeout gone (its host is down or
//   cut off), and the other nodes stop when node 0's store no longer answers. A failure is seen
//   by every launcher within a quarter of a second of its report, and every worker is gone
//   within drain + grace after that. Membership is fixed: --nnodes is a number, not torchrun's
//   MIN:MAX (docs/decisions.md).
//
// Note [Job secret]
//   Every connection to the job's store proves that it knows the job's secret (dist/store.h).
//   One node's launcher makes a random one when it is given none; the launchers of several
//   nodes cannot agree on one by themselves, so they must be given the same (LOOM_JOB_SECRET,
//   or loomrun --secret-file), as Horovod's runner is. Workers get it in LOOM_JOB_SECRET.
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
  // Note [Launchers together] and [Job secret]
  std::string rdzv_id = "loom";  // the job's name: the launchers of another job are refused
  std::string secret;            // empty: made here (one node only)
  bool store_bind_all = false;   // node 0 serves the store on every interface
  std::chrono::milliseconds heartbeat_timeout{15000};  // a worker silent this long hangs; 0: off
  std::chrono::milliseconds node_timeout{15000};       // a launcher silent this long is gone
  std::chrono::milliseconds join_timeout{300000};      // every node at each round's start
  std::chrono::milliseconds drain{3000};  // workers' time to raise and exit after a failure
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
