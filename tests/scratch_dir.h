// tests/scratch_dir.h — a directory of the test's own for the files it writes, so that tests
// run side by side (ctest -j, --repeat, two build trees, two users) never read or delete each
// other's files.
//
// Note [Test scratch directories]
// A test writes files only under a ScratchDir: mkdtemp under $TMPDIR (or /tmp), named after the
// running test with a random suffix, so the name is unique per test and per run; removed with
// everything in it when the ScratchDir goes. Ranks forked by tests/dist/multiprocess.h use their
// parent's ScratchDir (made before run_ranks) and leave with _exit; only the process that made
// the directory removes it. Nothing a test writes goes to a fixed path, the working directory
// included; a fixed port is never bound either (port 0 picks a free one).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

namespace loom::test {

class ScratchDir {
 public:
  // `tag` is added to the name (for a reader of /tmp); the test's name is there already.
  explicit ScratchDir(const std::string& tag = "") : owner_(::getpid()) {
    std::string name = "loom_";
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
      name += std::string(info->test_suite_name()) + "." + info->name();
    if (!tag.empty()) name += "." + tag;
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
    if (name.size() > 120) name.resize(120);
    std::string pattern = (std::filesystem::temp_directory_path() / (name + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    if (::getpid() != owner_) return;  // a forked rank: the parent removes it
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory (not created).
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
  pid_t owner_;
};

}  // namespace loom::test
