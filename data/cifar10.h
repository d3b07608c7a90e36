// data/cifar10.h — CIFAR-10's binary version (cifar-10-binary.tar.gz): data_batch_1..5.bin hold
// the 50000 training images, test_batch.bin the 10000 test images; each file is 10000 records
// of one label byte (0..9) and 3072 pixel bytes (R, G, B planes of 32 x 32), 30,730,000 bytes.
#pragma once

#include <string>

#include "data/dataset.h"

namespace loom::data {

// The split in `dir` (or in `dir`/cifar-10-batches-bin, as the archive unpacks): images uint8
// [N, 3, 32, 32], labels int64 [N]. A missing file, a file of the wrong size or a label outside
// [0, 10) raises IOError naming the file (and the record). `records_per_file` exists for tests;
// the real files have 10000.
ImagesAndLabels read_cifar10(const std::string& dir, bool train, int64_t records_per_file = 10000);

class Cifar10 : public TensorDataset {
 public:
  static constexpr int64_t kRecordsPerFile = 10000;
  static constexpr int64_t kRecordBytes = 1 + 3 * 32 * 32;

  Cifar10(const std::string& dir, bool train, int64_t records_per_file = kRecordsPerFile);

 private:
  explicit Cifar10(ImagesAndLabels split);
};

}  // namespace loom::data
