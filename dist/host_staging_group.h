// dist/host_staging_group.h — a process group that takes CUDA tensors over a host-memory
// transport (gloo) by copying them through the host (Note [gloo with CUDA tensors]).
#pragma once

#include <memory>

#include "dist/process_group.h"

namespace loom::dist {

// `inner` with CUDA tensors staged through host copies; CPU tensors pass straight through.
std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner);

}  // namespace loom::dist
