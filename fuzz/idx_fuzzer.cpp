// fuzz/idx_fuzzer.cpp — read_idx (data/idx.h), the reader of Fashion-MNIST's files, on arbitrary
// bytes, plain or gzip-compressed (zlib's gzread takes both): the magic number, the big-endian
// dims and the elements. What reads must hold exactly the elements its dims promise.

#include "data/idx.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("idx");
  const std::string path = dir.write("input-idx-ubyte", loom::fuzz::as_text(data, size));
  loom::fuzz::refusal_is_a_loom_error([&] {
    const loom::Tensor images = loom::data::read_idx(path);
    // Dense unless empty: is_contiguous() is false for an empty [2, 0] (its strides [1, 1]).
    loom::fuzz::require(
        images.dtype() == loom::kUInt8 && (images.is_contiguous() || images.numel() == 0),
        "an IDX file reads as dense uint8");
    loom::fuzz::require(images.dim() >= 1 && images.dim() <= 8, "an IDX file has 1 to 8 dims");
    // A plain file holds the 4-byte magic, 4 bytes a dim, then the elements, and no more.
    if (size >= 2 && !(data[0] == 0x1f && data[1] == 0x8b))
      loom::fuzz::require(static_cast<size_t>(images.numel()) + 4 + 4 * images.dim() == size,
                          "a plain IDX file's size is its header and its elements");
  });
  return 0;
}
