// dist/process_group.cpp — what every process group backend shares: names of the reduce ops,
// the clock of their timestamps, the checks of a group's arguments, the flat collectives made
// of the per-rank ones, and the byte counters (Note [Bytes moved]).
// The gloo backend is dist/gloo_process_group.cpp.
#include "dist/process_group.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "tensor/error.h"

namespace loom::dist {

std::string ProcessGroup::carrier() const {
  const std::string name = backend(), way = transport();
  return way == name ? name : name + " over " + way;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

void check_group_arguments(const char* op, const Store* store, int rank, int size,
                           const ProcessGroupOptions& options) {
  LOOM_CHECK(store != nullptr, ValueError, op, ": the store is null");
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError, op, ": rank ", rank,
             " is outside a group of ", size);
  LOOM_CHECK(options.timeout > Milliseconds(0), ValueError, op,
             ": the timeout must be positive; got ", options.timeout.count(), " ms");
}

bool lie_back_to_back(const std::vector<Tensor>& parts) {
  if (parts.empty()) return false;
  const auto* base = static_cast<const uint8_t*>(parts[0].data());
  const size_t nbytes = parts[0].nbytes();
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].is_alias_of(parts[0]) || !parts[r].is_contiguous() ||
        static_cast<const uint8_t*>(parts[r].data()) != base + r * nbytes)
      return false;
  }
  return true;
}

namespace {

// The size() pieces of a flat 1-D buffer, each of `piece` elements, as views.
std::vector<Tensor> pieces_of(const Tensor& flat, int count, int64_t piece) {
  std::vector<Tensor> parts;
  const Tensor line = flat.view({flat.numel()});
  for (int r = 0; r < count; ++r) parts.push_back(line.narrow(0, r * piece, piece));
  return parts;
}

void check_flat(const char* op, const Tensor& whole, const Tensor& piece, int size,
                const char* whole_name, const char* piece_name) {
  LOOM_CHECK(whole.defined() && piece.defined(), ValueError, op, ": expected defined tensors");
  LOOM_CHECK(whole.is_contiguous(), ValueError, op, ": ", whole_name,
             " must be contiguous; got sizes ", whole.sizes(), " strides ", whole.strides());
  LOOM_CHECK(whole.numel() == size * piece.numel(), ShapeError, op, ": ", whole_name, " has ",
             whole.numel(), " elements, expected ", size, " x ", piece.numel(), " (", piece_name,
             " ", piece.sizes(), " for each of ", size, " ranks); got ", whole_name, "=",
             whole.sizes(), " ", piece_name, "=", piece.sizes());
  LOOM_CHECK(whole.dtype() == piece.dtype(), DTypeError, op, ": ", whole_name, " is ",
             whole.dtype(), ", ", piece_name, " is ", piece.dtype());
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::allgather_into_tensor(Tensor out, Tensor input) {
  check_flat("allgather_into_tensor", out, input, size_, "out", "input");
  std::vector<Tensor> parts = pieces_of(out, size_, input.numel());
  // The piece of this rank, when it is the input itself, is handed over as that very view.
  Tensor mine = input;
  if (input.is_alias_of(out) && input.data() == parts[static_cast<size_t>(rank_)].data())
    mine = parts[static_cast<size_t>(rank_)];
  else
    mine = input.view({input.numel()});
  return allgather(std::move(parts), mine);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(Tensor out, Tensor input, ReduceOp op) {
  check_flat("reduce_scatter_tensor", input, out, size_, "input", "out");
  return reduce_scatter(out.view({out.numel()}), pieces_of(input, size_, out.numel()), op);
}

void check_alltoall(const char* backend, const Tensor& out, const Tensor& input, int size) {
  LOOM_CHECK(out.defined() && input.defined(), ValueError, "alltoall: expected defined tensors");
  LOOM_CHECK(out.dtype() == input.dtype() && out.numel() == input.numel(), ShapeError,
             "alltoall: out and input must be alike; got out=", out.dtype(), " ", out.sizes(),
             " input=", input.dtype(), " ", input.sizes());
  LOOM_CHECK(input.numel() % size == 0, ShapeError, "alltoall: the input's ", input.numel(),
             " elements do not split into ", size, " equal pieces (sizes ", input.sizes(), ")");
  LOOM_CHECK(out.numel() == 0 || !out.is_alias_of(input), ValueError,
             "alltoall: out and input share storage; the ", backend, " backend needs them apart");
}

int64_t bus_bytes(const std::string& op, int64_t payload, int size) {
  const double n = size;
  if (size <= 1) return 0;
  if (op == "allreduce") return static_cast<int64_t>(2.0 * (n - 1) / n * payload + 0.5);
  if (op == "reduce_scatter" || op == "allgather" || op == "alltoall")
    return static_cast<int64_t>((n - 1) / n * payload + 0.5);
  if (op == "broadcast" || op == "send") return payload;
  return 0;
}

void ProcessGroup::count(const std::string& op, int64_t payload_bytes) {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  CollectiveStats& stats = counters_[op];
  stats.calls += 1;
  stats.payload_bytes += payload_bytes;
  stats.bus_bytes += bus_bytes(op, payload_bytes, size_);
}

CollectiveCounters ProcessGroup::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

void ProcessGroup::reset_counters() {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_.clear();
}

void accumulate(CollectiveCounters& total, const CollectiveCounters& more) {
  for (const auto& [op, stats] : more) {
    CollectiveStats& into = total[op];
    into.calls += stats.calls;
    into.payload_bytes += stats.payload_bytes;
    into.bus_bytes += stats.bus_bytes;
  }
}

std::string format_counters(const CollectiveCounters& counters) {
  std::ostringstream out;
  char line[128];
  std::snprintf(line, sizeof(line), "%-16s %8s %14s %14s\n", "collective", "calls", "payload bytes",
                "bus bytes");
  out << line;
  CollectiveStats total;
  for (const auto& [op, stats] : counters) {
    std::snprintf(line, sizeof(line), "%-16s %8lld %14lld %14lld\n", op.c_str(),
                  static_cast<long long>(stats.calls), static_cast<long long>(stats.payload_bytes),
                  static_cast<long long>(stats.bus_bytes));
    out << line;
    total.calls += stats.calls;
    total.payload_bytes += stats.payload_bytes;
    total.bus_bytes += stats.bus_bytes;
  }
  std::snprintf(line, sizeof(line), "%-16s %8lld %14lld %14lld\n", "total",
                static_cast<long long>(total.calls), static_cast<long long>(total.payload_bytes),
                static_cast<long long>(total.bus_bytes));
  out << line;
  return out.str();
}

}  // namespace loom::dist
