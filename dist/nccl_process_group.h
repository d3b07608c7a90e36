// dist/nccl_process_group.h — the nccl process group: the collectives of process_group.h on CUDA
// tensors through NVIDIA's NCCL, one GPU per rank. Host-only (no CUDA or NCCL header): any file
// may include it. The group lives in its own library, libloom_nccl (dist/nccl_process_group.cu),
// which make_nccl_process_group loads the first time it is called (Note [The CUDA backend
// library] in tensor/cuda_backend.h), so that loom_dist itself never links NCCL.
//
// Note [NCCL streams and waits]
// - Each group owns one communication stream on its device. A collective records an event on
//   the caller's current stream (where the tensors were produced), makes the comm stream wait
//   for it, runs the NCCL call on the comm stream and records a completion event there. The
//   host never waits: the call returns once NCCL has queued the work.
// - Work::wait() makes the caller's current stream wait for the completion event, so kernels
//   queued afterwards see the result; it does not block the host and raises only a failure
//   already known. wait(t) with t > 0 also blocks the host until the work completes or fails
//   (DistError "gave up after t ms" when t passes first); LOOM_NCCL_BLOCKING_WAIT=1 makes every
//   wait() block so, up to twice the group's timeout. is_completed() queries the event.
// - Tensor lifetime (Note [Caching allocator], tensor/caching_allocator.h): a tensor's
//   block belongs to the stream it was allocated on, and the allocator hands a freed block to
//   the next kernel of that stream at once; the comm stream's use of it is invisible to the
//   allocator. So the work holds a reference to every tensor it reads or writes (and to its
//   scratch buffers) until the host has seen the completion event: the block cannot go back to
//   the allocator while NCCL may still touch it, and the allocator needs no extra bookkeeping.
// - A watchdog thread per group polls the outstanding works. One not completed within the
//   group's timeout, or a communicator whose ncclCommGetAsyncError reports an error, aborts the
//   communicator (ncclCommAbort, which also stops NCCL kernels stuck on the GPU) and fails the
//   work: its wait() raises DistError naming the op, its sequence number, the time it ran and
//   NCCL's error string; every later call raises DistError at once ("unusable after an earlier
//   failure"). Make a new group after a failure.
// - Collective checks (Note [Collective checks], collective_checks.h) are diagnostic here: running
//   them before each collective would cost a store round trip per call and the asynchrony, so
//   the watchdog publishes each fingerprint after the call, compares the peers' only for a
//   collective that has stalled for a while, and names the ranks that never arrived when one
//   times out. Mismatched collectives that happen to complete are not caught.
// - send/recv match in call order between a pair of ranks: NCCL has no tags (they are accepted
//   and ignored). A send blocks its rank's comm stream until the peer receives, so two ranks that
//   both send before they receive deadlock until the timeout on large tensors.
// - Integer Avg: NCCL's ncclAvg serves the floating dtypes; integers are summed, then divided by
//   the world size on the comm stream, truncating toward zero as the gloo group does.
#pragma once

#include <memory>

#include "dist/process_group.h"
#include "dist/store.h"

namespace loom::dist {

// Joins a group of `size` ranks on cuda:`device` (-1: the calling thread's current device; one
// GPU per rank). Every rank must call it, in the same order for several groups. Rank 0 creates
// NCCL's unique id and publishes it in `store` under "nccl<n>/unique_id" (n counts the groups
// this process made); creating the communicator times out after options.timeout (DistError).
// Raises DeviceError without a visible GPU, in a build without CUDA, or where libloom_nccl or a
// library it needs (libnccl) cannot be loaded, saying which.
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, ProcessGroupOptions options = {},
                                                      int device = -1);

// True when loom was built with CUDA (and so with NCCL), libloom_nccl loads and a GPU is visible.
bool nccl_is_available();

// The symbol libloom_nccl exports, of type MakeNcclGroup: make_nccl_process_group after the
// argument checks that need no GPU.
using MakeNcclGroup = std::shared_ptr<ProcessGroup> (*)(std::shared_ptr<Store> store, int rank,
                                                        int size, ProcessGroupOptions options,
                                                        int device);
inline constexpr const char* kNcclBackendEntry = "loom_nccl_make_process_group";

}  // namespace loom::dist
