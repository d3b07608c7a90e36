// data/byte_tokenizer.cpp — data/byte_tokenizer.h.

#include "data/byte_tokenizer.h"

#include <array>
#include <cstdio>

#include "tensor/error.h"

namespace loom::data {

namespace {

// A byte as it reads in a message: itself where printable, else an escape ('\n', '\x7f').
std::string shown(unsigned char byte) {
  if (byte == '\n') return "'\\n'";
  if (byte == '\t') return "'\\t'";
  if (byte >= 0x20 && byte < 0x7f) return std::string("'") + static_cast<char>(byte) + "'";
  char escaped[8];
  std::snprintf(escaped, sizeof escaped, "'\\x%02x'", byte);
  return escaped;
}

}  // namespace

ByteTokenizer ByteTokenizer::from_text(std::string_view text) {
  LOOM_CHECK(!text.empty(), ValueError, "ByteTokenizer: the text is empty; no vocabulary");
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::string vocabulary;
  for (int byte = 0; byte < 256; ++byte)
    if (seen[byte]) vocabulary.push_back(static_cast<char>(byte));
  return ByteTokenizer(std::move(vocabulary));
}

ByteTokenizer::ByteTokenizer(std::string vocabulary)
    : vocabulary_(std::move(vocabulary)), id_of_(256, -1) {
  LOOM_CHECK(!vocabulary_.empty(), ValueError, "ByteTokenizer: the vocabulary is empty");
  for (size_t id = 0; id < vocabulary_.size(); ++id) {
    const auto byte = static_cast<unsigned char>(vocabulary_[id]);
    LOOM_CHECK(id_of_[byte] < 0, ValueError, "ByteTokenizer: byte ", shown(byte),
               " appears twice in the vocabulary (ids ", id_of_[byte], " and ", id, ")");
    id_of_[byte] = static_cast<int16_t>(id);
  }
}

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    LOOM_CHECK(id_of_[byte] >= 0, ValueError, "ByteTokenizer: byte ", shown(byte), " at offset ", i,
               " is not in the vocabulary of ", vocabulary_.size(), " bytes");
    ids[i] = id_of_[byte];
  }
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int64_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), IndexError, "ByteTokenizer: id ", ids[i],
               " at position ", i, " is outside [0, ", vocab_size(), ")");
    text[i] = vocabulary_[static_cast<size_t>(ids[i])];
  }
  return text;
}

}  // namespace loom::data
