// dist/process_group.cpp — what every process group backend shares: names of the reduce ops.
// The gloo backend is dist/gloo_process_group.cpp.
#include "dist/process_group.h"

namespace loom::dist {

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
