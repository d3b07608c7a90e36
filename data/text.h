// data/text.h — text for language models: a corpus read from a file or a folder, split into
// training and validation bytes, and training windows of block_size + 1 tokens.
//
// Note [Text windows]
// A step's batch is a set of windows of block_size + 1 consecutive tokens; x is each window's
// first block_size tokens, y the same shifted by one (the next token at every position). Window
// number g of step s starts at a position drawn from Philox (stream `seed`, counter s, the
// subsequence g), so the windows depend on (seed, step, g) only. Under data parallelism rank r
// of a job with B windows per rank takes g = r * B + i: every rank draws different windows, a
// run repeats, and 1 rank with batch 8 sees the windows that 2 ranks with batch 4 see together
// (nanoGPT draws with torch.randint from each rank's own seed instead).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::data {

// The bytes of `path`: a file as it is; a folder, every regular file below it in sorted path
// order, except the `.dat` indexes and `.u8` links of a fortune folder (Debian's fortunes
// package, /usr/share/games/fortunes). IOError when it cannot be read or holds no text.
std::string read_corpus(const std::filesystem::path& path);

struct TextSplit {
  std::string train, validation;
};
// The first `train_fraction` of the bytes train, the rest validate (nanoGPT's 90/10 split);
// ValueError unless both parts are non-empty.
TextSplit split_text(const std::string& text, double train_fraction = 0.9);

class TextWindows {
 public:
  // ValueError unless tokens hold more than block_size + 1 of them (block_size > 0).
  TextWindows(std::vector<int64_t> tokens, int64_t block_size, uint64_t seed);

  // Windows g = first, ..., first + count - 1 of step `step` (Note [Text windows]): x and y
  // int64 [count, block_size].
  std::pair<Tensor, Tensor> batch(int64_t step, int64_t first, int64_t count) const;
  // Where window g of step `step` starts, in [0, size() - block_size - 1].
  int64_t window_start(int64_t step, int64_t g) const;

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t block_size() const { return block_size_; }

 private:
  std::vector<int64_t> tokens_;
  int64_t block_size_;
  uint64_t seed_;
};

}  // namespace loom::data
