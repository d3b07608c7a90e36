// data/text.cpp — data/text.h.

#include "data/text.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tensor/error.h"
#include "tensor/random.h"

namespace loom::data {

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), IOError, "read_corpus: cannot open ", path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  LOOM_CHECK(!in.bad(), IOError, "read_corpus: cannot read ", path.string());
  return bytes.str();
}

// A fortune folder's files that are not text: strfile's indexes and the UTF-8 links.
bool is_fortune_index(const std::filesystem::path& path) {
  return path.extension() == ".dat" || path.extension() == ".u8";
}

}  // namespace

std::string read_corpus(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  LOOM_CHECK(!ec && fs::exists(status), IOError, "read_corpus: ", path.string(), " does not exist");
  std::string text;
  if (fs::is_directory(status)) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file() && !e.is_symlink() && !is_fortune_index(e.path()))
        files.push_back(e.path());
    LOOM_CHECK(!ec, IOError, "read_corpus: cannot list ", path.string(), ": ", ec.message());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) text += read_file(f);
  } else {
    text = read_file(path);
  }
  LOOM_CHECK(!text.empty(), IOError, "read_corpus: ", path.string(), " holds no text");
  return text;
}

TextSplit split_text(const std::string& text, double train_fraction) {
  const auto n = static_cast<size_t>(static_cast<double>(text.size()) * train_fraction);
  LOOM_CHECK(train_fraction > 0 && train_fraction < 1 && n > 0 && n < text.size(), ValueError,
             "split_text: a fraction of ", train_fraction, " of ", text.size(),
             " bytes leaves one part empty");
  return {text.substr(0, n), text.substr(n)};
}

TextWindows::TextWindows(std::vector<int64_t> tokens, int64_t block_size, uint64_t seed)
    : tokens_(std::move(tokens)), block_size_(block_size), seed_(seed) {
  LOOM_CHECK(block_size_ > 0, ValueError, "TextWindows: block_size must be positive; got ",
             block_size_);
  LOOM_CHECK(size() > block_size_ + 1, ValueError, "TextWindows: ", size(),
             " tokens are too few for windows of block_size + 1 = ", block_size_ + 1);
}

int64_t TextWindows::window_start(int64_t step, int64_t g) const {
  LOOM_CHECK(step >= 0 && g >= 0, ValueError, "TextWindows: step and window must be >= 0; got ",
             step, " and ", g);
  const auto r = philox4x32(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(g));
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<int64_t>(bits % static_cast<uint64_t>(size() - block_size_));
}

std::pair<Tensor, Tensor> TextWindows::batch(int64_t step, int64_t first, int64_t count) const {
  LOOM_CHECK(count > 0, ValueError, "TextWindows: a batch needs at least one window; got ", count);
  Tensor x = empty({count, block_size_}, kInt64), y = empty({count, block_size_}, kInt64);
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  const size_t row_bytes = static_cast<size_t>(block_size_) * sizeof(int64_t);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = window_start(step, first + i);
    std::memcpy(px + i * block_size_, tokens_.data() + start, row_bytes);
    std::memcpy(py + i * block_size_, tokens_.data() + start + 1, row_bytes);
  }
  return {x, y};
}

}  // namespace loom::data
