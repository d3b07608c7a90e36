// tests/dist/tensorboard_test.cpp — TensorBoard event files: CRC-32C against its published check
// value, the TFRecord framing (Note [TFRecord framing]) taken apart byte by byte, and the
// files read back by the `tensorboard` Python package's own reader where it is installed
// (scripts/setup.sh --torch puts it in .pydeps; the test skips, saying so, without it).

#include "dist/tensorboard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scratch_dir.h"

namespace loom::dist {
namespace {

namespace fs = std::filesystem;

// A directory of this test's own (Note [Test scratch directories]).
class TensorBoard : public ::testing::Test {
 protected:
  test::ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
};

uint64_t read_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
uint32_t read_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
// The mask written out again here, apart from the library's.
uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// The records of a file, each CRC checked.
std::vector<std::string> records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size());
    const uint64_t n = read_u64(bytes, at);
    EXPECT_EQ(read_u32(bytes, at + 8), mask(crc32c(bytes.data() + at, 8)));
    EXPECT_LE(at + 12 + n + 4, bytes.size());
    out.push_back(bytes.substr(at + 12, n));
    EXPECT_EQ(read_u32(bytes, at + 12 + n), mask(crc32c(bytes.data() + at + 12, n)));
    at += 12 + n + 4;
  }
  return out;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crc32c, MatchesThePublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros, and of 0xff.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(masked_crc32c("123456789", 9), mask(0xe3069283u));
}

TEST(TFRecord, FramesLengthDataAndTheirMaskedCrcs) {
  const std::string data = "hello, tensorboard";
  const std::string r = tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(read_u64(r, 0), data.size());
  EXPECT_EQ(read_u32(r, 8), mask(crc32c(r.data(), 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(read_u32(r, 12 + data.size()), mask(crc32c(data.data(), data.size())));
}

TEST_F(TensorBoard, AWriterFramesEveryEvent) {
  std::string path;
  {
    SummaryWriter writer(dir_.string());
    path = writer.path();
    for (int step = 0; step < 3; ++step) writer.add_scalar("train/loss", 2.0 - step, step);
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir_);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::vector<std::string> events = records(slurp(path));
  ASSERT_EQ(events.size(), 4u);  // the file version, then three scalars
  EXPECT_NE(events[0].find("brain.Event:2"), std::string::npos);
  for (size_t i = 1; i < events.size(); ++i)
    EXPECT_NE(events[i].find("train/loss"), std::string::npos);
}

TEST_F(TensorBoard, ThePythonPackageReadsTheScalars) {
  {
    SummaryWriter writer(dir_.string());
    for (int step = 0; step < 5; ++step) {
      writer.add_scalar("train/loss", 1.0 / (step + 1), step * 10);
      writer.add_scalar("train/lr", 0.5, step * 10);
    }
  }
  const std::string script =
      "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
      "import sys\n"
      "acc = EventAccumulator(sys.argv[1])\n"
      "acc.Reload()\n"
      "for tag in sorted(acc.Tags()['scalars']):\n"
      "    for e in acc.Scalars(tag):\n"
      "        print(tag, e.step, repr(e.value))\n";
  std::ofstream(dir_ / "read.py") << script;
  const std::string env = std::string("PYTHONPATH=") + LOOM_PYDEPS_DIR;
  if (std::system((env + " python3 -c 'import tensorboard' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "the tensorboard Python package is not importable (scripts/setup.sh --torch "
                    "installs it into .pydeps)";
  const std::string command =
      env + " python3 " + (dir_ / "read.py").string() + " " + dir_.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  EXPECT_NE(out.find("train/loss 0 1.0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("train/loss 40 0.20000000298023224\n"), std::string::npos) << out;
  EXPECT_NE(out.find("train/lr 30 0.5\n"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 10) << out;
}

}  // namespace
}  // namespace loom::dist
