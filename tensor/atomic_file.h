// tensor/atomic_file.h — files that are either whole or not there: bytes go to a temporary file
// beside the target, which is fsynced and renamed over it, then the directory is fsynced. A
// crash or an error at any point leaves the previous file (if any) untouched. Checkpoints
// (safetensors) and traces are written this way.
#pragma once

#include <cstddef>
#include <string>

namespace loom {

class AtomicFile {
 public:
  // Creates the temporary file. `op` begins every error message: "<op>: '<path>': ...".
  AtomicFile(std::string path, std::string op);
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  // fsync, close, rename over the target, fsync the directory. IOError on failure.
  void commit();

 private:
  std::string path_, op_, dir_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Makes `path` a second name of the file `existing` (a hard link), replacing what `path` was in
// one step, as AtomicFile does; where the filesystem has no hard links, the bytes are copied
// through an AtomicFile. A checkpoint directory's last.safetensors is its newest epoch's file,
// linked rather than written twice. IOError on failure.
void link_atomically(const std::string& existing, const std::string& path, const std::string& op);

}  // namespace loom
