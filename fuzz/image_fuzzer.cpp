// fuzz/image_fuzzer.cpp — ImageFolder (data/image_folder.h) on arbitrary bytes as the one image
// of a one-class folder: stb_image's decoders (PNG, JPEG, BMP, GIF, TGA, PNM, and the formats it
// sniffs besides: PSD, HDR, PIC) behind loom's size check and its HWC -> CHW copy. Each input is
// decoded twice: with the file's own channels, and converted to 1..4 channels (picked by the
// input's size), stb_image's other path.

#include "data/image_folder.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("image");
  // The name's extension only admits the file; stb_image tells the format from the bytes.
  dir.write("class/input.png", loom::fuzz::as_text(data, size));
  for (const int channels : {0, 1 + static_cast<int>(size % 4)}) {
    loom::fuzz::refusal_is_a_loom_error([&] {
      const loom::data::ImageFolder folder(dir.path().string(), channels);
      const loom::Shape shape = folder.image_shape();
      loom::fuzz::require(folder.size() == 1 && shape.size() == 3, "one image of [C, H, W]");
      loom::fuzz::require(shape[0] >= 1 && shape[0] <= 4 && (channels == 0 || shape[0] == channels),
                          "1 to 4 channels, as asked");
      loom::fuzz::require(shape[1] >= 1 && shape[2] >= 1, "a decoded image has pixels");
    });
  }
  return 0;
}
