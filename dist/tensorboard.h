// dist/tensorboard.h — TensorBoard event files: scalars (loss, accuracy, lr, ...) that
// `tensorboard --logdir DIR` plots. A file is a sequence of TFRecords, each an Event protocol
// buffer (dist/tensorboard_event.proto, encoded by libprotobuf); the first holds the file
// version, the others one summary each.
//
// Note [TFRecord framing]
// Each record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data[length] |
//   uint32 masked_crc32c(data)
// with CRC-32C (Castagnoli, the iSCSI polynomial; computed by ISA-L) masked as
//   ((crc >> 15) | (crc << 17)) + 0xa282ead8
// so that a CRC of data that holds CRCs does not look like one. Readers check both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace loom::dist {

// CRC-32C of n bytes ("123456789" gives 0xe3069283).
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);
// One record framed as Note [TFRecord framing] says.
std::string tfrecord(const std::string& data);

class SummaryWriter {
 public:
  // Creates `dir` and in it events.out.tfevents.<seconds>.<host>.<pid>.<n>, and writes its
  // first event. IOError when it cannot.
  explicit SummaryWriter(const std::string& dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();  // what was added is on disk for a reader
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace loom::dist
