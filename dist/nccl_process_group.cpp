// dist/nccl_process_group.cpp — the front of the nccl process group: the checks that need no
// GPU, then libloom_nccl, loaded on the first call (LOOM_NCCL_BACKEND_FILE, its SONAME, is
// defined for this file by the build where loom is built with CUDA).

#include "dist/nccl_process_group.h"

#include <string>

#include "tensor/accelerator.h"
#include "tensor/backend_library.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

struct Loaded {
  MakeNcclGroup make = nullptr;
  std::string why;  // why there is none
};

const Loaded& loaded() {
  static const Loaded once = [] {
    Loaded l;
#ifdef LOOM_NCCL_BACKEND_FILE
    void* entry = find_backend_entry(LOOM_NCCL_BACKEND_FILE, kNcclBackendEntry, l.why);
    if (entry)
      l.make = reinterpret_cast<MakeNcclGroup>(entry);
    else
      l.why = detail::str("the nccl backend library ", LOOM_NCCL_BACKEND_FILE,
                          " could not be loaded: ", l.why);
#else
    l.why =
        "loom was built without CUDA (configure with -DLOOM_CUDA=ON on a machine with the CUDA "
        "toolkit); programs on CPUs use the gloo group";
#endif
    return l;
  }();
  return once;
}

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, ProcessGroupOptions options,
                                                      int device) {
  check_group_arguments("make_nccl_process_group", store.get(), rank, size, options);
  const Loaded& l = loaded();
  LOOM_CHECK(l.make != nullptr, DeviceError, "make_nccl_process_group: ", l.why);
  return l.make(std::move(store), rank, size, options, device);
}

bool nccl_is_available() { return cuda_device_count() > 0 && loaded().make != nullptr; }

}  // namespace loom::dist
