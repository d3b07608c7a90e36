// dist/nccl_stubs.cpp — linked when loom is built without CUDA (LOOM_CUDA=OFF): there is no NCCL,
// so asking for the nccl process group raises DeviceError ("make_nccl_process_group: loom was
// built without CUDA ..."), never a crash; programs on CPUs use the gloo group.
#include "dist/nccl_process_group.h"
#include "tensor/cuda/stubs.h"

namespace loom::dist {

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store>, int, int,
                                                      ProcessGroupOptions, int) {
  cuda::built_without_cuda("make_nccl_process_group");
}

bool nccl_is_available() { return false; }

}  // namespace loom::dist
