// data/byte_tokenizer.h — the character-level tokenizer of nanoGPT's shakespeare_char, over
// bytes: the vocabulary is the bytes that occur in the training text, in increasing order, and a
// byte's id is its place there. The vocabulary travels with a checkpoint (its bytes in id order),
// so a sample decodes with the table it was trained with.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class ByteTokenizer {
 public:
  // The distinct bytes of `text`, in increasing order; ValueError for an empty text.
  static ByteTokenizer from_text(std::string_view text);
  // The bytes in id order, as a checkpoint keeps them; ValueError when empty or with a repeat.
  explicit ByteTokenizer(std::string vocabulary);

  int64_t vocab_size() const { return static_cast<int64_t>(vocabulary_.size()); }
  const std::string& vocabulary() const { return vocabulary_; }  // the bytes in id order

  // The id of every byte of `text`; ValueError naming the first byte the vocabulary lacks (as
  // an escape, e.g. '\x7f') and its offset.
  std::vector<int64_t> encode(std::string_view text) const;
  // The bytes of `ids`; IndexError naming the first id outside [0, vocab_size()).
  std::string decode(std::span<const int64_t> ids) const;

 private:
  std::string vocabulary_;
  std::vector<int16_t> id_of_;  // 256 entries: a byte's id, -1 where it is not in the vocabulary
};

}  // namespace loom::data
