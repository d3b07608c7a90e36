// fuzz/fuzz_util.h — what every loom fuzzer shares: a scratch folder for readers that take a path
// (the input is written to a file there, once per input), and the rule for exceptions.
//
// Note [What a fuzzer counts as a finding]
// A reader handed arbitrary bytes either returns or refuses them with one of loom's typed errors
// (IOError, ValueError, ...: a loom::Error). Everything else is a bug and ends the run: a crash,
// an ASan or UBSan report, a hang (libFuzzer's -timeout), an allocation past -rss_limit_mb or
// -malloc_limit_mb (a length field trusted before the data is there), an InternalError (a broken
// invariant), an exception that is not loom's (std::bad_alloc, nlohmann's, std::length_error...),
// or a property the fuzzer checks after a successful read (e.g. decode(encode(t)) == t).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "tensor/error.h"

namespace loom::fuzz {

// A folder of this process's own, under /dev/shm where there is one (memory, not disk), else the
// temp directory; removed when the process exits normally (a crash leaves a few kB behind).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) : owner_(::getpid()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path root =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (root / ("loom-fuzz-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror(("mkdtemp " + pattern).c_str());
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Writes `bytes` to `name` (a relative path; its folders are made) and returns the file's path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write %s\n", file.c_str());
      std::abort();
    }
    return file.string();
  }

 private:
  std::filesystem::path path_;
  pid_t owner_;
};

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `read`: a loom::Error is the reader refusing the input, as it should (Note [What a fuzzer
// counts as a finding]); an InternalError and any other exception propagate and end the run.
template <typename Read>
void refusal_is_a_loom_error(Read&& read) {
  try {
    read();
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
  }
}

// A property that must hold after a successful read; a violation ends the run.
inline void require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace loom::fuzz
