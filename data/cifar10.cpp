// data/cifar10.cpp — reads whole CIFAR-10 batch files, checks their size before reading and
// every label after, then splits the records into an image tensor and a label tensor.

#include "data/cifar10.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace loom::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kImageBytes = Cifar10::kRecordBytes - 1;

std::vector<std::string> batch_names(bool train) {
  if (!train) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

ImagesAndLabels read_cifar10(const std::string& dir, bool train, int64_t records_per_file) {
  LOOM_CHECK(records_per_file >= 1, ValueError,
             "read_cifar10: expected records_per_file >= 1; got ", records_per_file);
  const std::vector<std::string> names = batch_names(train);
  // The archive unpacks into cifar-10-batches-bin/: accept its parent as well.
  fs::path root = dir;
  if (!fs::exists(root / names[0]) && fs::exists(root / "cifar-10-batches-bin" / names[0]))
    root /= "cifar-10-batches-bin";

  const int64_t records = records_per_file * static_cast<int64_t>(names.size());
  const uintmax_t file_bytes = static_cast<uintmax_t>(records_per_file * Cifar10::kRecordBytes);
  Tensor images = empty({records, 3, 32, 32}, kUInt8);
  Tensor labels = empty({records}, kInt64);
  uint8_t* image_out = images.data_ptr<uint8_t>();
  int64_t* label_out = labels.data_ptr<int64_t>();
  std::vector<uint8_t> buffer(file_bytes);

  for (size_t f = 0; f < names.size(); ++f) {
    const std::string path = (root / names[f]).string();
    LOOM_CHECK(fs::is_regular_file(path), IOError, "Cifar10: ", path,
               ": no such file (expected the binary version of CIFAR-10: data_batch_1.bin .. "
               "data_batch_5.bin and test_batch.bin)");
    std::error_code error;
    const uintmax_t size = fs::file_size(path, error);
    LOOM_CHECK(!error && size == file_bytes, IOError, "Cifar10: ", path, ": expected ", file_bytes,
               " bytes (", records_per_file, " records of 1 label byte and ", kImageBytes,
               " pixel bytes); got ",
               error ? std::string("unreadable size") : std::to_string(size) + " bytes");
    std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
    LOOM_CHECK(file != nullptr, IOError, "Cifar10: ", path,
               ": cannot open: ", std::strerror(errno));
    const size_t got = std::fread(buffer.data(), 1, buffer.size(), file.get());
    LOOM_CHECK(got == buffer.size(), IOError, "Cifar10: ", path, ": read ", got, " of ",
               buffer.size(), " bytes");

    for (int64_t r = 0; r < records_per_file; ++r) {
      const uint8_t* record = buffer.data() + r * Cifar10::kRecordBytes;
      LOOM_CHECK(record[0] < 10, IOError, "Cifar10: ", path, ": record ", r, " has label ",
                 int{record[0]}, ", outside [0, 10)");
      const int64_t n = static_cast<int64_t>(f) * records_per_file + r;
      label_out[n] = record[0];
      std::memcpy(image_out + n * kImageBytes, record + 1, kImageBytes);
    }
  }
  return {images, labels};
}

Cifar10::Cifar10(const std::string& dir, bool train, int64_t records_per_file)
    : Cifar10(read_cifar10(dir, train, records_per_file)) {}

Cifar10::Cifar10(ImagesAndLabels split)
    : TensorDataset(split.images, split.labels, 10, "Cifar10") {}

}  // namespace loom::data
