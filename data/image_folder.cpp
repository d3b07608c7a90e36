// data/image_folder.cpp — scan the class folders in sorted order, decode the first image to learn
// [C, H, W], then decode the rest in parallel straight into their slots of the tensor (HWC from
// stb_image transposed to CHW). Errors are collected per file and the first, in file order, is
// raised, so the message does not depend on the thread count.

#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "tensor/parallel.h"

// stb_image's functions are compiled here, static, so they cannot clash with another copy in the
// program (libstb, an application's own); only the decoders of the formats ImageFolder admits
// (Note [Decoding untrusted images]).
#define STB_IMAGE_STATIC
// stb's own asserts check its decoders' invariants, which a corrupt file can break (a JPEG's
// Huffman code that does not match its table); a Release build (NDEBUG) compiles them out. Out
// in every build, so Debug and fuzz builds decode as users' builds do, and the sanitizers judge
// what follows.
#define STBI_ASSERT(x) static_cast<void>(0)
// stb allocates its decoders' state uninitialised: a JPEG scan that names a Huffman table the file
// never defined decodes through whatever the heap held (an index of -63 into a table, found by
// fuzzing). Zeroed, such a table decodes every code to symbol 0 in 0 bits, and ImageFolder
// refuses the file before that anyway (jpeg_scans_use_defined_tables).
#define STBI_MALLOC(size) std::calloc(1, size)
#define STBI_REALLOC(pointer, size) std::realloc(pointer, size)
#define STBI_FREE(pointer) std::free(pointer)
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_TGA
#define STBI_ONLY_PNM
#include <stb/stb_image.h>

namespace loom::data {

namespace fs = std::filesystem;

namespace {

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const char* known : {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".pgm", ".ppm"})
    if (ext == known) return true;
  return false;
}

bool is_hidden(const fs::path& path) { return path.filename().string().starts_with("."); }

// Note [Decoding untrusted images]
// stb_image 2.27 (Debian 12's libstb) believes an image's header: a 30-byte file that claims
// 16384 x 16384 pixels has them allocated, and its PNM reader parses a header number into an int
// without an overflow check (2.28 added one). So before stb decodes a file (found by fuzzing,
// fuzz/image_fuzzer.cpp):
//   - stb sniffs the format from the bytes, whatever the file's name: only the decoders of the
//     formats ImageFolder admits are compiled (no PSD, HDR or PIC);
//   - a PNM header's numbers may have at most 9 digits (below 2^31), and a JPEG's Huffman
//     tables at most 256 codes each, as stb 2.28 requires;
//   - a JPEG scan may use only Huffman tables defined before it (stb 2.27 does not check, and
//     decodes with a table's uninitialised memory; its allocations are zeroed as well);
//   - the header's width x height may be at most kMaxPixels; the folder holds every image in
//     memory, and a larger one is far beyond what a training set of one size holds (a BMP
//     stored top-down has a negative height in its header: its magnitude counts);
//   - a 16-bit PNM converted to other channels goes through stb's 8-bit conversion itself
//     (stb 2.27 converts it as 8-bit samples and reads past its buffer; 2.28 fixed that);
//   - a PNG's empty IDAT chunks are taken out: stb copies an empty chunk's 0 bytes to its data
//     buffer before it has one, memcpy(NULL, ..., 0), undefined behaviour that lets the compiler
//     drop stb's later "no IDAT" null check. An empty chunk adds no data, so the image is the same;
//   - a PNG whose IDAT chunk claims more bytes than the file holds is refused: stb grows its data
//     buffer to the claimed length (up to 2 GiB from a 69-byte file) before it finds them
//     missing, and then fails anyway.
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr int64_t kMaxPixels = int64_t{1} << 26;  // 8192 x 8192
#else
constexpr int64_t kMaxPixels = int64_t{1} << 20;  // the fuzz build: quick inputs (docs/fuzzing.md)
#endif

// Whether the numbers of a binary PNM header (P5, P6), read as stbi__pnm_info reads them
// (whitespace and #-comments between), have at most 9 digits each; true for any other format.
bool pnm_numbers_fit(const std::vector<stbi_uc>& bytes) {
  if (bytes.size() < 2 || bytes[0] != 'P' || (bytes[1] != '5' && bytes[1] != '6')) return true;
  const auto is_space = [](stbi_uc c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  size_t at = 2;
  for (int number = 0; number < 3; ++number) {  // width, height, maximum value
    for (;;) {
      while (at < bytes.size() && is_space(bytes[at])) ++at;
      if (at >= bytes.size() || bytes[at] != '#') break;
      while (at < bytes.size() && bytes[at] != '\n' && bytes[at] != '\r') ++at;
    }
    size_t digits = 0;
    for (; at < bytes.size() && bytes[at] >= '0' && bytes[at] <= '9'; ++at) ++digits;
    if (digits > 9) return false;
  }
  return true;
}

// Whether every Huffman table of a JPEG has at most 256 codes; stb 2.27 writes past its tables
// for more (2.28 checks). Each FF C4 (DHT) marker anywhere in the file is read as stb's
// stbi__process_marker would read it there (bytes past the end read as 0), so no path stb takes
// through the file meets a table the check has not seen. True for any other format.
bool jpeg_huffman_tables_fit(const std::vector<stbi_uc>& bytes) {
  // stb takes a file for a JPEG when its first marker is SOI: FF D8, after any number of FF
  // fill bytes (stbi__get_marker skips them).
  size_t soi = 0;
  while (soi < bytes.size() && bytes[soi] == 0xFF) ++soi;
  if (soi == 0 || soi >= bytes.size() || bytes[soi] != 0xD8) return true;
  const auto at = [&](size_t i) -> int { return i < bytes.size() ? bytes[i] : 0; };
  for (size_t marker = soi + 1; marker + 1 < bytes.size(); ++marker) {
    if (bytes[marker] != 0xFF || bytes[marker + 1] != 0xC4) continue;
    int remaining = (at(marker + 2) << 8 | at(marker + 3)) - 2;
    size_t i = marker + 4;
    while (remaining > 0) {
      const int table = at(i++);
      if ((table >> 4) > 1 || (table & 15) > 3) break;  // stb refuses the file here
      int codes = 0;
      for (int length = 0; length < 16; ++length) codes += at(i++);
      if (codes > 256) return false;
      i += static_cast<size_t>(codes);
      remaining -= 17 + codes;
    }
  }
  return true;
}

// Whether every scan of a JPEG uses only Huffman tables defined before it, walking the file's
// markers as stbi__decode_jpeg_header and stbi__decode_jpeg_image do: segments by their lengths,
// a scan's entropy-coded data up to the next marker that is not a restart (FF 00 is a stuffed
// byte). A baseline scan decodes with its components' DC and AC tables; a progressive one with
// the DC tables (first DC scan) or the AC tables (AC scans) only. Where the walk meets what stb
// would refuse, it stops and leaves the verdict to stb. True for any other format.
bool jpeg_scans_use_defined_tables(const std::vector<stbi_uc>& bytes) {
  size_t at = 0;
  while (at < bytes.size() && bytes[at] == 0xFF) ++at;
  if (at == 0 || at >= bytes.size() || bytes[at] != 0xD8) return true;
  ++at;
  const auto u8 = [&](size_t i) -> int { return i < bytes.size() ? bytes[i] : 0; };
  const auto u16 = [&](size_t i) { return u8(i) << 8 | u8(i + 1); };
  bool defined[2][4] = {};  // [DC, AC][table id]
  int frame = 0;            // the SOF marker seen: 0xC0, 0xC1 or 0xC2
  int component_ids[4] = {-1, -1, -1, -1};
  while (at + 1 < bytes.size()) {
    if (bytes[at] != 0xFF) {  // stb skips a stray byte where it expects a marker
      ++at;
      continue;
    }
    while (at < bytes.size() && bytes[at] == 0xFF) ++at;  // fill bytes
    if (at >= bytes.size()) break;
    const int marker = bytes[at++];
    if (marker == 0xD9) break;  // EOI
    const size_t segment = at;
    const int length = u16(segment);
    if (length < 2) return true;
    at = segment + static_cast<size_t>(length);
    if (marker == 0xC4) {  // DHT
      size_t i = segment + 2;
      while (i < at) {
        const int table = u8(i);
        if ((table >> 4) > 1 || (table & 15) > 3) return true;
        int codes = 0;
        for (int k = 1; k <= 16; ++k) codes += u8(i + static_cast<size_t>(k));
        defined[table >> 4][table & 15] = true;
        i += 17 + static_cast<size_t>(codes);
      }
    } else if (marker >= 0xC0 && marker <= 0xC2) {  // SOF
      frame = marker;
      const int count = u8(segment + 7);
      for (int c = 0; c < count && c < 4; ++c)
        component_ids[c] = u8(segment + 8 + 3 * static_cast<size_t>(c));
    } else if (marker == 0xDA) {  // SOS
      if (frame == 0) return true;
      const int count = u8(segment + 2);
      if (count < 1 || count > 4) return true;
      const size_t after = segment + 3 + 2 * static_cast<size_t>(count);
      const int spectral_start = u8(after), successive_high = u8(after + 2) >> 4;
      const bool progressive = frame == 0xC2;
      const bool uses_dc = !progressive || (spectral_start == 0 && successive_high == 0);
      const bool uses_ac = !progressive || spectral_start > 0;
      for (int c = 0; c < count; ++c) {
        const size_t selector = segment + 3 + 2 * static_cast<size_t>(c);
        if (std::find(std::begin(component_ids), std::end(component_ids), u8(selector)) ==
            std::end(component_ids))
          return true;  // stb refuses a scan of a component the frame does not have
        const int tables = u8(selector + 1);
        if ((tables >> 4) > 3 || (tables & 15) > 3) return true;
        if ((uses_dc && !defined[0][tables >> 4]) || (uses_ac && !defined[1][tables & 15]))
          return false;
      }
      while (at + 1 < bytes.size() &&
             !(bytes[at] == 0xFF && bytes[at + 1] != 0 && bytes[at + 1] != 0xFF &&
               (bytes[at + 1] < 0xD0 || bytes[at + 1] > 0xD7)))
        ++at;
    }
  }
  return true;
}

// Walks a PNG's chunks as stbi__parse_png_file does (length, type, data, CRC) up to IEND, takes
// out the empty IDAT chunks, and returns false if an IDAT chunk claims more bytes than the file
// holds after it. Leaves any other file as it is (and returns true).
bool tidy_png_data_chunks(std::vector<stbi_uc>& bytes) {
  static constexpr stbi_uc kSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() < sizeof kSignature ||
      !std::equal(std::begin(kSignature), std::end(kSignature), bytes.begin()))
    return true;
  const auto is_type = [&](size_t at, const char* type) {
    return std::equal(type, type + 4, bytes.begin() + static_cast<std::ptrdiff_t>(at));
  };
  size_t at = sizeof kSignature;
  while (at + 8 <= bytes.size() && !is_type(at + 4, "IEND")) {
    const uint64_t length = uint64_t{bytes[at]} << 24 | uint64_t{bytes[at + 1]} << 16 |
                            uint64_t{bytes[at + 2]} << 8 | bytes[at + 3];
    const bool data = is_type(at + 4, "IDAT");
    if (data && length > bytes.size() - (at + 8)) return false;
    if (data && length == 0) {
      const auto chunk = bytes.begin() + static_cast<std::ptrdiff_t>(at);
      bytes.erase(chunk,
                  chunk + static_cast<std::ptrdiff_t>(std::min<size_t>(12, bytes.size() - at)));
    } else {
      at += 12 + length;
    }
  }
  return true;
}

struct StbiFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

// One decoded file: [C, H, W] and its pixels interleaved (HWC), or what went wrong.
struct Decoded {
  std::unique_ptr<stbi_uc, StbiFree> pixels;
  Shape shape;
  std::string error;
};

Decoded decode(const std::string& path, int channels) {
  Decoded out;
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    out.error = "cannot open";
    return out;
  }
  const std::streamsize size = file.tellg();
  if (size <= 0 || size > (std::streamsize{1} << 30)) {
    out.error = "cannot decode image: file of " + std::to_string(size) + " bytes";
    return out;
  }
  std::vector<stbi_uc> bytes(static_cast<size_t>(size));
  file.seekg(0);
  if (!file.read(reinterpret_cast<char*>(bytes.data()), size)) {
    out.error = "cannot read";
    return out;
  }
  // Note [Decoding untrusted images]
  if (!pnm_numbers_fit(bytes)) {
    out.error = "cannot decode image: a PNM header number has more than 9 digits";
    return out;
  }
  if (!jpeg_huffman_tables_fit(bytes)) {
    out.error = "cannot decode image: a JPEG Huffman table has more than 256 codes";
    return out;
  }
  if (!jpeg_scans_use_defined_tables(bytes)) {
    out.error = "cannot decode image: a JPEG scan uses a Huffman table the file does not define";
    return out;
  }
  if (!tidy_png_data_chunks(bytes)) {
    out.error = "cannot decode image: a PNG data chunk runs past the end of the file";
    return out;
  }
  const int length = static_cast<int>(bytes.size());
  int width = 0, height = 0, file_channels = 0;
  // stb 2.27's BMP info gives a top-down image's height as it is stored, negative; its loader
  // takes the magnitude.
  if (stbi_info_from_memory(bytes.data(), length, &width, &height, &file_channels) &&
      std::abs(int64_t{width}) * std::abs(int64_t{height}) > kMaxPixels) {
    out.error =
        detail::str("cannot decode image: its header says ", std::abs(int64_t{width}), " x ",
                    std::abs(int64_t{height}), " pixels, over the limit of ", kMaxPixels);
    return out;
  }
  // A 16-bit PNM that needs other channels: stb 2.27 would convert its 16-bit samples as 8-bit
  // ones, past the end of its buffer; it is decoded to 8 bits first, then converted.
  const bool pnm16 = size >= 2 && bytes[0] == 'P' && (bytes[1] == '5' || bytes[1] == '6') &&
                     stbi_is_16_bit_from_memory(bytes.data(), length);
  out.pixels.reset(stbi_load_from_memory(bytes.data(), length, &width, &height, &file_channels,
                                         pnm16 ? 0 : channels));
  if (out.pixels && pnm16 && channels && channels != file_channels)  // frees its input
    out.pixels.reset(stbi__convert_format(out.pixels.release(), file_channels, channels,
                                          static_cast<unsigned>(width),
                                          static_cast<unsigned>(height)));
  if (!out.pixels) {
    out.error = std::string("cannot decode image: ") + stbi_failure_reason();
    return out;
  }
  if (width <= 0 || height <= 0) {  // stb decodes a PNM header of "5 0" to no pixels
    out.pixels.reset();
    out.error = detail::str("cannot decode image: it has ", width, " x ", height, " pixels");
    return out;
  }
  out.shape = {channels ? channels : file_channels, height, width};
  return out;
}

// HWC -> CHW.
void to_planes(const stbi_uc* hwc, const Shape& shape, uint8_t* chw) {
  const int64_t c_count = shape[0], hw = shape[1] * shape[2];
  for (int64_t c = 0; c < c_count; ++c)
    for (int64_t p = 0; p < hw; ++p) chw[c * hw + p] = hwc[p * c_count + c];
}

}  // namespace

struct ImageFolder::Loaded {
  ImagesAndLabels split;
  std::vector<std::string> classes;
  std::vector<std::string> files;
};

namespace {

std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  try {
    return {fs::directory_iterator(dir), fs::directory_iterator()};
  } catch (const fs::filesystem_error& e) {
    throw IOError(detail::str("ImageFolder: ", dir.string(), ": cannot list: ", e.what()));
  }
}

}  // namespace

ImageFolder::Loaded ImageFolder::load(const std::string& dir, int channels) {
  LOOM_CHECK(channels >= 0 && channels <= 4, ValueError,
             "ImageFolder: expected channels 0 (as in the files), 1, 2, 3 or 4; got ", channels);
  LOOM_CHECK(fs::is_directory(dir), IOError, "ImageFolder: ", dir, ": no such directory");
  Loaded loaded;
  for (const fs::directory_entry& entry : list_dir(dir))
    if (entry.is_directory() && !is_hidden(entry.path()))
      loaded.classes.push_back(entry.path().filename().string());
  std::sort(loaded.classes.begin(), loaded.classes.end());
  LOOM_CHECK(!loaded.classes.empty(), IOError, "ImageFolder: ", dir,
             ": no class folders (expected one sub-folder of images per class)");

  std::vector<int64_t> labels;
  for (size_t k = 0; k < loaded.classes.size(); ++k) {
    const fs::path folder = fs::path(dir) / loaded.classes[k];
    std::vector<std::string> paths;
    for (const fs::directory_entry& entry : list_dir(folder))
      if (entry.is_regular_file() && !is_hidden(entry.path()) && is_image_file(entry.path()))
        paths.push_back(entry.path().string());
    LOOM_CHECK(!paths.empty(), IOError, "ImageFolder: ", folder.string(),
               ": no images (expected files ending in .png, .jpg, .jpeg, .bmp, .gif, .tga, "
               ".pgm or .ppm)");
    std::sort(paths.begin(), paths.end());
    for (std::string& path : paths) {
      loaded.files.push_back(std::move(path));
      labels.push_back(static_cast<int64_t>(k));
    }
  }

  const int64_t n = static_cast<int64_t>(loaded.files.size());
  Decoded first = decode(loaded.files[0], channels);
  LOOM_CHECK(first.error.empty(), IOError, "ImageFolder: ", loaded.files[0], ": ", first.error);
  const Shape shape = first.shape;
  const int64_t image_bytes = shape_numel(shape);
  Tensor images = empty({n, shape[0], shape[1], shape[2]}, kUInt8);
  uint8_t* out = images.data_ptr<uint8_t>();
  to_planes(first.pixels.get(), shape, out);

  std::vector<std::string> errors(static_cast<size_t>(n));
  parallel_for(1, n, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      Decoded image = decode(loaded.files[i], channels);
      if (!image.error.empty()) {
        errors[i] = image.error;
      } else if (image.shape != shape) {
        errors[i] = detail::str("image is ", image.shape, " [C, H, W] but ", loaded.files[0],
                                " is ", shape, "; all images must have the same size and channels",
                                channels ? "" : " (pass channels to convert them)");
      } else {
        to_planes(image.pixels.get(), shape, out + i * image_bytes);
      }
    }
  });
  for (int64_t i = 1; i < n; ++i)
    LOOM_CHECK(errors[i].empty(), IOError, "ImageFolder: ", loaded.files[i], ": ", errors[i]);

  loaded.split = {images, tensor<int64_t>(labels, {n})};
  return loaded;
}

ImageFolder::ImageFolder(const std::string& dir, int channels) : ImageFolder(load(dir, channels)) {}

ImageFolder::ImageFolder(Loaded loaded)
    : TensorDataset(loaded.split.images, loaded.split.labels,
                    static_cast<int64_t>(loaded.classes.size()), "ImageFolder"),
      classes_(std::move(loaded.classes)),
      files_(std::move(loaded.files)) {}

}  // namespace loom::data
