// dist/process_group.h — collectives between the ranks of a job, asynchronous: every call
// returns a Work handle at once and the operation runs in the background, in the order calls
// were made (the same order on every rank: that is the caller's contract, as in PyTorch).
// Tensors are reduced in place. Two backends share this interface: gloo over TCP for CPU
// tensors (and CUDA tensors staged through the host), nccl for CUDA tensors. Both check that
// the ranks call the same collectives on alike tensors (Note [Collective checks],
// dist/collective_checks.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/collective_checks.h"
#include "dist/store.h"
#include "tensor/tensor.h"

namespace loom::dist {

// Seconds on the steady clock, the time base of Work's timestamps, the reducer's timeline and
// traces (one clock for all processes of a machine).
double steady_seconds();

enum class ReduceOp { Sum, Avg, Max, Min };
const char* to_string(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() const = 0;
  // Blocks until done; rethrows the operation's error (DistError). A timeout of zero means
  // the process group's own timeout, counted from when the operation starts (it then fails by
  // itself and wait() rethrows why); a positive timeout that passes first raises DistError
  // while the operation goes on. "Done" is what the caller's next work can rely on: for gloo
  // the result is in the tensors; for NCCL (as PyTorch's) the caller's current CUDA stream is
  // ordered after the collective and the host goes on at once, unless the group blocks
  // (Note [NCCL streams and waits]). A failure found later is raised by the next call.
  virtual void wait(Milliseconds timeout = Milliseconds(0)) = 0;
  // Seconds between the start and the end of the operation on its thread (for timelines).
  virtual double started_at() const = 0;   // seconds on the steady clock
  virtual double finished_at() const = 0;  // 0 until completed
};

// Note [Bytes moved]
// Every collective adds to its group's counters when it is called: one call, its payload (the
// bytes of the tensor reduced, broadcast or sent; for the all-gather and the reduce-scatter the
// whole flat buffer, N times one rank's piece) and its bus bytes, what each rank sends over its
// link under a bandwidth-optimal (ring) algorithm, as nccl-tests count them:
//   allreduce       2 (N-1)/N x payload   a reduce-scatter, then an all-gather
//   reduce_scatter    (N-1)/N x payload   each rank passes on N-1 of the N pieces
//   allgather         (N-1)/N x payload   likewise
//   alltoall          (N-1)/N x payload   each rank keeps 1 of its N pieces, sends the others
//   broadcast               1 x payload   a pipelined chain forwards the whole tensor
//   send                    1 x payload   (recv and barrier: 0)
// These are the figures of the ZeRO paper's argument: DDP's allreduce of Psi gradients moves
// 2 Psi per rank; ZeRO-1 and ZeRO-2 a reduce-scatter of the gradients and an all-gather of the
// parameters, 2 Psi again; ZeRO-3 all-gathers the parameters twice (forward and backward) and
// reduce-scatters the gradients once, 3 Psi, 1.5 times DDP's. The count is the algorithm's, not
// a sniffed socket: gloo's broadcast sends N-1 copies from the root, for one.
struct CollectiveStats {
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  int64_t bus_bytes = 0;
};
using CollectiveCounters = std::map<std::string, CollectiveStats>;  // by op name
// The counters as a table (op, calls, payload, bus bytes), with a total row.
std::string format_counters(const CollectiveCounters& counters);
// Adds `more` into `total`, op by op (a run's counters over its steps).
void accumulate(CollectiveCounters& total, const CollectiveCounters& more);
// The bus bytes (Note [Bytes moved]) of one call of `op` with `payload` bytes in a group of `size`.
int64_t bus_bytes(const std::string& op, int64_t payload, int size);

// True when `parts` lie back to back in one storage, in order: a flat buffer's pieces.
bool lie_back_to_back(const std::vector<Tensor>& parts);

// What every backend's alltoall checks first (ShapeError, ValueError; `backend` names it).
void check_alltoall(const char* backend, const Tensor& out, const Tensor& input, int size);

// False when LOOM_SHARED_MEMORY=0.
bool shared_memory_from_environment();

struct ProcessGroupOptions {
  Milliseconds timeout{std::chrono::minutes(5)};
  // Note [Collective checks]; LOOM_CHECK_COLLECTIVES=0 makes the default off.
  bool check_collectives = check_collectives_from_environment();
  // gloo: allreduce, broadcast, all-gather and reduce-scatter through shared memory when every
  // rank is on this host (Note [Shared-memory allreduce] in dist/shm_collectives.h);
  // LOOM_SHARED_MEMORY=0 makes the default off.
  bool shared_memory = shared_memory_from_environment();
};

// What every make_<backend>_process_group checks first (ValueError naming `op`): a store, a rank
// inside a group of `size`, a positive timeout.
void check_group_arguments(const char* op, const Store* store, int rank, int size,
                           const ProcessGroupOptions& options);

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;
  // What carries the bytes, in words: gloo says which collectives go through shared memory (Note
  // [Shared-memory allreduce]) and which over tcp, and why not where shared memory was asked for.
  virtual std::string transport() const { return backend(); }
  // The two in one phrase, as the apps and benches print them: "gloo over tcp", "gloo over
  // shared memory (...) and tcp (the rest)", or "nccl" where the backend is its own transport.
  std::string carrier() const;

  // All ranks: t = op(t of every rank). Contiguous tensors of a floating or integer dtype.
  virtual std::shared_ptr<Work> allreduce(Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  // t of rank `root` to every rank.
  virtual std::shared_ptr<Work> broadcast(Tensor t, int root = 0) = 0;
  // out[r] = input of rank r; out has size() tensors shaped like input.
  virtual std::shared_ptr<Work> allgather(std::vector<Tensor> out, Tensor input) = 0;
  // out = op over ranks of inputs[rank()] (each rank gives size() inputs shaped like out).
  virtual std::shared_ptr<Work> reduce_scatter(Tensor out, std::vector<Tensor> inputs,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  // PyTorch's all_to_all_single with even splits: `input` is size() pieces of input.numel() /
  // size() elements, piece r for rank r, and piece r of `out` is what rank r sent this rank.
  // out and input: contiguous, alike in dtype and numel, distinct storage.
  virtual std::shared_ptr<Work> alltoall(Tensor out, Tensor input) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;
  virtual std::shared_ptr<Work> send(Tensor t, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(Tensor t, int src, int tag = 0) = 0;

  // The flat forms (PyTorch's all_gather_into_tensor and reduce_scatter_tensor), what the
  // sharded stages use: `out` holds size() pieces of input's numel back to back, piece r rank
  // r's input; `input` holds size() pieces of out's numel, and rank r gets the reduction of
  // every rank's piece r. No copy where the backend can work on the flat buffer (both do), and
  // input may be out's piece rank() (an all-gather in place).
  std::shared_ptr<Work> allgather_into_tensor(Tensor out, Tensor input);
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor out, Tensor input,
                                              ReduceOp op = ReduceOp::Sum);

  // Note [Bytes moved]: what this group's collectives moved since it was made (or reset).
  virtual CollectiveCounters counters() const;
  virtual void reset_counters();

 protected:
  // Backends call it once per collective they accept.
  void count(const std::string& op, int64_t payload_bytes);

  int rank_, size_;

 private:
  mutable std::mutex counters_mutex_;
  CollectiveCounters counters_;
};

// Gloo over TCP (Debian's libgloo-dev): ranks exchange addresses through `store`.
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, ProcessGroupOptions options = {});

}  // namespace loom::dist
