// data/idx.cpp — IDX files through zlib's gz* functions, which read gzip and plain files alike.

#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "tensor/view.h"

namespace loom::data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads exactly n bytes or raises IOError saying how many were expected and where.
void read_exactly(gzFile file, void* dst, size_t n, const std::string& path, const char* what) {
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(file, static_cast<char*>(dst) + done, chunk);
    if (got <= 0) {
      int err = 0;
      const char* msg = gzerror(file, &err);
      throw IOError(detail::str("read_idx: ", path, ": truncated ", what, " (expected ", n,
                                " bytes, got ", done, ")",
                                err != Z_OK && err != Z_BUF_ERROR ? std::string("; ") + msg : ""));
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  LOOM_CHECK(std::filesystem::is_regular_file(path), IOError, "read_idx: ", path, ": no such file");
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  LOOM_CHECK(file != nullptr, IOError, "read_idx: ", path, ": cannot open");
  unsigned char magic[4];
  read_exactly(file.get(), magic, 4, path, "header");
  LOOM_CHECK(magic[0] == 0 && magic[1] == 0, IOError, "read_idx: ", path,
             ": not an IDX file (the magic number must start with two zero bytes)");
  LOOM_CHECK(magic[2] == 0x08, IOError, "read_idx: ", path,
             ": expected unsigned bytes (type 0x08); got type 0x", std::hex,
             static_cast<int>(magic[2]));
  const int ndims = magic[3];
  LOOM_CHECK(ndims >= 1 && ndims <= 8, IOError, "read_idx: ", path, ": invalid number of dims ",
             ndims);
  Shape shape(ndims);
  for (int d = 0; d < ndims; ++d) {
    unsigned char be[4];
    read_exactly(file.get(), be, 4, path, "dims");
    shape[d] = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | be[3];
  }
  // The dims are checked before anything is allocated (found by fuzzing, fuzz/idx_fuzzer.cpp):
  // their product, zeros taken as 1 (what the strides span), stays under 2^34, so it cannot
  // overflow; and the elements must fit in what the file can hold, its bytes or, gzipped, 1032
  // times as many (deflate's largest expansion), so a 20-byte header cannot allocate gigabytes.
  int64_t extent = 1;
  for (const int64_t size : shape) {
    LOOM_CHECK(std::max<int64_t>(size, 1) < (int64_t{1} << 34) / extent, IOError,
               "read_idx: ", path, ": implausible shape ", shape);
    extent *= std::max<int64_t>(size, 1);
  }
  const bool no_elements = std::find(shape.begin(), shape.end(), 0) != shape.end();
  const int64_t numel = no_elements ? 0 : extent;
  std::error_code error;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  LOOM_CHECK(!error, IOError, "read_idx: ", path, ": cannot read its size: ", error.message());
  const bool compressed = gzdirect(file.get()) == 0;
  constexpr int64_t kMaxDeflateExpansion = 1032;
  LOOM_CHECK(numel <= (compressed ? kMaxDeflateExpansion : 1) * file_bytes, IOError,
             "read_idx: ", path, ": shape ", shape, " needs ", numel, " bytes of elements; the ",
             file_bytes, "-byte file", compressed ? " (gzip)" : "", " cannot hold them");
  Tensor out = empty(shape, kUInt8);
  read_exactly(file.get(), out.data(), static_cast<size_t>(numel), path, "data");
  char extra;
  LOOM_CHECK(gzread(file.get(), &extra, 1) == 0, IOError, "read_idx: ", path,
             ": trailing bytes after ", numel, " elements of shape ", shape);
  return out;
}

ImagesAndLabels read_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  auto find = [&](const std::string& stem) {
    for (const char* ext : {"-ubyte.gz", "-ubyte"}) {
      std::string path = prefix + stem + ext;
      if (std::filesystem::exists(path)) return path;
    }
    throw IOError(detail::str("read_mnist: ", prefix, stem, "-ubyte.gz not found in ", dir));
  };
  Tensor images = read_idx(find("-images-idx3"));
  Tensor labels8 = read_idx(find("-labels-idx1"));
  LOOM_CHECK(images.dim() == 3 && labels8.dim() == 1 && images.size(0) == labels8.size(0), IOError,
             "read_mnist: ", dir, ": expected images [N, H, W] and labels [N]; got ",
             images.sizes(), " and ", labels8.sizes());
  Tensor labels = empty({labels8.size(0)}, kInt64);
  const uint8_t* src = labels8.data_ptr<uint8_t>();
  for (int64_t i = 0; i < labels8.numel(); ++i) {
    LOOM_CHECK(src[i] < 10, IOError, "read_mnist: ", dir, ": label ", int{src[i]}, " of sample ", i,
               " is outside [0, 10)");
    labels.data_ptr<int64_t>()[i] = src[i];
  }
  return {images, labels};
}

FashionMnist::FashionMnist(const std::string& dir, bool train)
    : FashionMnist(read_mnist(dir, train)) {}

FashionMnist::FashionMnist(ImagesAndLabels split)
    : TensorDataset(kernels::unsqueeze(split.images, 1), split.labels, 10, "FashionMnist") {}

}  // namespace loom::data
