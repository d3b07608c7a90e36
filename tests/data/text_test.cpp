// tests/data/text_test.cpp — text for language models (data/text.h): a corpus folder read in
// sorted order without a fortune folder's indexes and links, Debian's fortunes where installed,
// the 90/10 split, and the windows of Note [Text windows]: y is x shifted by one, windows depend
// on (seed, step, window number) only, so 8 windows at once are 4 + 4 on two ranks, and every
// start in range is drawn. Bad input raises, naming what is wrong.

#include "data/text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "autograd/ops.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<int64_t> iota_tokens(int64_t n) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i;
  return t;
}

TEST(TextCorpus, AFolderIsItsFilesInSortedOrderWithoutIndexesOrLinks) {
  test::ScratchDir dir("corpus");
  const fs::path root = dir.path();
  write(root / "b", "second\n");
  write(root / "a", "first\n");
  write(root / "sub" / "c", "third\n");
  write(root / "a.dat", "INDEX");
  fs::create_symlink(root / "a", root / "a.u8");
  fs::create_symlink(root / "b", root / "z");  // a link, whatever its name
  EXPECT_EQ(read_corpus(root), "first\nsecond\nthird\n");
  EXPECT_EQ(read_corpus(root / "b"), "second\n");
  EXPECT_LOOM_ERROR(read_corpus(root / "missing"), IOError, {"missing", "does not exist"});
  fs::create_directory(root / "empty");
  EXPECT_LOOM_ERROR(read_corpus(root / "empty"), IOError, {"empty", "no text"});
}

TEST(TextCorpus, DebiansFortunesWhereInstalled) {
  const fs::path fortunes = "/usr/share/games/fortunes";
  if (!fs::is_directory(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  const std::string text = read_corpus(fortunes);
  EXPECT_GT(text.size(), 1u << 20) << "fortunes holds about 2.5 MB of text";
  EXPECT_EQ(text.find("\0", 0, 1), std::string::npos) << "an index file was read";
  const TextSplit split = split_text(text);
  EXPECT_EQ(split.train.size() + split.validation.size(), text.size());
  EXPECT_NEAR(static_cast<double>(split.train.size()) / text.size(), 0.9, 1e-6);
}

TEST(TextCorpus, SplitsNinetyTen) {
  const TextSplit s = split_text(std::string(100, 'x') + "0123456789");
  EXPECT_EQ(s.train.size(), 99u);
  EXPECT_EQ(s.validation, "x0123456789");
  EXPECT_LOOM_ERROR(split_text("a"), ValueError, {"split_text", "1 bytes", "empty"});
  EXPECT_LOOM_ERROR(split_text("abcdef", 1.0), ValueError, {"split_text"});
}

TEST(TextWindows, YIsXShiftedByOne) {
  const TextWindows w(iota_tokens(1000), 16, /*seed=*/1);
  const auto [x, y] = w.batch(/*step=*/3, /*first=*/0, /*count=*/5);
  ASSERT_EQ(x.sizes(), (Shape{5, 16}));
  ASSERT_EQ(y.sizes(), (Shape{5, 16}));
  const std::vector<int64_t> xs = x.to_vector<int64_t>(), ys = y.to_vector<int64_t>();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(ys[i], xs[i] + 1) << i;  // consecutive tokens
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(xs[r * 16], w.window_start(3, r));
}

TEST(TextWindows, WindowsDependOnSeedStepAndNumberOnly) {
  const TextWindows w(iota_tokens(5000), 8, /*seed=*/7);
  const auto [x8, y8] = w.batch(2, 0, 8);  // one rank, batch 8
  const auto [x0, y0] = w.batch(2, 0, 4);  // rank 0 of two, batch 4
  const auto [x1, y1] = w.batch(2, 4, 4);  // rank 1
  EXPECT_TRUE(test::tensors_close(x8, cat({x0, x1}, 0), 0, 0));
  EXPECT_TRUE(test::tensors_close(y8, cat({y0, y1}, 0), 0, 0));
  const auto [again, unused] = TextWindows(iota_tokens(5000), 8, 7).batch(2, 0, 8);
  EXPECT_TRUE(test::tensors_close(again, x8, 0, 0)) << "a run repeats";
  std::set<int64_t> starts_of_step_2, starts_other;
  for (int64_t g = 0; g < 8; ++g) {
    starts_of_step_2.insert(w.window_start(2, g));
    starts_other.insert(w.window_start(3, g));
    starts_other.insert(TextWindows(iota_tokens(5000), 8, 8).window_start(2, g));
  }
  EXPECT_EQ(starts_of_step_2.size(), 8u) << "the windows of one step differ";
  for (int64_t s : starts_of_step_2) EXPECT_EQ(starts_other.count(s), 0u) << s;
}

TEST(TextWindows, EveryStartInRangeIsDrawn) {
  const TextWindows w(iota_tokens(7), 4, 3);  // starts 0, 1, 2: the last window ends at token 6
  std::set<int64_t> seen;
  for (int64_t g = 0; g < 200; ++g) seen.insert(w.window_start(0, g));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2}));
}

TEST(TextWindows, RefusesWhatCannotMakeAWindow) {
  EXPECT_LOOM_ERROR(TextWindows(iota_tokens(10), 0, 1), ValueError, {"block_size", "got 0"});
  EXPECT_LOOM_ERROR(TextWindows(iota_tokens(5), 4, 1), ValueError, {"5 tokens", "5"});
  const TextWindows w(iota_tokens(10), 4, 1);
  EXPECT_LOOM_ERROR(w.batch(0, 0, 0), ValueError, {"at least one window"});
  EXPECT_LOOM_ERROR(w.window_start(-1, 0), ValueError, {"step"});
}

}  // namespace
}  // namespace loom::data
