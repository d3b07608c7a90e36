// fuzz/bpe_files_fuzzer.cpp — BpeTokenizer::from_files (data/bpe_tokenizer.h) on arbitrary bytes:
// the input is vocab.json, then the line kSeparator, then merges.txt (no separator: all of it is
// vocab.json and merges.txt is only its version line). A tokenizer that loads must encode the
// input's bytes to ids in its vocabulary that decode back to the same bytes.

#include <algorithm>

#include "data/bpe_tokenizer.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr std::string_view kSeparator = "\n--merges.txt--\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("bpe_files");
  const std::string_view input = loom::fuzz::as_text(data, size);
  const size_t split = input.find(kSeparator);
  std::string_view vocab = input, merges = "#version: 0.2\n";
  if (split != std::string_view::npos) {
    vocab = input.substr(0, split);
    merges = input.substr(split + kSeparator.size());
  }
  const std::string vocab_path = dir.write("vocab.json", vocab);
  const std::string merges_path = dir.write("merges.txt", merges);
  loom::fuzz::refusal_is_a_loom_error([&] {
    const auto tokenizer = loom::data::BpeTokenizer::from_files(vocab_path, merges_path);
    loom::fuzz::require(tokenizer.vocab_size() >= 256, "a byte-level vocabulary has every byte");
    const std::vector<int64_t> ids = tokenizer.encode(input);
    loom::fuzz::require(
        std::all_of(ids.begin(), ids.end(),
                    [&](int64_t id) { return id >= 0 && id < tokenizer.vocab_size(); }),
        "encode gives ids of the vocabulary");
    loom::fuzz::require(tokenizer.decode(ids) == input, "decode(encode(bytes)) == bytes");
  });
  return 0;
}
