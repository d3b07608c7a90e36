// dist/process_group.cpp — what every process group backend shares: names of the reduce ops,
// the clock of their timestamps, the checks of a group's arguments.
// The gloo backend is dist/gloo_process_group.cpp.
#include "dist/process_group.h"

#include <chrono>

#include "tensor/error.h"

namespace loom::dist {

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

}  // namespace loom::dist
