// tests/data/bpe_tokenizer_test.cpp — data::BpeTokenizer against Hugging Face `tokenizers`:
// every text of tests/golden/bpe/cases.json (tools/make_bpe_fixture.py) encodes to the ids
// tokenizers gave and decodes back; so does the fortunes corpus (timed; its ids are checked by
// count and SHA-256); bytes that are not UTF-8 round-trip byte by byte; the merge order (lowest
// rank, leftmost) on a small vocabulary written here; and every bad file or id is refused with
// the file, line or id named.

#include "data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/sha256.h"
#include "data/text.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kGoldenDir = fs::path(LOOM_TEST_DATA_DIR) / "bpe";

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// GPT-2's bytes_to_unicode, written again here as encoder.py has it: the printable bytes stand
// for themselves, the rest for 256, 257, ... in byte order; as UTF-8.
std::string byte_char(int byte) {
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int codepoint = byte;
  if (!printable(byte)) {
    codepoint = 256;
    for (int b = 0; b < byte; ++b) codepoint += !printable(b);
  }
  if (codepoint < 0x80) return std::string(1, static_cast<char>(codepoint));
  return {static_cast<char>(0xC0 | (codepoint >> 6)), static_cast<char>(0x80 | (codepoint & 0x3F))};
}

// A byte-level vocabulary of the 256 bytes (ids 0..255) and then `extra` tokens (ids from 256),
// written as GPT-2 writes them; `merges` are merges.txt's lines after the version line.
struct SmallVocab {
  std::vector<std::string> extra;
  std::vector<std::string> merges;
};
fs::path write_small(const test::ScratchDir& dir, const SmallVocab& small) {
  json vocab = json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[byte_char(byte)] = byte;
  for (size_t i = 0; i < small.extra.size(); ++i) vocab[small.extra[i]] = 256 + i;
  write(dir.path() / "vocab.json", vocab.dump());
  std::string merges = "#version: 0.2\n";
  for (const std::string& line : small.merges) merges += line + "\n";
  write(dir.path() / "merges.txt", merges);
  return dir.path();
}

// The tokens of `ids` as bytes, for readable failures ("ab|c").
std::string pieces(const BpeTokenizer& t, const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "|" : "") + t.token_bytes(ids[i]);
  return out;
}

TEST(BpeTokenizer, EncodesEveryFixtureCaseAsTokenizersDoes) {
  const json fixture = read_json(kGoldenDir / "cases.json");
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  EXPECT_EQ(t.vocab_size(), fixture["vocab_size"].get<int64_t>());
  ASSERT_TRUE(t.eot_id().has_value());
  EXPECT_EQ(*t.eot_id(), fixture["eot_id"].get<int64_t>());
  ASSERT_GE(fixture["cases"].size(), 40u);
  for (const json& c : fixture["cases"]) {
    const std::string name = c["name"], text = c["text"];
    const std::vector<int64_t> expected = c["ids"];
    const std::vector<int64_t> ids = t.encode(text);
    EXPECT_EQ(ids, expected) << name << ": got " << pieces(t, ids) << "\nexpected "
                             << pieces(t, expected);
    EXPECT_EQ(t.decode(ids), text) << name;
  }
}

TEST(BpeTokenizer, TheFixtureFilesHashAsPythonHashedThem) {
  const json fixture = read_json(kGoldenDir / "cases.json");  // hashlib.sha256 of each file
  for (const std::string name : {"vocab.json", "merges.txt"})
    EXPECT_EQ(sha256_file_hex(kGoldenDir / name), fixture["sha256"][name].get<std::string>())
        << name;
}

TEST(BpeTokenizer, TokensAreReadBackAsBytes) {
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  for (int byte = 0; byte < 256; ++byte) {
    const std::string one(1, static_cast<char>(byte));
    const std::vector<int64_t> ids = t.encode(one);
    ASSERT_EQ(ids.size(), 1u) << "byte " << byte;
    EXPECT_EQ(t.token_bytes(ids[0]), one) << "byte " << byte;
  }
  const std::vector<int64_t> the = t.encode(" t");  // merges.txt's first line: "Ġ t"
  ASSERT_EQ(the.size(), 1u);
  EXPECT_EQ(t.token_bytes(the[0]), " t");
  EXPECT_EQ(t.token_bytes(*t.eot_id()), "<|endoftext|>");
}

TEST(BpeTokenizer, EncodesTheFortunesCorpusAsTokenizersDoesAndBack) {
  const fs::path fortunes = "/usr/share/games/fortunes";
  if (!fs::is_directory(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  const std::string corpus = read_corpus(fortunes);
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  const std::vector<int64_t> ids = t.encode(corpus);
  EXPECT_TRUE(t.decode(ids) == corpus) << "the corpus does not decode back";
  EXPECT_EQ(t.encode(corpus), ids) << "a second, cached encode differs";

  // The fixture holds the count and a hash of tokenizers' ids for the corpus it was made from.
  const json expected = read_json(kGoldenDir / "cases.json")["corpus"];
  if (sha256_hex(corpus) != expected["sha256"].get<std::string>()) {
    std::printf("these fortunes are not the ones the fixture was made from; ids not compared\n");
    return;
  }
  EXPECT_EQ(ids.size(), expected["tokens"].get<size_t>());
  std::string digits;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) digits += ',';
    digits += std::to_string(ids[i]);
  }
  EXPECT_EQ(sha256_hex(digits), expected["ids_sha256"].get<std::string>());
}

TEST(BpeTokenizer, BytesThatAreNotUtf8RoundTripOneByOne) {
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  const std::vector<std::string> texts = {
      "\xff",      "ab\xfe\xff cd",         "caf\xc3",         "\xc3(",
      "\xc0\xaf",  "\xe0\x80\x80 overlong", "\xed\xa0\x80",    "\xf4\x90\x80\x80",
      "\x80 lone", "\xe6\x97 cut short",    "ok \xf0\x9f\x98", "\xc3\xa9 valid"};
  for (const std::string& text : texts) {
    const std::vector<int64_t> ids = t.encode(text);
    EXPECT_EQ(t.decode(ids), text)
        << json(text).dump(-1, ' ', true, json::error_handler_t::replace);
  }
  // An invalid byte is a character of the class [^\s\p{L}\p{N}] by itself: between two letters
  // it is a word of its own, encoded as its byte's token.
  const std::vector<int64_t> ff = t.encode("\xff");
  ASSERT_EQ(ff.size(), 1u);
  EXPECT_EQ(t.token_bytes(ff[0]), "\xff");
  std::vector<int64_t> expected = t.encode("abc");
  expected.push_back(ff[0]);
  for (int64_t id : t.encode("def")) expected.push_back(id);
  EXPECT_EQ(t.encode("abc\xff"
                     "def"),
            expected);
}

TEST(BpeTokenizer, MergesGoByRankThenLeftmost) {
  test::ScratchDir dir("bpe");
  const BpeTokenizer t =
      BpeTokenizer::from_dir(write_small(dir, {.extra = {"bc", "abc", "ab", "aa", "aaaa"},
                                               .merges = {"b c", "a bc", "a b", "a a", "aa aa"}}));
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_FALSE(t.eot_id().has_value());
  EXPECT_EQ(pieces(t, t.encode("abc")), "abc");               // b c (rank 0) first, then a bc
  EXPECT_EQ(pieces(t, t.encode("abd")), "ab|d");              // a b where b c cannot apply
  EXPECT_EQ(pieces(t, t.encode("aaa")), "aa|a");              // the leftmost of equal ranks
  EXPECT_EQ(pieces(t, t.encode("aaaaa")), "aaaa|a");          // aa aa, made by merges of rank 3
  EXPECT_EQ(pieces(t, t.encode("xabc abc")), "x|abc| |abc");  // " abc": Ġ a has no merge
  // Without the token in the vocabulary <|endoftext|> is ordinary text.
  EXPECT_EQ(t.decode(t.encode("a<|endoftext|>b")), "a<|endoftext|>b");
  EXPECT_EQ(t.encode("<|endoftext|>").size(), 13u);
}

TEST(BpeTokenizer, CopiesAndThreadsEncodeAlike) {
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  const BpeTokenizer copy = t;
  const std::string text = "It's a copy; they're alike, and the threads agree.\n";
  const std::vector<int64_t> ids = t.encode(text);
  EXPECT_EQ(copy.encode(text), ids);
  std::vector<std::vector<int64_t>> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      for (int repeat = 0; repeat < 200; ++repeat) results[i] = copy.encode(text + text);
    });
  for (std::thread& thread : threads) thread.join();
  std::vector<int64_t> twice = t.encode(text + text);
  for (const auto& r : results) EXPECT_EQ(r, twice);
}

TEST(BpeTokenizer, RefusesBadIds) {
  const BpeTokenizer t = BpeTokenizer::from_dir(kGoldenDir);
  const std::vector<int64_t> bad{1, 1000};
  EXPECT_LOOM_ERROR(t.decode(bad), IndexError, {"id 1000", "position 1", "[0, 1000)"});
  const std::vector<int64_t> negative{-1};
  EXPECT_LOOM_ERROR(t.decode(negative), IndexError, {"id -1", "position 0"});
  EXPECT_LOOM_ERROR(t.token_bytes(1000), IndexError, {"id 1000", "[0, 1000)"});
}

TEST(BpeTokenizer, RefusesFilesThatAreMissingOrDoNotParse) {
  test::ScratchDir dir("bpe");
  const fs::path root = write_small(dir, {.extra = {"ab"}, .merges = {"a b"}});
  const fs::path vocab = root / "vocab.json", merges = root / "merges.txt";
  EXPECT_NO_THROW(BpeTokenizer::from_files(vocab, merges));
  EXPECT_LOOM_ERROR(BpeTokenizer::from_files(root / "nope.json", merges), IOError,
                    {"cannot open", "nope.json"});
  EXPECT_LOOM_ERROR(BpeTokenizer::from_files(vocab, root / "nope.txt"), IOError,
                    {"cannot open", "nope.txt"});
  EXPECT_LOOM_ERROR(BpeTokenizer::from_dir(root / "missing"), IOError,
                    {"cannot open", "missing/vocab.json"});
  EXPECT_LOOM_ERROR(BpeTokenizer::from_files(root, merges), IOError, {"is a folder"});

  // vocab.json. Each case rewrites it from the good one.
  const std::string good = json::parse(std::ifstream(vocab)).dump();
  const auto with_vocab = [&](const std::string& text) {
    const fs::path path = root / "bad_vocab.json";
    write(path, text);
    return BpeTokenizer::from_files(path, merges);
  };
  const std::string body = good.substr(1, good.size() - 2);  // the entries, without { }
  EXPECT_LOOM_ERROR(with_vocab("{\"a\": 0,\n \"b\" 1}"), IOError,
                    {"bad_vocab.json", "not valid JSON", "line 2, column 6"});
  EXPECT_LOOM_ERROR(with_vocab("[1, 2]"), IOError, {"bad_vocab.json", "JSON object", "array"});
  EXPECT_LOOM_ERROR(with_vocab("{" + body + ",\"xy\":\"257\"}"), IOError,
                    {"bad_vocab.json", "\"xy\"", "not an integer", "line 1, column"});
  EXPECT_LOOM_ERROR(with_vocab("{" + body + ",\"xy\":300}"), IOError,
                    {"\"xy\"", "id 300", "outside [0, 258)"});
  EXPECT_LOOM_ERROR(with_vocab("{" + body + ",\n\"xy\":256}"), IOError,
                    {"bad_vocab.json, line 2, column 1", "id 256", "\"ab\"", "\"xy\""});
  EXPECT_LOOM_ERROR(with_vocab("{" + body + ",\"ab\":257}"), IOError,
                    {"bad_vocab.json", "\"ab\"", "twice"});
  EXPECT_LOOM_ERROR(with_vocab("{" + body + ",\"x y\":257}"), IOError,
                    {"bad_vocab.json", "\"x y\"", "not byte-level"});
  json no_newline = json::parse(good);
  no_newline.erase(byte_char('\n'));
  no_newline[byte_char('\n') + "x"] = 10;  // keeps the ids 0..n-1
  EXPECT_LOOM_ERROR(with_vocab(no_newline.dump()), IOError,
                    {"bad_vocab.json", "no token for byte 10", "\"Ċ\""});

  // merges.txt: line numbers count the version line.
  const auto with_merges = [&](const std::string& text) {
    const fs::path path = root / "bad_merges.txt";
    write(path, text);
    return BpeTokenizer::from_files(vocab, path);
  };
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\na b\nab\n"), IOError,
                    {"bad_merges.txt, line 3", "two tokens", "\"ab\""});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\na b c\n"), IOError,
                    {"bad_merges.txt, line 2", "two tokens"});
  EXPECT_LOOM_ERROR(with_merges("a b\n\n"), IOError, {"bad_merges.txt, line 2", "two tokens"});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\nab c\n"), IOError,
                    {"bad_merges.txt, line 2", "\"ab\"", "\"c\"", "\"abc\"", "not in"});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\nb a\n"), IOError,
                    {"bad_merges.txt, line 2", "\"ba\"", "not in", "vocab.json"});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\na b\r\na b\r\n"), IOError,
                    {"bad_merges.txt, line 3", "line 2 already"});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\na x\xe2\x82\xac\n"), IOError,
                    {"bad_merges.txt, line 2", "not byte-level"});
  EXPECT_LOOM_ERROR(with_merges("#version: 0.2\na zz\n"), IOError,
                    {"bad_merges.txt, line 2", "token \"zz\" is not in"});
}

}  // namespace
}  // namespace loom::data
