// tensor/safetensors.cpp — the safetensors reader and writer. The header is parsed with
// nlohmann::json and checked field by field before any tensor is allocated; tensor bytes are
// read with pread straight into fresh storage. Writes go through a temp file (see the header).
#include "tensor/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tensor/atomic_file.h"
#include "tensor/copy.h"

namespace loom {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors: the format is little-endian and loom copies bytes as they are");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // larger headers are refused
constexpr const char* kMetadataKey = "__metadata__";

const char* format_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return "F64";
    case DType::Float32:
      return "F32";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
    case DType::Int64:
      return "I64";
    case DType::Int32:
      return "I32";
    case DType::UInt8:
      return "U8";
    case DType::Bool:
      return "BOOL";
  }
  LOOM_ASSERT(false, "unknown dtype");
  return "";
}

bool dtype_from_format_name(const std::string& name, DType* dtype) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F64", kFloat64}, {"F32", kFloat32}, {"F16", kFloat16}, {"BF16", kBFloat16},
      {"I64", kInt64},   {"I32", kInt32},   {"U8", kUInt8},    {"BOOL", kBool}};
  for (const auto& [text, value] : kNames) {
    if (name == text) {
      *dtype = value;
      return true;
    }
  }
  return false;
}

// Closes a file descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// ------------------------------------------------------------------------------------ load

template <typename... Args>
[[noreturn]] void load_error(const std::string& path, const Args&... args) {
  throw IOError(detail::str("load_safetensors: '", path, "': ", args...));
}

// Reads exactly n bytes at offset, or raises IOError (a short read means the file shrank).
void read_exact(int fd, void* buffer, uint64_t n, uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(buffer);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    const ssize_t got = ::pread(fd, out, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) load_error(path, "read failed: ", std::strerror(errno));
    if (got == 0) load_error(path, "file ended early (was it truncated while reading?)");
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// A JSON integer that is >= 0 and fits in int64 (shape entries and offsets).
bool read_count(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
  } else {
    return false;
  }
  return *out <= static_cast<uint64_t>(INT64_MAX);
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // relative to the start of the data buffer
};

Entry parse_entry(const std::string& path, const std::string& name, const json& info,
                  uint64_t buffer_bytes) {
  if (!info.is_object()) load_error(path, "entry '", name, "' is not an object: ", info.dump());
  Entry entry{name, kFloat32, {}, 0, 0};

  const auto dtype_it = info.find("dtype");
  if (dtype_it == info.end() || !dtype_it->is_string())
    load_error(path, "tensor '", name, "' has no dtype string");
  if (!dtype_from_format_name(dtype_it->get<std::string>(), &entry.dtype))
    load_error(path, "tensor '", name, "' has unsupported dtype '", dtype_it->get<std::string>(),
               "' (loom reads F64 F32 F16 BF16 I64 I32 U8 BOOL)");

  const auto shape_it = info.find("shape");
  if (shape_it == info.end() || !shape_it->is_array())
    load_error(path, "tensor '", name, "' has no shape list");
  // The product of the non-zero sizes times the itemsize must fit in int64 (loom's strides
  // do, even for an empty tensor); a valid size is at most the buffer's anyway.
  uint64_t extent = itemsize(entry.dtype);
  bool empty_tensor = false;
  for (const json& d : *shape_it) {
    uint64_t size = 0;
    if (!read_count(d, &size))
      load_error(path, "tensor '", name, "' has shape ", shape_it->dump(),
                 "; expected non-negative integers");
    entry.shape.push_back(static_cast<int64_t>(size));
    empty_tensor = empty_tensor || size == 0;
    if (size > 0 && (__builtin_mul_overflow(extent, size, &extent) ||
                     extent > static_cast<uint64_t>(INT64_MAX)))
      load_error(path, "tensor '", name, "' has shape ", shape_it->dump(), ", too large");
  }
  const uint64_t nbytes = empty_tensor ? 0 : extent;

  const auto offsets_it = info.find("data_offsets");
  if (offsets_it == info.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !read_count((*offsets_it)[0], &entry.begin) || !read_count((*offsets_it)[1], &entry.end))
    load_error(path, "tensor '", name, "' has data_offsets ",
               offsets_it == info.end() ? std::string("(missing)") : offsets_it->dump(),
               "; expected a pair of non-negative integers [begin, end]");
  if (entry.end < entry.begin)
    load_error(path, "tensor '", name, "' has data_offsets [", entry.begin, ", ", entry.end,
               "] with end before begin");
  if (entry.end > buffer_bytes)
    load_error(path, "tensor '", name, "' has data_offsets [", entry.begin, ", ", entry.end,
               "] out of range of the ", buffer_bytes, "-byte data buffer");
  if (nbytes != entry.end - entry.begin)
    load_error(path, "tensor '", name, "' of shape ", entry.shape, " and dtype ",
               format_dtype_name(entry.dtype), " needs ", nbytes, " bytes, but its data_offsets [",
               entry.begin, ", ", entry.end, "] span ", entry.end - entry.begin);
  return entry;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) load_error(path, "__metadata__ is not an object: ", value.dump());
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string())
      load_error(path, "__metadata__ value of '", key, "' is not a string: ", item.dump());
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

}  // namespace

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& named) { return named.first == name; });
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  std::string known;
  for (size_t i = 0; i < tensors.size() && i < 20; ++i) {
    if (i) known += ", ";
    known += tensors[i].first;
  }
  if (tensors.size() > 20) known += ", ...";
  throw ValueError(detail::str("safetensors: no tensor named '", name, "'; the file has ",
                               tensors.size(), " tensors: ", known));
}

SafetensorsFile load_safetensors(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) load_error(path, "cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) load_error(path, "cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) load_error(path, "not a regular file");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);

  // Layout: [8-byte little-endian header length N][N bytes of JSON][data buffer].
  if (file_bytes < 8)
    load_error(path, "file is ", file_bytes, " bytes, shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  read_exact(fd.get(), &header_bytes, 8, 0, path);
  if (header_bytes > kMaxHeaderBytes)
    load_error(path, "header length ", header_bytes, " is over the 100 MB limit");
  if (header_bytes > file_bytes - 8)
    load_error(path, "header length ", header_bytes, " exceeds the ", file_bytes - 8,
               " bytes that follow it");
  std::string text(header_bytes, '\0');
  read_exact(fd.get(), text.data(), header_bytes, 8, path);
  const uint64_t buffer_start = 8 + header_bytes;
  const uint64_t buffer_bytes = file_bytes - buffer_start;

  // nlohmann keeps the last of duplicate keys silently; the callback sees them all.
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event,
                                                json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  // nlohmann would stop at a NUL as at the end of input; JSON has no place for one.
  if (text.find('\0') != std::string::npos)
    load_error(path, "header is not valid JSON: it contains a NUL byte");
  json header;
  try {
    header = json::parse(text, note_keys);
  } catch (const json::exception& e) {
    load_error(path, "header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) load_error(path, "header is not a JSON object");
  if (!duplicate.empty()) load_error(path, "header names '", duplicate, "' twice");

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey)
      file.metadata = parse_metadata(path, info);
    else
      entries.push_back(parse_entry(path, name, info, buffer_bytes));
  }

  // Overlaps: sorted by begin, each tensor with bytes must start at or after the furthest end
  // seen so far. Empty tensors occupy no bytes and overlap nothing.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const Entry* furthest = nullptr;
  for (const Entry& entry : entries) {
    if (entry.begin == entry.end) continue;
    if (furthest && entry.begin < furthest->end)
      load_error(path, "tensors '", furthest->name, "' [", furthest->begin, ", ", furthest->end,
                 ") and '", entry.name, "' [", entry.begin, ", ", entry.end, ") overlap");
    if (!furthest || entry.end > furthest->end) furthest = &entry;
  }

  file.tensors.reserve(entries.size());
  for (const Entry& entry : entries) {
    Tensor t = empty(entry.shape, entry.dtype);
    if (entry.end > entry.begin)
      read_exact(fd.get(), t.data(), entry.end - entry.begin, buffer_start + entry.begin, path);
    if (entry.dtype == kBool) {  // any non-zero byte is true; keep bool storage 0 or 1
      auto* bytes = static_cast<uint8_t*>(t.data());
      for (int64_t i = 0; i < t.numel(); ++i) bytes[i] = bytes[i] != 0;
    }
    file.tensors.emplace_back(entry.name, std::move(t));
  }
  return file;
}

// ------------------------------------------------------------------------------------ save

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Check everything before touching the disk.
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(name != kMetadataKey, ValueError, "save_safetensors: '", path,
               "': a tensor cannot be named __metadata__");
    LOOM_CHECK(names.insert(name).second, ValueError, "save_safetensors: '", path, "': the name '",
               name, "' appears twice");
    LOOM_CHECK(t.defined(), ValueError, "save_safetensors: '", path, "': tensor '", name,
               "' is undefined");
  }

  // Header: metadata first, then the tensors in the given order, their data back to back.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", format_dtype_name(t.dtype())},
                    {"shape", t.sizes()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(detail::str("save_safetensors: '", path,
                                 "': names and metadata must be valid UTF-8 (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  const uint64_t header_bytes = text.size();

  AtomicFile file(path, "save_safetensors");
  file.write(&header_bytes, 8);
  file.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    // One tensor at a time: device tensors come to the host one by one, and the file holds
    // row-major bytes whatever the layout (to_device keeps a channels-last one channels-last).
    const Tensor dense = kernels::contiguous(t.is_cpu() ? t : kernels::to_device(t, kCPU));
    if (dense.nbytes()) file.write(dense.data(), dense.nbytes());
  }
  file.commit();
}

}  // namespace loom
