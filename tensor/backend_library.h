// tensor/backend_library.h — loading one of loom's backend libraries (libloom_cuda, libloom_nccl)
// at run time, so that the libraries that need none of it never link CUDA (Note [The CUDA
// backend library] in tensor/cuda_backend.h).
#pragma once

#include <string>

namespace loom {

// The address of `entry` in the shared library `file` (a SONAME such as "libloom_cuda.so.0.1"):
// loaded from the directory that libloom_tensor was loaded from, else through the loader's search
// path (RUNPATH, LD_LIBRARY_PATH). nullptr where it cannot be loaded, with `why` set to what the
// loader said. A library once loaded stays loaded.
void* find_backend_entry(const std::string& file, const char* entry, std::string& why);

}  // namespace loom
