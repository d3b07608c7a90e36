// data/bpe_tokenizer.h — GPT-2's byte-level BPE tokenizer, read from GPT-2's vocab.json and
// merges.txt, encoding and decoding as Hugging Face `tokenizers` does with the same two files
// (a ByteLevel BPE, add_prefix_space=false, <|endoftext|> a special token where the vocab has
// it). A checkpoint records the files' names and SHA-256 (data/sha256.h).
//
// Note [Byte-level BPE]
// Encoding a text takes four steps, as in GPT-2 and `tokenizers`:
//   1. <|endoftext|>, where the vocabulary has it, is cut out first: each occurrence is its own
//      id, and the pieces between are encoded on their own (none reaches across it).
//   2. Pre-tokenization splits a piece into words with GPT-2's regex,
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      the first alternative that matches winning: " world" keeps its space, "'S" is not a
//      contraction, and a run of whitespace before a word leaves its last space to the word.
//      \p{L}, \p{N} and \s are Unicode 16.0's, as in tokenizers' Oniguruma (data/unicode_tables.h).
//   3. A word starts as one symbol per byte. GPT-2 writes every byte as a printable character
//      (its bytes_to_unicode: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF stand for themselves, the
//      68 other bytes for U+0100..U+0143 in order, so a space is 'Ġ'); loading maps the files'
//      tokens back to bytes, and encoding works on bytes throughout.
//   4. The adjacent pair of symbols with the lowest rank (its line in merges.txt) is merged,
//      the leftmost where the pair occurs twice, until no adjacent pair has a merge. The symbols'
//      ids are the word's ids. A word's ids are cached (a word recurs: " the").
// Decoding appends the ids' bytes; <|endoftext|> decodes to its own text (tokenizers' decode
// with skip_special_tokens=False).
//
// Bytes that are not UTF-8. `tokenizers` takes only valid text (a Python str); on it the two
// agree. Here a byte that does not begin a valid UTF-8 sequence (Python's strict decoder: no
// overlong forms, surrogates or code points past U+10FFFF) is one character of the class
// [^\s\p{L}\p{N}] by itself, as Python's errors="surrogateescape" would make it (a lone
// surrogate, category Cs), and it is encoded as its own byte, which the byte-level vocabulary
// always has: decode(encode(t)) == t for any bytes t. Likewise decode returns the ids' bytes as
// they are where tokenizers would put U+FFFD for bytes that are not UTF-8 (ids cut from the
// middle of a character).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::data {

class BpeTokenizer {
 public:
  // GPT-2's files: vocab.json, one JSON object of token -> id with the ids 0..n-1 and a token
  // for each of the 256 bytes; merges.txt, an optional "#version" line, then "left right" a
  // line, the rank being the order. IOError naming the file and the line (merges.txt) or the
  // JSON position (vocab.json) when a file is missing or does not parse: bad JSON, an id given
  // twice or outside 0..n-1, a token that is not byte-level, a merge line that is not two
  // tokens, a merge naming a token (or making one) the vocabulary lacks, a merge given twice.
  static BpeTokenizer from_files(const std::filesystem::path& vocab_json,
                                 const std::filesystem::path& merges_txt);
  // dir/vocab.json and dir/merges.txt.
  static BpeTokenizer from_dir(const std::filesystem::path& dir);

  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  // The id of <|endoftext|>, where the vocabulary has it (GPT-2's: 50256).
  std::optional<int64_t> eot_id() const { return eot_id_; }
  // The bytes token `id` stands for (" the" for GPT-2's "Ġthe"); IndexError outside the vocab.
  const std::string& token_bytes(int64_t id) const;

  // The ids of `text` (Note [Byte-level BPE]); any bytes encode. Thread-safe.
  std::vector<int64_t> encode(std::string_view text) const;
  // The bytes of `ids`; IndexError naming the first id outside [0, vocab_size()).
  std::string decode(std::span<const int64_t> ids) const;

 private:
  struct Merge {
    int32_t rank;    // the merge's place in merges.txt: lower merges first
    int32_t merged;  // the id of the two tokens' concatenation
  };
  class WordCache;

  BpeTokenizer() = default;
  void encode_piece(std::string_view piece, std::vector<int64_t>& ids) const;  // steps 2-4
  void encode_word(std::string_view word, std::vector<int64_t>& ids) const;    // steps 3-4
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> token_bytes_;        // id -> bytes
  std::array<int32_t, 256> byte_id_{};          // byte -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::optional<int64_t> eot_id_;
  std::shared_ptr<WordCache> cache_;  // shared by copies: they have the same vocabulary
};

}  // namespace loom::data
