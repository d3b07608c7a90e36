// tensor/memory_limit.h — a cap on the bytes loom's tensors may hold on a device, as a GPU's
// memory is one, so that a run on CPUs stops where a run on a device that size would: the
// sizes the cap is written in (LOOM_MAX_MEMORY, --max-memory), the labels that say what was
// running when an allocation failed, and the explainer a program registers to say by kind what
// holds the memory. set_memory_limit and memory_limit are beside memory_stats (storage.h).
//
// Note [Device memory cap]
// A device may have a cap: LOOM_MAX_MEMORY caps every device of the process (read once, at the
// first allocation); set_memory_limit(device, bytes) caps one device and overrides the variable
// there (0 removes the cap). What counts against it is what memory_stats(device).current_bytes
// counts and the memory report prints: the bytes of every live storage loom allocated on the
// device (weights, gradients, DDP's buckets, optimizer state, FSDP's shards and gathered units,
// activations, batches, data sets held as tensors), not the allocator's cache of freed blocks nor
// memory loom does not own (from_blob, gloo's scratch, the C++ heap).
// Where it is checked:
//   - allocate_storage, on every device: in the accounting's critical section, which the count
//     already takes, so two threads cannot both pass; the bytes enter the count before the memory
//     is asked for and leave it if that fails. Without a cap the check costs one comparison.
//   - on CUDA also the caching allocator (Note [Caching allocator]): the segments it reserves
//     may not pass the cap, as cudaMalloc on a device that size would fail; it gives its cache
//     back first, then refuses. What it reserves (what nvidia-smi shows) is at least what the
//     tensors hold, so on a GPU this check is usually the one that fires. It runs only where a
//     segment is reserved, never on a cache hit.
// Over the cap, OutOfMemoryError is raised before anything is allocated: the count, its peak and
// the memory are as they were. Its message names the device, the bytes asked for (the dtype and
// shape where a tensor was asked for), what was running (Note [Allocation labels]), the count
// against the cap and where the cap came from; then the lines of the registered explainer: what
// holds the memory by kind and what to change (dist/memory_report.h has the training programs').
//
// Note [Allocation labels]
// An allocation does not know who asked for it; a label does, set for a scope on the thread:
//   nn::Module::operator()  "in the forward of GPTBlock"  (with its hooks: FSDP's gathers)
//   the autograd engine     "in the backward of matmul"   (each node's, AccumulateGrad's too)
//   optim::Optimizer        "for the optimizer state of AdamW"  (when a state is made)
//   DDP's reducer           "for the gradient buckets of DistributedDataParallel"
// The innermost label wins. A label is two pointers to strings that outlive its scope (the
// module's type name, the node's name, a literal) swapped in and out of a thread-local: a few
// nanoseconds a module call or a backward node, nothing on the allocation path, and the text is
// built only when an error is. The ops' forwards are not labelled: their names reach autograd
// only after the forward ran (record()), and a label in every op would cost every op; the
// module around them says where in the model the forward was.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace loom {

// The environment variable that caps every device: "2GiB", "512MiB", "1.5GB", "1000000".
inline constexpr const char* kMaxMemoryVariable = "LOOM_MAX_MEMORY";

// A size in bytes: a number, then optionally a unit, case-insensitive: B; KiB MiB GiB TiB (and
// K M G T) in powers of 1024; kB MB GB TB in powers of 1000. A fraction is rounded down to a
// byte ("1.5GB", "0.5GiB"). ValueError naming `what` (the variable or flag) and the text for
// anything else, a negative size, or more than 2^63 bytes.
int64_t parse_memory_size(std::string_view text, std::string_view what);

// LOOM_MAX_MEMORY's cap as the environment says now: 0 where it is unset or empty; ValueError
// as parse_memory_size. (The allocator reads it once, at each device's first allocation.)
int64_t memory_limit_from_environment();

// "2.00 GiB", "512.00 MiB", "100 B": bytes for people, in powers of 1024.
std::string format_bytes(int64_t bytes);

// Note [Allocation labels]: sets the thread's label to `activity` + `name` ("in the forward of ",
// "GPTBlock") for its lifetime; both strings must outlive it.
class AllocationLabel {
 public:
  AllocationLabel(const char* activity, const char* name) noexcept;
  ~AllocationLabel();
  AllocationLabel(const AllocationLabel&) = delete;
  AllocationLabel& operator=(const AllocationLabel&) = delete;

  // The thread's label as text, "" where none is set.
  static std::string current();

 private:
  const char* previous_activity_;
  const char* previous_name_;
};

// What a program adds to an OutOfMemoryError on `device`: lines after the first (the bytes held
// by kind, advice). It runs on the thread whose allocation failed, while nothing is locked; it
// must only read (an allocation of its own gets no explanation: no recursion) and should not
// throw (if it does, the message says so instead).
using OutOfMemoryExplainer = std::function<std::string(Device device)>;
// Installs `explainer` for every device (empty: none); returns the one it replaces.
OutOfMemoryExplainer set_out_of_memory_explainer(OutOfMemoryExplainer explainer);

namespace detail {

// What storage.cpp knows when an allocation is refused.
struct OutOfMemoryFacts {
  Device device;
  int64_t requested = 0;         // bytes asked for
  std::optional<DType> dtype;    // where a tensor was asked for
  std::vector<int64_t> shape;    // (with its dtype)
  int64_t held = 0, peak = 0;    // memory_stats' current and peak bytes before the request
  int64_t cap = 0;               // 0: the refusal was not the cap's (the device ran out)
  std::string cap_source;        // "LOOM_MAX_MEMORY", "--max-memory", "set_memory_limit"
  std::string allocator_reason;  // the caching allocator's own words, where it refused
};
// The OutOfMemoryError's message: the first line from the facts, then the explainer's lines.
std::string out_of_memory_message(const OutOfMemoryFacts& facts);

}  // namespace detail
}  // namespace loom
