// tensor/backend_library.cpp — dlopen and dlsym behind tensor/backend_library.h.

#include "tensor/backend_library.h"

#include <dlfcn.h>

#include <filesystem>

namespace loom {

namespace {

// The directory of the shared object that holds this function (libloom_tensor), or "" in a
// static build, where there is none of its own.
std::filesystem::path own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return {};
  return std::filesystem::path(info.dli_fname).parent_path();
}

}  // namespace

void* find_backend_entry(const std::string& file, const char* entry, std::string& why) {
  // The copy beside libloom_tensor is the one built with it; where it is there but does not load
  // (a CUDA library it needs is missing), the loader's words about that are the answer.
  const std::filesystem::path directory = own_directory();
  const std::filesystem::path beside = directory / file;
  std::error_code ec;
  const bool is_beside = !directory.empty() && std::filesystem::exists(beside, ec);
  void* handle = ::dlopen(is_beside ? beside.c_str() : file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = ::dlerror();
    why = error ? error : file + ": cannot be loaded";
    return nullptr;
  }
  void* address = ::dlsym(handle, entry);
  if (!address) {
    const char* error = ::dlerror();
    why = error ? error : file + " has no " + entry;
  }
  return address;
}

}  // namespace loom
