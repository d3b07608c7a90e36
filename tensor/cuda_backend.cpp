// tensor/cuda_backend.cpp — finding the CUDA backend library (Note [The CUDA backend library]).
// LOOM_CUDA_BACKEND_FILE, the library's SONAME, is defined for this file by the build where
// loom is built with CUDA.

#include "tensor/cuda_backend.h"

#include <atomic>
#include <string>

#include "tensor/backend_library.h"
#include "tensor/error.h"

namespace loom {

namespace {

std::atomic<const CudaBackend*> loaded_backend{nullptr};

struct Loaded {
  const CudaBackend* backend = nullptr;
  std::string why;  // why there is none
};

const Loaded& loaded() {
  static const Loaded once = [] {
    Loaded l;
#ifdef LOOM_CUDA_BACKEND_FILE
    void* entry = find_backend_entry(LOOM_CUDA_BACKEND_FILE, kCudaBackendEntry, l.why);
    if (!entry) {
      l.why = detail::str("the CUDA backend library ", LOOM_CUDA_BACKEND_FILE,
                          " could not be loaded: ", l.why);
      return l;
    }
    const auto* backend = reinterpret_cast<const CudaBackend* (*)()>(entry)();
    if (backend->size != sizeof(CudaBackend)) {
      l.why = detail::str("the CUDA backend library ", LOOM_CUDA_BACKEND_FILE,
                          " comes from another build of loom (its table has ", backend->size,
                          " bytes, this one ", sizeof(CudaBackend), ")");
      return l;
    }
    // Every slot after `size` is a function pointer; a null one is an entry the library left
    // out, which would crash when called.
    static_assert(sizeof(size_t) == sizeof(void*) && sizeof(CudaBackend) % sizeof(void*) == 0,
                  "CudaBackend is `size` followed by function pointers");
    const auto* slots = reinterpret_cast<void* const*>(backend) + 1;
    const size_t count = (sizeof(CudaBackend) - sizeof(size_t)) / sizeof(void*);
    for (size_t i = 0; i < count; ++i) {
      if (slots[i] == nullptr) {
        l.why = detail::str("the CUDA backend library ", LOOM_CUDA_BACKEND_FILE, " leaves entry ",
                            i, " of its table empty");
        return l;
      }
    }
    l.backend = backend;
    loaded_backend.store(backend, std::memory_order_release);
#else
    l.why =
        "loom was built without CUDA (configure with -DLOOM_CUDA=ON on a machine with the CUDA "
        "toolkit)";
#endif
    return l;
  }();
  return once;
}

}  // namespace

const CudaBackend& cuda_backend(const char* op) {
  const Loaded& l = loaded();
  LOOM_CHECK(l.backend != nullptr, DeviceError, op, ": ", l.why);
  return *l.backend;
}

const CudaBackend* cuda_backend_if_available() { return loaded().backend; }

const CudaBackend* cuda_backend_if_loaded() {
  return loaded_backend.load(std::memory_order_acquire);
}

const std::string& cuda_backend_unavailable_reason() { return loaded().why; }

}  // namespace loom
