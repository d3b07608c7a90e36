// dist/doctor.h — `loomrun --doctor [launch flags] PROGRAM ARGS...`: the pre-flight checklist
// of the PyTorch practitioners' guides as a command. It launches the job exactly as a real
// launch would, but every rank runs the checks instead of the program, and rank 0 prints one
// line per check and rank (✓, or ✗ with the fix). Exit 0 when all pass, 1 otherwise.
//
// Note [The doctor]
//   loomrun --doctor calls launch() with the real LaunchOptions (nnodes, node rank, master
//   address and port, secret) and the command `loomrun --doctor-rank -- PROGRAM ARGS...`, so
//   the store, the secret and the workers' environment are those of the job. What is looked at,
//   and the failure of the guides' checklist that each one catches before hours are lost:
//   - MASTER_PORT free on the master host (node 0's launcher binds it for the store): "address
//     already in use" from an earlier run that still holds it.
//   - the store reachable from every node ("telnet MASTER_ADDR MASTER_PORT"): a firewall, or a
//     --master-addr that is node 0's loopback or private address the other hosts cannot reach.
//   - devices (--gpus N, --backend nccl): the GPU count, and one GPU per local rank under nccl
//     (two local ranks on cuda:0 is the classic "every rank runs out of memory on cuda:0").
//   - a collective: an allreduce of ones through the job's backend, which sums to the world
//     size ("NCCL OK"): a wrong interface (LOOM_GLOO_IFACE), a blocked port range.
//   - --data readable on every rank and the same on every host: each rank walks it (each file
//     opened and its first bytes read) and hashes the sorted names, sizes and first 4 KiB; a
//     host whose hash differs from rank 0's trains on other data without any error.
//   - --checkpoint-dir writable on every rank (a file written, renamed, removed): the first
//     checkpoint must not fail after an epoch of training.
//   - one build: the SHA-256 of PROGRAM (found as execvp finds it) on every rank against rank
//     0's; two builds of one program may disagree on the model, the data order or the protocol.
//   - threads x local ranks not above the cores this process may use: oversubscribed cores
//     make every step wait on the slowest thread.
//   - the global batch and the linear LR rule spelled out (information): --batch-size is per
//     rank, and --scale-lr multiplies the lr by the world size.
//   Each rank publishes its lines in the store under "doctor/"; rank 0 gathers them and prints
//   them by rank with a summary; each node's local rank 0 writes the verdict to the file
//   LOOM_DOCTOR_RESULT names, which that node's loomrun turns into its exit status. The ranks
//   exit 0 either way, so that the launcher does not stop a rank still checking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/launch.h"

namespace loom::dist {

// One line of the report: "✓ line", or "✗ line" followed by the fix.
struct DoctorCheck {
  bool ok = true;
  std::string line;
  std::string fix;  // empty when ok
};
// "✓ line" or "✗ line\n      fix: fix".
std::string format_check(const DoctorCheck& check, const std::string& indent = "  ");

// The flags of loom's apps that the checks look at, read from PROGRAM's arguments
// ("--flag value" and "--flag=value"; the last one counts, as the apps' parsers do).
struct ProgramFlags {
  int gpus = 0;
  std::string backend = "gloo";  // nccl by default with --gpus, as the apps do
  std::string data, checkpoint_dir;
  int threads = 0;         // 0: not given (the program uses OMP_NUM_THREADS or every core)
  std::string batch_size;  // as written; empty: the program's default
  std::string lr;          // as written; empty: the program's default
  bool scale_lr = false;
};
ProgramFlags parse_program_flags(const std::vector<std::string>& args);

// --- the checks, one function each (the rank's side; comparisons take rank 0's value) ------

// `visible` CUDA devices (why_none: why there are none).
DoctorCheck check_devices(const ProgramFlags& flags, int node, int local_rank, int local_world_size,
                          int visible, const std::string& why_none);

// What a rank sees of --data: count, bytes and the hash of names, sizes and first bytes.
struct DataSummary {
  int64_t files = 0, bytes = 0;
  std::string hash;     // hex SHA-256; empty when `error`
  std::string listing;  // "relative/path\tsize\tsha256-of-first-4KiB\n" per file, sorted
  std::string error;    // the first file that could not be read, and why
};
DataSummary summarize_data(const std::string& path);
// rank 0 passes zero == nullptr (it is the reference).
DoctorCheck compare_data(const std::string& path, int node, const DataSummary& mine,
                         const DataSummary* zero);

DoctorCheck check_checkpoint_dir(const std::string& dir, int node, int rank);

// The file execvp would run for `program` (PATH search when it has no '/'); "" when none.
std::string resolve_program(const std::string& program);
struct BuildSummary {
  std::string path;  // resolved
  int64_t bytes = 0;
  std::string hash;  // empty when `error`
  std::string error;
};
BuildSummary summarize_build(const std::string& program);
DoctorCheck compare_build(const std::string& program, int node, const BuildSummary& mine,
                          const BuildSummary* zero);

// threads: --threads T when given, else OMP_NUM_THREADS (from_env names where it came from).
DoctorCheck check_threads(int threads, const std::string& source, int local_world_size, int cores,
                          int node);
// The cores this process may run on (sched_getaffinity).
int usable_cores();

DoctorCheck lr_rule(const ProgramFlags& flags, int world);

// The line for a launch that failed before any rank ran (launch() raised): MASTER_PORT in use,
// or the launcher could not join the job.
DoctorCheck launch_failure(const LaunchOptions& options, const std::string& what);

// --- the two halves -------------------------------------------------------------------------

// `loomrun --doctor`: launches `command` checked by doctor ranks; the exit status (0, 1).
int run_doctor(const LaunchOptions& options, const std::vector<std::string>& command);
// The hidden `loomrun --doctor-rank -- PROGRAM ARGS...`: one rank's checks (Note [The doctor]).
int run_doctor_rank(const std::vector<std::string>& command);

}  // namespace loom::dist
