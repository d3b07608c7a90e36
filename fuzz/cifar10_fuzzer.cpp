// fuzz/cifar10_fuzzer.cpp — read_cifar10 (data/cifar10.h) on arbitrary bytes as the test batch
// (test_batch.bin) and, from the archive's folder cifar-10-batches-bin/, as each of the five
// training batches. The records per file are the input's size over 3073 bytes, rounded up, so
// whole records read and anything else is refused for its size.

#include "data/cifar10.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("cifar10");
  using loom::data::Cifar10;
  const std::string_view bytes = loom::fuzz::as_text(data, size);
  const auto records = std::max<int64_t>(
      1, (static_cast<int64_t>(size) + Cifar10::kRecordBytes - 1) / Cifar10::kRecordBytes);
  const auto check = [&](const loom::data::ImagesAndLabels& split, int64_t files) {
    loom::fuzz::require(split.images.sizes() == loom::Shape{files * records, 3, 32, 32} &&
                            split.labels.sizes() == loom::Shape{files * records},
                        "a split holds every record of its files");
    const int64_t* labels = split.labels.data_ptr<int64_t>();
    for (int64_t i = 0; i < split.labels.numel(); ++i)
      loom::fuzz::require(labels[i] >= 0 && labels[i] < 10, "labels are in [0, 10)");
  };

  dir.write("test_batch.bin", bytes);
  loom::fuzz::refusal_is_a_loom_error(
      [&] { check(loom::data::read_cifar10(dir.path().string(), false, records), 1); });

  for (int i = 1; i <= 5; ++i)
    dir.write("cifar-10-batches-bin/data_batch_" + std::to_string(i) + ".bin", bytes);
  loom::fuzz::refusal_is_a_loom_error(
      [&] { check(loom::data::read_cifar10(dir.path().string(), true, records), 5); });
  return 0;
}
