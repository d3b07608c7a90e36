// dist/shm_collectives.h — the allreduce, broadcast, all-gather and reduce-scatter of a gloo
// group whose ranks all run on one host, through a shared-memory segment instead of TCP over
// loopback (Note [Shared-memory allreduce]).
//
// Note [Shared-memory allreduce]
// On one host, gloo's TCP allreduce moves every byte through the kernel twice (a send copies it
// into a socket buffer, a receive out of it) and wakes gloo's event loop per message: on the
// project's 2-core machines it ran at about 1 GB/s of bus bandwidth against 10 GB/s of memcpy,
// and all of that CPU time comes out of the training step, which shares the cores
// (docs/cpu_speed.md). Here the ranks of a group instead map one segment of /dev/shm, with two
// buffers of `size` slots each, one slot per rank, and reduce in rounds of one chunk of the
// tensor (at most a slot's bytes):
//   1. each rank copies the pieces of its chunk that other ranks reduce into its slot (piece p,
//      about 1/size of the chunk, cut at cache lines, is rank p's to reduce), then raises its
//      `copied` flag to the round's number;
//   2. once every rank's `copied` has reached the round, rank p folds piece p of every rank, in
//      rank order (its own from its tensor, the others' from their slots), into its slot,
//      divides it for Avg, copies it into its tensor, and raises its `reduced` flag;
//   3. once every rank's `reduced` has reached the round, each rank copies the other ranks'
//      reduced pieces from their slots into its tensor.
// A round writes the buffer the round before last wrote, and every rank raised its `reduced`
// flag of the round before only after it had read all it needs of that buffer: two buffers
// make the rounds safe without a third flag. Each piece is reduced once and copied to every
// rank, so every rank gets the same bits; for two ranks these are gloo's TCP bits too (a + b).
// Per rank and byte of the tensor that is about 4.5 bytes of memory traffic for two ranks and
// no system call while the peers keep pace: a waiting rank spins briefly, then sleeps on a
// futex of the flag it waits for (the two cores are shared with the compute threads).
// The other collectives run the same rounds: a broadcast's root copies a chunk in and the others
// copy it out; in an all-gather every rank copies a chunk of its input in and the others' out;
// in a reduce-scatter every rank copies in the chunks of its inputs that the others reduce, and
// folds its own piece as above. Every round of every kind raises both flags (the second then
// means "done reading"), so the two-buffer argument holds for all of them, and so does the
// reading of the descriptors below.
//
// Failures: a rank whose group fails (GroupState::fail) aborts the segment, and every rank
// waiting in it raises at once with the reason; a waiting rank also checks every 50 ms that
// every peer is alive (its pid; a peer may itself wait for a dead one), so that a rank that died
// is named in well under a second, and raises at the collective's deadline. The first round of
// each collective compares the ranks' descriptors (kind, count, dtype, op or root), so that a
// mismatch raises instead of reducing unrelated bytes, even with the collective checks off.
//
// Which groups: every rank must map the segment rank 0 made (a random token inside it proves
// that they share /dev/shm) and share rank 0's network and pid namespaces (loom's test hosts
// are network namespaces of one machine: ranks on different "hosts" keep TCP, so that a failed
// link fails their collectives as it would between machines). LOOM_SHARED_MEMORY=0 turns it
// off (ProcessGroupOptions::shared_memory). Rank 0 unlinks the segment's name as soon as every
// rank has mapped it: the segment then lives as long as its mappings, and no name is left in
// /dev/shm once a group exists. docs/decisions.md says why it is on by
// default, unlike in PyTorch's gloo.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "dist/store.h"

namespace loom::dist {

class ShmCollectives {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // Collective over the group (every rank calls it at the same point of its store traffic):
  // the segment every rank maps, or nullptr on every rank alike, with the reason in `why_not`.
  static std::unique_ptr<ShmCollectives> connect(Store& store, int rank, int size,
                                                 Milliseconds timeout, std::string& why_not);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // data = op over every rank's data, in place, the same bits on every rank. `op_name` names
  // the collective in errors. Throws DistError at `deadline`, when a peer aborts or exits, on a
  // peer's different count, dtype or op, and as soon as `failed` (polled while waiting) returns
  // a reason.
  void allreduce(void* data, int64_t n, DType dtype, ReduceOp op, Deadline deadline,
                 const std::function<std::string()>& failed);

  // The `bytes` bytes at data of rank `root`, to every rank (in place); raises as allreduce.
  void broadcast(void* data, int64_t bytes, int root, Deadline deadline,
                 const std::function<std::string()>& failed);

  // out[q] = rank q's `bytes` bytes at input (out[rank] may be input itself: in place).
  void allgather(const void* input, const std::vector<void*>& out, int64_t bytes, Deadline deadline,
                 const std::function<std::string()>& failed);

  // out = op over the ranks of their inputs[rank], n elements each; out may be inputs[rank]
  // itself, and the other inputs are only read.
  void reduce_scatter(void* out, const std::vector<const void*>& inputs, int64_t n, DType dtype,
                      ReduceOp op, Deadline deadline, const std::function<std::string()>& failed);

  // Makes every rank's waits in the segment raise at once, naming this rank and `why`.
  void abort(const std::string& why);

  struct Header;  // the segment's layout, in shm_collectives.cpp
  struct Wait;    // one collective's name, deadline and failure poll

 private:
  ShmCollectives(void* base, int64_t bytes, int rank, int size);

  // What a rank runs, published in a collective's first round for its peers to compare: the
  // kind, the element count (bytes for the kinds without a dtype), the dtype (-1 without) and
  // the op or root.
  struct Descriptor {
    int32_t kind;
    int64_t count;
    int32_t dtype;
    int32_t op;
  };
  // One round of any collective (the Note's rounds), the protocol in one place: fill(buffer)
  // writes this rank's slot of the round's buffer, then the copied flags; read(buffer) reads
  // (and folds) the other ranks' slots, then the reduced flags; after(buffer) runs once every
  // rank has read (the allreduce's gather). `first`, in a collective's first round only, is
  // published before the copied flag and compared with the peers' after it.
  template <typename Fill, typename Read, typename After>
  void run_round(Wait& wait, const Descriptor* first, Fill&& fill, Read&& read, After&& after);
  // Raises this rank's copied (or reduced) flag to `round`, then waits for every other rank's.
  void raise_and_await(bool copied, uint32_t round, Wait& wait);
  void check_alike(const Wait& wait);

  void* base_;
  int64_t bytes_;
  int rank_, size_;
  uint32_t round_ = 0;  // the last round this rank ran; the same on every rank
};

}  // namespace loom::dist
