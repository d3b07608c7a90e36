// dist/tensorboard.cpp — SummaryWriter and the TFRecord framing (Note [TFRecord framing]).

#include "dist/tensorboard.h"

#include <isa-l/crc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "dist/tensorboard_event.pb.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  // ISA-L's crc32_iscsi takes the register's start value and returns it unfinished: CRC-32C
  // starts from all ones and inverts at the end. It takes an int length: feed it in pieces.
  uint32_t crc = 0xffffffffu;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min<size_t>(n - done, size_t{1} << 30);
    crc = crc32_iscsi(const_cast<unsigned char*>(bytes + done), static_cast<int>(piece), crc);
    done += piece;
  }
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string out;
  const uint64_t length = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  put_u32(out, masked_crc32c(out.data(), 8));
  out += data;
  put_u32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

SummaryWriter::SummaryWriter(const std::string& dir) {
  static std::atomic<int> count{0};
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LOOM_CHECK(!error, IOError, "tensorboard: cannot create '", dir, "': ", error.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = (std::filesystem::path(dir) / detail::str("events.out.tfevents.",
                                                    static_cast<int64_t>(wall_seconds()), ".", host,
                                                    ".", getpid(), ".", count++))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  LOOM_CHECK(file_ != nullptr, IOError, "tensorboard: cannot create '", path_,
             "': ", std::strerror(errno));
  tensorboard::Event event;
  event.set_wall_time(wall_seconds());
  event.set_file_version("brain.Event:2");
  write_event(event.SerializeAsString());
  flush();
}

SummaryWriter::~SummaryWriter() {
  if (file_) std::fclose(file_);
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(wall_seconds());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_event(event.SerializeAsString());
}

void SummaryWriter::write_event(const std::string& bytes) {
  const std::string record = tfrecord(bytes);
  LOOM_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), IOError,
             "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

void SummaryWriter::flush() {
  LOOM_CHECK(std::fflush(file_) == 0, IOError, "tensorboard: cannot write '", path_,
             "': ", std::strerror(errno));
}

}  // namespace loom::dist
