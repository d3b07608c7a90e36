// tests/data/byte_tokenizer_test.cpp — data::ByteTokenizer: the vocabulary is the text's
// distinct bytes in increasing order (nanoGPT's sorted(set(text))), encode and decode invert each
// other on any text of those bytes (UTF-8 included, byte by byte), the vocabulary rebuilds the
// same tokenizer, and every bad input is refused with the byte, id and offset named.

#include "data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace loom::data {
namespace {

TEST(ByteTokenizer, TheVocabularyIsTheSortedDistinctBytes) {
  const ByteTokenizer t = ByteTokenizer::from_text("hello, world\n");
  EXPECT_EQ(t.vocabulary(), std::string("\n ,dehlorw"));
  EXPECT_EQ(t.vocab_size(), 10);
  EXPECT_EQ(t.encode("hello"), (std::vector<int64_t>{5, 4, 6, 6, 7}));
  EXPECT_EQ(t.encode("\n"), (std::vector<int64_t>{0}));
}

TEST(ByteTokenizer, EncodeAndDecodeInvertEachOtherByteByByte) {
  const std::string text = "Gr\xc3\xbc\xc3\x9f Gott!\n\ttab \x01\xff";  // UTF-8 and odd bytes
  const ByteTokenizer t = ByteTokenizer::from_text(text);
  const std::vector<int64_t> ids = t.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(t.decode(ids), text);
  const ByteTokenizer again(t.vocabulary());  // as a checkpoint restores it
  EXPECT_EQ(again.encode(text), ids);
}

TEST(ByteTokenizer, RefusesWhatItCannotRepresent) {
  const ByteTokenizer t = ByteTokenizer::from_text("abc");
  EXPECT_LOOM_ERROR(t.encode("abd"), ValueError, {"'d'", "offset 2", "3 bytes"});
  EXPECT_LOOM_ERROR(t.encode("a\x7f"), ValueError, {"'\\x7f'", "offset 1"});
  const std::vector<int64_t> bad{0, 3};
  EXPECT_LOOM_ERROR(t.decode(bad), IndexError, {"id 3", "position 1", "[0, 3)"});
  const std::vector<int64_t> negative{-1};
  EXPECT_LOOM_ERROR(t.decode(negative), IndexError, {"id -1"});
  EXPECT_LOOM_ERROR(ByteTokenizer::from_text(""), ValueError, {"empty"});
  EXPECT_LOOM_ERROR(ByteTokenizer(std::string("aba")), ValueError, {"'a'", "twice", "ids 0 and 2"});
  EXPECT_LOOM_ERROR(ByteTokenizer(std::string()), ValueError, {"empty"});
}

}  // namespace
}  // namespace loom::data
