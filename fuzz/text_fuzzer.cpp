// fuzz/text_fuzzer.cpp — the GPT's text path on arbitrary bytes: read_corpus (data/text.h) reads
// them as a corpus file, ByteTokenizer (data/byte_tokenizer.h) builds its vocabulary from them,
// encodes and decodes them (the round trip must give the bytes back) and takes them as a
// checkpoint's vocabulary, then split_text and TextWindows cut training windows from the ids.

#include "data/byte_tokenizer.h"
#include "data/text.h"
#include "fuzz/fuzz_util.h"

namespace {

using loom::fuzz::require;

void windows(const std::vector<int64_t>& ids, int64_t block_size) {
  const loom::data::TextWindows windows(ids, block_size, /*seed=*/ids.size());
  const auto [x, y] = windows.batch(/*step=*/3, /*first=*/0, /*count=*/2);
  require(x.sizes() == loom::Shape{2, block_size} && y.sizes() == x.sizes(), "x, y [2, block]");
  const int64_t* px = x.data_ptr<int64_t>();
  const int64_t* py = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t start = windows.window_start(3, i);
    require(start >= 0 && start + block_size < windows.size(), "a window lies inside the text");
    for (int64_t t = 0; t < block_size; ++t)
      require(
          px[i * block_size + t] == ids[start + t] && py[i * block_size + t] == ids[start + t + 1],
          "y is x shifted by one");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("text");
  const std::string path = dir.write("corpus.txt", loom::fuzz::as_text(data, size));
  loom::fuzz::refusal_is_a_loom_error([&] {
    const std::string text = loom::data::read_corpus(path);
    require(text == loom::fuzz::as_text(data, size), "a corpus file reads as its bytes");
    const auto tokenizer = loom::data::ByteTokenizer::from_text(text);
    const std::vector<int64_t> ids = tokenizer.encode(text);
    require(tokenizer.decode(ids) == text, "decode(encode(text)) == text");
    const loom::data::ByteTokenizer restored(tokenizer.vocabulary());
    require(restored.encode(text) == ids, "a restored vocabulary encodes alike");
    const loom::data::TextSplit split = loom::data::split_text(text);
    require(split.train + split.validation == text, "the split keeps every byte");
    windows(ids, 1 + static_cast<int64_t>(size % 7));
  });
  // The bytes as a checkpoint's vocabulary: refused when empty or with a repeat, else each id
  // decodes to its byte.
  loom::fuzz::refusal_is_a_loom_error([&] {
    const loom::data::ByteTokenizer tokenizer{std::string(loom::fuzz::as_text(data, size))};
    std::vector<int64_t> all(size);
    for (size_t i = 0; i < size; ++i) all[i] = static_cast<int64_t>(i);
    require(tokenizer.decode(all) == loom::fuzz::as_text(data, size), "ids decode in order");
  });
  return 0;
}
