// tensor/atomic_file.cpp — AtomicFile: temporary file, fsync, rename, fsync of the directory.

#include "tensor/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace loom {

namespace {
template <typename... Args>
[[noreturn]] void fail(const std::string& op, const std::string& path, const Args&... args) {
  throw IOError(detail::str(op, ": '", path, "': ", args...));
}

std::string directory_of(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

// A name beside `path` for a temporary file: ".<name>.tmp.<pid>.<counter>".
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::string base = std::filesystem::path(path).filename().string();
  const std::string name = "." + base + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(counter.fetch_add(1));
  return (std::filesystem::path(directory_of(path)) / name).string();
}

// Makes a rename in `dir` durable. Filesystems that cannot fsync a directory say EINVAL.
void sync_directory(const std::string& dir, const std::string& op, const std::string& path) {
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return;
  const int synced = ::fsync(dir_fd);
  const int error = errno;
  ::close(dir_fd);
  if (synced != 0 && error != EINVAL && error != ENOTSUP)
    fail(op, path, "written, but fsync of its directory failed: ", std::strerror(error));
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string op)
    : path_(std::move(path)), op_(std::move(op)) {
  dir_ = directory_of(path_);
  for (int attempt = 0;; ++attempt) {
    temp_ = temporary_name(path_);
    // 0666 so that the umask decides the final mode, as for any new file.
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST || attempt == 100)
      fail(op_, path_, "cannot create a temporary file in '", dir_, "': ", std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const auto* in = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_, in, std::min<size_t>(n, size_t{1} << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail(op_, path_, "write failed: ", std::strerror(errno));
    in += put;
    n -= static_cast<size_t>(put);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail(op_, path_, "fsync failed: ", std::strerror(errno));
  // close() may report a failed write back (NFS): check it before renaming.
  if (::close(std::exchange(fd_, -1)) != 0)
    fail(op_, path_, "close failed: ", std::strerror(errno));
  if (::rename(temp_.c_str(), path_.c_str()) != 0)
    fail(op_, path_, "cannot rename the temporary file over it: ", std::strerror(errno));
  committed_ = true;
  sync_directory(dir_, op_, path_);
}

void link_atomically(const std::string& existing, const std::string& path, const std::string& op) {
  for (int attempt = 0;; ++attempt) {
    const std::string temp = temporary_name(path);
    if (::link(existing.c_str(), temp.c_str()) == 0) {
      if (::rename(temp.c_str(), path.c_str()) != 0) {
        const int error = errno;
        ::unlink(temp.c_str());
        fail(op, path, "cannot rename a link to '", existing, "' over it: ", std::strerror(error));
      }
      sync_directory(directory_of(path), op, path);
      return;
    }
    if (errno == EEXIST && attempt < 100) continue;
    if (errno == ENOENT) fail(op, existing, "cannot link to it: ", std::strerror(errno));
    break;  // no hard links here (EPERM, EXDEV, ENOTSUP...): copy the bytes
  }
  std::ifstream in(existing, std::ios::binary);
  if (!in) fail(op, existing, "cannot open it to copy it to '", path, "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  if (in.bad()) fail(op, existing, "read failed while copying it to '", path, "'");
  AtomicFile out(path, op);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace loom
