// dist/process_group.cpp — what every process group backend shares: names of the reduce ops,
// the clock of their timestamps.
// The gloo backend is dist/gloo_process_group.cpp.
#include "dist/process_group.h"

#include <chrono>

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

}  // namespace loom::dist
