// data/bpe_tokenizer.cpp — data/bpe_tokenizer.h: GPT-2's byte map, UTF-8 and the character
// classes, the pre-tokenization regex written out by hand, the merge loop, and the two files'
// readers with their errors.

#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <sstream>

#include "data/unicode_tables.h"
#include "tensor/error.h"

namespace loom::data {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kEndOfText = "<|endoftext|>";

// ------------------------------------------------------------------ GPT-2's bytes_to_unicode

// The code point that stands for each byte in vocab.json and merges.txt (Note [Byte-level BPE],
// step 3): the printable bytes themselves, the others U+0100 onwards in byte order.
std::array<char32_t, 256> make_byte_codepoints() {
  std::array<char32_t, 256> codepoint{};
  char32_t next_unprintable = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                           (byte >= 0xAE && byte <= 0xFF);
    codepoint[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return codepoint;
}

const std::array<char32_t, 256> kByteCodepoint = make_byte_codepoints();
constexpr char32_t kByteCodepointEnd = 0x100 + 68;  // the 68 unprintable bytes: 0-32, 127-160, 173

// The byte code point `c` stands for; -1 where it stands for none.
int byte_of_codepoint(char32_t c) {
  static const std::array<int16_t, kByteCodepointEnd> byte_of = [] {
    std::array<int16_t, kByteCodepointEnd> table;
    table.fill(-1);
    for (int byte = 0; byte < 256; ++byte) table[kByteCodepoint[byte]] = static_cast<int16_t>(byte);
    return table;
  }();
  return c < kByteCodepointEnd ? byte_of[c] : -1;
}

// The character that stands for `byte`, as UTF-8 ("Ġ" for a space).
std::string byte_level_char(int byte) {
  const char32_t c = kByteCodepoint[byte];
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};  // < U+0800
}

// ------------------------------------------------------------------ UTF-8 and character classes

struct Utf8Char {
  char32_t codepoint;
  int size;    // bytes
  bool valid;  // false: a byte that begins no valid sequence, a character of size 1
};

// The character at `pos` (< s.size()), decoded as strictly as Python does: no overlong forms,
// no surrogates, nothing past U+10FFFF.
Utf8Char utf8_at(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {lead, 1, true};
  int size = 0;
  char32_t codepoint = 0;
  unsigned char second_min = 0x80, second_max = 0xBF;  // the ranges of Unicode's Table 3-7
  if (lead >= 0xC2 && lead <= 0xDF) {
    size = 2, codepoint = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    size = 3, codepoint = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;  // no overlong 3-byte forms
    if (lead == 0xED) second_max = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    size = 4, codepoint = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;  // no overlong 4-byte forms
    if (lead == 0xF4) second_max = 0x8F;  // nothing past U+10FFFF
  } else {
    return {lead, 1, false};
  }
  if (pos + size > s.size()) return {lead, 1, false};
  for (int i = 1; i < size; ++i) {
    const unsigned char next = byte(pos + i);
    const unsigned char min = i == 1 ? second_min : 0x80, max = i == 1 ? second_max : 0xBF;
    if (next < min || next > max) return {lead, 1, false};
    codepoint = (codepoint << 6) | (next & 0x3F);
  }
  return {codepoint, size, true};
}

// The classes GPT-2's regex tells apart: \p{L}, \p{N}, \s and everything else.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

template <size_t N>
bool in_ranges(const unicode::CodepointRange (&ranges)[N], char32_t c) {
  const auto* after = std::upper_bound(std::begin(ranges), std::end(ranges), c,
                                       [](char32_t v, const auto& r) { return v < r.first; });
  return after != std::begin(ranges) && c <= (after - 1)->last;
}

CharClass class_of(const Utf8Char& c) {
  if (!c.valid) return CharClass::kOther;  // as a lone surrogate (Note [Byte-level BPE])
  if (c.codepoint < 0x80) {
    const char ascii = static_cast<char>(c.codepoint);
    if ((ascii >= 'a' && ascii <= 'z') || (ascii >= 'A' && ascii <= 'Z')) return CharClass::kLetter;
    if (ascii >= '0' && ascii <= '9') return CharClass::kNumber;
    if (ascii == ' ' || (ascii >= '\t' && ascii <= '\r')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (in_ranges(unicode::kLetterRanges, c.codepoint)) return CharClass::kLetter;
  if (in_ranges(unicode::kNumberRanges, c.codepoint)) return CharClass::kNumber;
  if (in_ranges(unicode::kSpaceRanges, c.codepoint)) return CharClass::kSpace;
  return CharClass::kOther;
}

// ------------------------------------------------------------------ pre-tokenization

// Where the word that starts at `pos` (< s.size()) ends: the first alternative of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// that matches at `pos`, as a backtracking regex engine takes it.
size_t word_end(std::string_view s, size_t pos) {
  if (s[pos] == '\'') {
    for (std::string_view contraction : {"s", "t", "re", "ve", "m", "ll", "d"})
      if (s.substr(pos + 1).starts_with(contraction)) return pos + 1 + contraction.size();
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class.
  const size_t run_start = s[pos] == ' ' && pos + 1 < s.size() ? pos + 1 : pos;
  const Utf8Char first = utf8_at(s, run_start);
  const CharClass run_class = class_of(first);
  if (run_class != CharClass::kSpace) {
    size_t end = run_start + first.size;
    while (end < s.size()) {
      const Utf8Char c = utf8_at(s, end);
      if (class_of(c) != run_class) break;
      end += c.size;
    }
    return end;
  }
  // '\s+(?!\S)': all of a run of whitespace that ends the text, or all but its last character
  // when a word follows; '\s+': a single whitespace character before a word.
  size_t end = pos, last = pos;
  while (end < s.size()) {
    const Utf8Char c = utf8_at(s, end);
    if (class_of(c) != CharClass::kSpace) break;
    last = end;
    end += c.size;
  }
  if (end == s.size() || last == pos) return end;
  return last;
}

// ------------------------------------------------------------------ reading the files

// A string as JSON writes it ("Ġthe", "\n"), for messages; bytes that are not UTF-8 become U+FFFD.
std::string json_string(std::string_view text) {
  return json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// The bytes a byte-level token stands for ("Ġthe" -> " the"); nullopt where a character of it
// stands for no byte (or it is not UTF-8).
std::optional<std::string> byte_level_bytes(std::string_view token) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Char c = utf8_at(token, pos);
    const int byte = c.valid ? byte_of_codepoint(c.codepoint) : -1;
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
    pos += c.size;
  }
  return bytes;
}

std::string read_file(const fs::path& path) {
  std::error_code ec;
  LOOM_CHECK(!fs::is_directory(path, ec), IOError, "BpeTokenizer: ", path.string(),
             " is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), IOError, "BpeTokenizer: cannot open ", path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  LOOM_CHECK(!in.bad(), IOError, "BpeTokenizer: cannot read ", path.string());
  return bytes.str();
}

// "line L, column C" of where `key` is written as an object key in the JSON text `raw` (as
// tokenizers and GPT-2 write it), for messages about one entry of vocab.json; "" if not found.
std::string key_position(const std::string& raw, const std::string& key) {
  const std::string written = json_string(key);
  for (size_t at = raw.find(written); at != std::string::npos; at = raw.find(written, at + 1)) {
    const size_t colon = raw.find_first_not_of(" \t\r\n", at + written.size());
    if (colon == std::string::npos || raw[colon] != ':') continue;
    const size_t line = 1 + std::count(raw.begin(), raw.begin() + at, '\n');
    const size_t line_start = raw.rfind('\n', at);
    const size_t column = at + 1 - (line_start == std::string::npos ? 0 : line_start + 1);
    return detail::str(", line ", line, ", column ", column);
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------ the word cache

// Each word's ids, shared by every encode (of this tokenizer and its copies), behind a mutex:
// encode is const and may run on several threads. Like tokenizers' cache it keeps words up to
// 256 bytes and stops growing when full.
class BpeTokenizer::WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;

  // Appends the ids of `word` to `ids` and returns true where the word is cached.
  bool append(std::string_view word, std::vector<int64_t>& ids) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = words_.find(word);
    if (it == words_.end()) return false;
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view word, std::vector<int32_t> word_ids) {
    if (word.size() > kMaxWordBytes) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (words_.size() < kCapacity) words_.try_emplace(std::string(word), std::move(word_ids));
  }

 private:
  static constexpr size_t kCapacity = 1 << 17;
  struct Hash {  // lets a string_view look up a std::string key
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::mutex mutex_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> words_;
};

// ------------------------------------------------------------------ loading

BpeTokenizer BpeTokenizer::from_dir(const fs::path& dir) {
  return from_files(dir / "vocab.json", dir / "merges.txt");
}

BpeTokenizer BpeTokenizer::from_files(const fs::path& vocab_json, const fs::path& merges_txt) {
  BpeTokenizer t;
  t.cache_ = std::make_shared<WordCache>();
  const std::string vocab_name = vocab_json.string(), merges_name = merges_txt.string();

  // vocab.json: {"token": id, ...}. nlohmann keeps the last of duplicate keys silently; the
  // callback sees them all.
  const std::string vocab_text = read_file(vocab_json);
  std::set<std::string> keys;
  std::string duplicate_key;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event,
                                                json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate_key.empty())
      duplicate_key = parsed.get<std::string>();
    return true;
  };
  json vocab;
  try {
    vocab = json::parse(vocab_text, note_keys);
  } catch (const json::parse_error& e) {
    throw IOError(detail::str("BpeTokenizer: ", vocab_name, " is not valid JSON (byte ", e.byte,
                              "): ", e.what()));
  } catch (const json::exception& e) {  // a number past a double's range (out_of_range.406)
    throw IOError(detail::str("BpeTokenizer: ", vocab_name, " is not valid JSON: ", e.what()));
  }
  LOOM_CHECK(vocab.is_object(), IOError, "BpeTokenizer: ", vocab_name,
             " should hold a JSON object of token -> id; it holds a JSON ", vocab.type_name());
  LOOM_CHECK(duplicate_key.empty(), IOError, "BpeTokenizer: ", vocab_name,
             key_position(vocab_text, duplicate_key), ": token ", json_string(duplicate_key),
             " appears twice");
  const auto size = static_cast<int64_t>(vocab.size());
  t.token_bytes_.resize(static_cast<size_t>(size));
  std::vector<const std::string*> token_of_id(static_cast<size_t>(size), nullptr);
  std::unordered_map<std::string, int32_t> id_of_bytes;
  for (const auto& item : vocab.items()) {
    // References, not a structured binding: `where` captures the token (clang before 16 cannot
    // capture a structured binding).
    const std::string& token = item.key();
    const json& value = item.value();
    const auto where = [&] {  // only on an error: key_position searches the whole text
      return detail::str("BpeTokenizer: ", vocab_name, key_position(vocab_text, token), ": token ",
                         json_string(token));
    };
    LOOM_CHECK(value.is_number_integer(), IOError, where(), " has id ", value.dump(),
               ", not an integer");
    const int64_t id = value.get<int64_t>();
    LOOM_CHECK(id >= 0 && id < size, IOError, where(), " has id ", id, ", outside [0, ", size,
               "): the ids of ", size, " tokens are 0..", size - 1);
    const std::optional<std::string> bytes = byte_level_bytes(token);
    LOOM_CHECK(bytes.has_value(), IOError, where(),
               " is not byte-level: a character of it stands for no byte in GPT-2's byte map");
    LOOM_CHECK(token_of_id[id] == nullptr, IOError, where(), " has id ", id, ", which token ",
               json_string(*token_of_id[id]), " has too");
    token_of_id[id] = &token;
    t.token_bytes_[id] = *bytes;
    id_of_bytes.emplace(*bytes, static_cast<int32_t>(id));  // distinct tokens, distinct bytes
    if (token == kEndOfText) t.eot_id_ = id;
  }
  for (int byte = 0; byte < 256; ++byte) {
    const auto it = id_of_bytes.find(std::string(1, static_cast<char>(byte)));
    LOOM_CHECK(it != id_of_bytes.end(), IOError, "BpeTokenizer: ", vocab_name,
               " has no token for byte ", byte, " (written ", json_string(byte_level_char(byte)),
               "); a byte-level vocabulary has all 256");
    t.byte_id_[byte] = it->second;
  }

  // merges.txt: "#version: 0.2", then "left right" a line, by rank.
  const std::string merges_text = read_file(merges_txt);
  std::unordered_map<uint64_t, size_t> line_of_merge;
  std::istringstream lines(merges_text);
  std::string line;
  int32_t rank = 0;
  for (size_t line_number = 1; std::getline(lines, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with("#version")) continue;
    const auto where = [&] {
      return detail::str("BpeTokenizer: ", merges_name, ", line ", line_number, ": ");
    };
    const size_t space = line.find(' ');
    LOOM_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                   line.find(' ', space + 1) == std::string::npos,
               IOError, where(), "expected two tokens separated by a space; got ",
               json_string(line));
    int32_t ids[2];
    std::string bytes[2];
    const std::string_view sides[2] = {std::string_view(line).substr(0, space),
                                       std::string_view(line).substr(space + 1)};
    for (int side = 0; side < 2; ++side) {
      const std::optional<std::string> side_bytes = byte_level_bytes(sides[side]);
      LOOM_CHECK(side_bytes.has_value(), IOError, where(), "token ", json_string(sides[side]),
                 " is not byte-level: a character of it stands for no byte in GPT-2's byte map");
      const auto it = id_of_bytes.find(*side_bytes);
      LOOM_CHECK(it != id_of_bytes.end(), IOError, where(), "token ", json_string(sides[side]),
                 " is not in ", vocab_name);
      ids[side] = it->second;
      bytes[side] = *side_bytes;
    }
    const auto merged = id_of_bytes.find(bytes[0] + bytes[1]);
    LOOM_CHECK(merged != id_of_bytes.end(), IOError, where(), "the merge of ",
               json_string(sides[0]), " and ", json_string(sides[1]), " makes ",
               json_string(std::string(sides[0]) + std::string(sides[1])), ", which is not in ",
               vocab_name);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ids[0])) << 32) |
                         static_cast<uint32_t>(ids[1]);
    const auto [previous, added] = line_of_merge.emplace(key, line_number);
    LOOM_CHECK(added, IOError, where(), "the merge ", json_string(line), " is on line ",
               previous->second, " already");
    t.merges_.emplace(key, Merge{rank++, merged->second});
  }
  return t;
}

// ------------------------------------------------------------------ encoding and decoding

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const auto it = merges_.find(key);
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3);
  size_t start = 0;
  if (eot_id_) {  // Note [Byte-level BPE], step 1
    for (size_t at; (at = text.find(kEndOfText, start)) != std::string_view::npos;
         start = at + kEndOfText.size()) {
      encode_piece(text.substr(start, at - start), ids);
      ids.push_back(*eot_id_);
    }
  }
  encode_piece(text.substr(start), ids);
  return ids;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& ids) const {
  for (size_t pos = 0; pos < piece.size();) {
    const size_t end = word_end(piece, pos);
    encode_word(piece.substr(pos, end - pos), ids);
    pos = end;
  }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.size() == 1) {
    ids.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (cache_->append(word, ids)) return;

  // Step 4 as tokenizers' Word::merge_all: the candidate merges in a min-heap by (rank,
  // position); one whose pair has changed since it was pushed is skipped when it comes up.
  // Symbols form a linked list; a merge grows the left symbol and unlinks the right one.
  struct Symbol {
    int32_t id;          // -1 once merged into the symbol on its left
    int32_t prev, next;  // -1 at the ends
  };
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  const auto push_pair_at = [&](int32_t pos) {  // the pair of `pos` and the symbol after it
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = find_merge(symbols[pos].id, symbols[next].id))
      candidates.push({m->rank, pos, m->merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair_at(i);
  while (!candidates.empty()) {
    const Candidate top = candidates.top();
    candidates.pop();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = find_merge(left.id, right.id);
    if (m == nullptr || m->merged != top.merged) continue;  // the pair is no longer there
    left.id = top.merged;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair_at(left.prev);
    push_pair_at(top.pos);
  }
  std::vector<int32_t> word_ids;
  for (int32_t i = 0; i >= 0; i = symbols[i].next) word_ids.push_back(symbols[i].id);
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  cache_->insert(word, std::move(word_ids));
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  LOOM_CHECK(id >= 0 && id < vocab_size(), IndexError, "BpeTokenizer: id ", id,
             " is outside the vocabulary [0, ", vocab_size(), ")");
  return token_bytes_[static_cast<size_t>(id)];
}

std::string BpeTokenizer::decode(std::span<const int64_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), IndexError, "BpeTokenizer: id ", ids[i],
               " at position ", i, " is outside the vocabulary [0, ", vocab_size(), ")");
    text += token_bytes_[static_cast<size_t>(ids[i])];
  }
  return text;
}

}  // namespace loom::data
