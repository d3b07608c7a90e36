// tensor/cuda_stubs.cpp — linked when loom is built without CUDA (LOOM_CUDA=OFF): every entry
// point of tensor/cuda/ raises DeviceError, so CUDA requests fail clearly, never silently.

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace loom::cuda {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw DeviceError(detail::str(what,
                                ": loom was built without CUDA (configure with -DLOOM_CUDA=ON "
                                "on a machine with the CUDA toolkit)"));
}
}  // namespace

bool is_built() { return false; }
int device_count() { return 0; }
void* allocate(size_t, int) { unavailable("cuda allocate"); }
void deallocate(void*, int) { unavailable("cuda deallocate"); }
void copy_bytes(void*, const void*, size_t, CopyKind, int) { unavailable("cuda copy"); }

}  // namespace loom::cuda
