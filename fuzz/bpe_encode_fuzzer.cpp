// fuzz/bpe_encode_fuzzer.cpp — BpeTokenizer::encode and decode (data/bpe_tokenizer.h) on
// arbitrary bytes with the 1000-token vocabulary of tests/golden/bpe: the UTF-8 decoding, GPT-2's
// pre-tokenization regex written out by hand, <|endoftext|> and the merge loop. Any bytes encode
// (Note [Byte-level BPE]), and decode(encode(t)) == t; the input read as ids (8 bytes each)
// decodes or is refused with IndexError.

#include <cstring>

#include "data/bpe_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer =
      loom::data::BpeTokenizer::from_dir(std::string(LOOM_SOURCE_DIR) + "/tests/golden/bpe");
  const std::string_view text = loom::fuzz::as_text(data, size);
  const std::vector<int64_t> ids = tokenizer.encode(text);
  for (const int64_t id : ids)
    loom::fuzz::require(id >= 0 && id < tokenizer.vocab_size(), "encode gives vocabulary ids");
  loom::fuzz::require(tokenizer.decode(ids) == text, "decode(encode(bytes)) == bytes");

  std::vector<int64_t> raw_ids(size / sizeof(int64_t));
  if (!raw_ids.empty()) std::memcpy(raw_ids.data(), data, raw_ids.size() * sizeof(int64_t));
  loom::fuzz::refusal_is_a_loom_error([&] { tokenizer.decode(raw_ids); });
  return 0;
}
