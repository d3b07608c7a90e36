// tests/data/idx_test.cpp — the IDX reader: plain and gzipped files written by the test, the
// real Fashion-MNIST files where Debian's package is installed, and every malformed case.

#include "data/idx.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "scratch_dir.h"
#include "test_util.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

void write_bytes(const fs::path& path, const std::vector<unsigned char>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
}

// magic (0, 0, 8, 2), dims 2 x 3, six bytes
std::vector<unsigned char> small_idx() {
  return {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
}

}  // namespace

TEST(Idx, ReadsPlainAndGzipped) {
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const auto scratch = [&dir](const std::string& name) { return fs::path(dir.file(name)); };
  for (bool gzip : {false, true}) {
    const fs::path path = scratch(gzip ? "small.gz" : "small");
    write_bytes(path, small_idx(), gzip);
    Tensor t = data::read_idx(path.string());
    EXPECT_EQ(t.dtype(), kUInt8);
    EXPECT_EQ(t.sizes(), (Shape{2, 3}));
    EXPECT_TRUE(loom::test::values_are(t, {1, 2, 3, 4, 5, 6}));
  }
}

TEST(Idx, MalformedFilesRaiseIOError) {
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const auto scratch = [&dir](const std::string& name) { return fs::path(dir.file(name)); };
  EXPECT_LOOM_ERROR(data::read_idx(scratch("missing").string()), IOError,
                    {"missing", "no such file"});
  auto bytes = small_idx();
  bytes.pop_back();
  write_bytes(scratch("truncated"), bytes, true);
  EXPECT_LOOM_ERROR(data::read_idx(scratch("truncated").string()), IOError,
                    {"truncated", "expected 6 bytes"});
  bytes = small_idx();
  bytes[0] = 7;
  write_bytes(scratch("magic"), bytes, false);
  EXPECT_LOOM_ERROR(data::read_idx(scratch("magic").string()), IOError, {"not an IDX file"});
  bytes = small_idx();
  bytes[2] = 0x0d;  // float32 elements
  write_bytes(scratch("type"), bytes, false);
  EXPECT_LOOM_ERROR(data::read_idx(scratch("type").string()), IOError, {"unsigned bytes"});
  bytes = small_idx();
  bytes.push_back(9);
  write_bytes(scratch("trailing"), bytes, false);
  EXPECT_LOOM_ERROR(data::read_idx(scratch("trailing").string()), IOError, {"trailing"});
  write_bytes(scratch("short"), {0, 0}, false);
  EXPECT_LOOM_ERROR(data::read_idx(scratch("short").string()), IOError, {"truncated header"});
}

TEST(Idx, FashionMnistFromDebian) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto test = data::read_mnist(dir, /*train=*/false);
  EXPECT_EQ(test.images.sizes(), (Shape{10000, 28, 28}));
  EXPECT_EQ(test.labels.sizes(), (Shape{10000}));
  // Balanced classes: 1000 test images of each.
  EXPECT_EQ(sum(test.labels == full({1}, 3, kInt64)).item<int64_t>(), 1000);
  EXPECT_LOOM_ERROR(data::read_mnist("/nonexistent", true), IOError, {"/nonexistent"});
}
