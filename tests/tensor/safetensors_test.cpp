// tests/tensor/safetensors_test.cpp — the safetensors reader and writer: round trips of every
// dtype and of metadata, every malformed file the reader must refuse (built byte by byte here),
// atomic saves, and a file written by Python (tests/golden/dtypes.safetensors).
#include "tensor/safetensors.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "scratch_dir.h"
#include "tensor/accelerator.h"
#include "tensor/atomic_file.h"
#include "test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::tensors_close;
using test::values_are;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  const test::ScratchDir scratch_;  // Note [Test scratch directories]
  const fs::path dir_ = scratch_.path();
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string u64_le(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

// A safetensors file by hand: the header's length (its true length unless given), the header,
// then `buffer` bytes of data.
std::string raw_file(const std::string& header, size_t buffer_bytes,
                     std::optional<uint64_t> declared_length = std::nullopt) {
  return u64_le(declared_length.value_or(header.size())) + header +
         std::string(buffer_bytes, '\x01');
}

// The bytes of a tensor in row-major order.
std::string tensor_bytes(const Tensor& t) {
  const Tensor dense = t.contiguous();
  return std::string(static_cast<const char*>(dense.data()), dense.nbytes());
}

// --------------------------------------------------------------------------- round trips

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  const Tensor values = randn({2, 3}, kFloat64);
  const NamedTensors saved = {
      {"f64", values},
      {"f32", randn({3, 1, 2}, kFloat32)},
      {"f16", values.to(kFloat16)},
      {"bf16", values.to(kBFloat16)},
      {"i64", tensor<int64_t>({-5, 0, 7, INT64_MAX}, {2, 2})},
      {"i32", tensor<int32_t>({-1, 2, INT32_MIN}, {3})},
      {"u8", tensor<uint8_t>({0, 1, 128, 255}, {4})},
      {"bool", tensor<bool>({true, false, false, true, true}, {5})},
      {"scalar", scalar_tensor(3.5, kFloat64)},
      {"empty", zeros({0, 4}, kFloat32)},
  };
  save_safetensors(file("all.safetensors"), saved);
  const SafetensorsFile loaded = load_safetensors(file("all.safetensors"));

  ASSERT_EQ(loaded.tensors.size(), saved.size());
  EXPECT_TRUE(loaded.metadata.empty());
  for (size_t i = 0; i < saved.size(); ++i) {
    SCOPED_TRACE(saved[i].first);
    EXPECT_EQ(loaded.tensors[i].first, saved[i].first);  // file order = the order given
    const Tensor& t = loaded.tensors[i].second;
    EXPECT_EQ(t.dtype(), saved[i].second.dtype());
    EXPECT_EQ(t.sizes(), saved[i].second.sizes());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(tensor_bytes(t), tensor_bytes(saved[i].second));
  }
  EXPECT_TRUE(loaded.contains("bf16"));
  EXPECT_FALSE(loaded.contains("f8"));
  EXPECT_TRUE(tensors_close(loaded.at("f64"), values, 0, 0));
  EXPECT_LOOM_ERROR(loaded.at("f8"), ValueError, {"no tensor named 'f8'", "f64", "bf16"});
}

TEST_F(SafetensorsTest, SavesViewsAsTheirValues) {
  const Tensor base = arange(0, 24, 1, kFloat32).reshape({4, 6});
  const Tensor transposed = base.transpose(0, 1);  // strides [1, 6]
  const Tensor sliced = base.slice(1, 1, 5, 2);    // offset 1, a gap between elements
  const Tensor expanded = base.select(0, 2).unsqueeze(0).expand({3, 6});  // stride 0
  save_safetensors(file("views.safetensors"),
                   {{"transposed", transposed}, {"sliced", sliced}, {"expanded", expanded}});
  const SafetensorsFile loaded = load_safetensors(file("views.safetensors"));
  EXPECT_TRUE(tensors_close(loaded.at("transposed"), transposed, 0, 0));
  EXPECT_TRUE(tensors_close(loaded.at("sliced"), sliced, 0, 0));
  EXPECT_TRUE(tensors_close(loaded.at("expanded"), expanded, 0, 0));
  EXPECT_EQ(loaded.at("sliced").sizes(), (Shape{4, 2}));
}

TEST_F(SafetensorsTest, RoundTripsMetadata) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"empty", ""},
      {"step", "1200"},
      {"quote \" and \\ backslash", "line\nbreak"},
      {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}};
  save_safetensors(file("meta.safetensors"), {{"w", ones({2}, kFloat32)}}, metadata);
  const SafetensorsFile loaded = load_safetensors(file("meta.safetensors"));
  EXPECT_EQ(loaded.metadata, metadata);
  ASSERT_EQ(loaded.tensors.size(), 1u);

  // No tensors at all is a valid file too.
  save_safetensors(file("only_meta.safetensors"), {}, {{"k", "v"}});
  const SafetensorsFile bare = load_safetensors(file("only_meta.safetensors"));
  EXPECT_TRUE(bare.tensors.empty());
  EXPECT_EQ(bare.metadata.at("k"), "v");
}

TEST_F(SafetensorsTest, WritesThePythonLayout) {
  save_safetensors(file("layout.safetensors"),
                   {{"b", zeros({3}, kFloat32)}, {"a", zeros({2}, kFloat64)}}, {{"k", "v"}});
  const std::string bytes = read_bytes(file("layout.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);  // padded so that the data starts 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + header_bytes + 3 * 4 + 2 * 8);
  const std::string header = bytes.substr(8, header_bytes);
  EXPECT_EQ(header.front(), '{');
  const size_t last = header.find_last_not_of(' ');  // spaces after the JSON, fewer than 8
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header_bytes - 1 - last, 8u);
  // Metadata first, then the tensors in the given order with their data back to back.
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"k\":\"v\"},", 0), 0u) << header;
  EXPECT_NE(header.find("\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find("\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[12,28]}"),
            std::string::npos)
      << header;
}

TEST_F(SafetensorsTest, AcceptsGapsPaddingAndEmptyTensors) {
  // A gap of 4 bytes before "a", empty tensors (one inside a's bytes: it occupies none),
  // trailing spaces, unknown keys in an entry (ignored), and an empty __metadata__.
  const std::string header =
      R"({"__metadata__":{},"z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
      R"("y":{"dtype":"F64","shape":[3,0],"data_offsets":[8,8]},)"
      R"("a":{"dtype":"I32","shape":[2],"data_offsets":[4,12],"note":"x"}}   )";
  std::string bytes = raw_file(header, 0);
  bytes += std::string(4, '\0') + std::string("\x05\x00\x00\x00\xff\xff\xff\xff", 8);
  write_bytes(file("gaps.safetensors"), bytes);
  const SafetensorsFile loaded = load_safetensors(file("gaps.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), 3u);
  EXPECT_EQ(loaded.tensors[0].first, "z");  // ordered by where the data lies
  EXPECT_EQ(loaded.tensors[1].first, "a");
  EXPECT_EQ(loaded.at("z").sizes(), (Shape{0}));
  EXPECT_EQ(loaded.at("y").sizes(), (Shape{3, 0}));
  EXPECT_TRUE(values_are(loaded.at("a"), {5, -1}));
}

TEST_F(SafetensorsTest, NormalisesBoolBytes) {
  const std::string header = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  write_bytes(file("bool.safetensors"), raw_file(header, 0) + std::string("\x00\x02\xff", 3));
  const Tensor m = load_safetensors(file("bool.safetensors")).at("m");
  EXPECT_EQ(m.dtype(), kBool);
  const auto* bytes = static_cast<const uint8_t*>(m.data());
  EXPECT_EQ(bytes[0], 0);
  EXPECT_EQ(bytes[1], 1);
  EXPECT_EQ(bytes[2], 1);
}

// ----------------------------------------------------------------------- malformed files

// The reader refuses `bytes` with IOError naming the file and containing `fragment`.
void expect_refused(const std::string& path, const std::string& bytes,
                    const std::string& fragment) {
  SCOPED_TRACE("expecting \"" + fragment + "\"");
  write_bytes(path, bytes);
  EXPECT_LOOM_ERROR(load_safetensors(path), IOError, {"load_safetensors", path, fragment});
}

// One tensor entry with the given JSON fields and a buffer of `buffer` bytes.
std::string one_entry(const std::string& fields, size_t buffer) {
  return raw_file("{\"t\":{" + fields + "}}", buffer);
}

TEST_F(SafetensorsTest, RefusesMissingOrShortFiles) {
  const std::string missing = file("missing.safetensors");
  EXPECT_LOOM_ERROR(load_safetensors(missing), IOError,
                    {"load_safetensors", missing, "cannot open"});
  EXPECT_LOOM_ERROR(load_safetensors(dir_.string()), IOError, {"not a regular file"});
  const std::string path = file("bad.safetensors");
  expect_refused(path, "", "shorter than the 8-byte header length");
  expect_refused(path, std::string(7, '\0'), "file is 7 bytes");
}

TEST_F(SafetensorsTest, RefusesBadHeaderLengths) {
  const std::string path = file("bad.safetensors");
  expect_refused(path, raw_file("{}", 0, 3), "exceeds the 2 bytes");
  expect_refused(path, raw_file("{}", 16, 100), "header length 100 exceeds");
  expect_refused(path, raw_file("{}", 0, uint64_t{1} << 40), "over the 100 MB limit");
  expect_refused(path, raw_file("{}", 0, ~uint64_t{0}), "over the 100 MB limit");
  expect_refused(path, raw_file("", 0), "not valid JSON");
}

TEST_F(SafetensorsTest, RefusesInvalidJson) {
  const std::string path = file("bad.safetensors");
  expect_refused(path, raw_file("{\"t\": ", 0), "not valid JSON");
  expect_refused(path, raw_file("{'t': 1}", 0), "not valid JSON");
  expect_refused(path, raw_file(std::string("{}\0", 3), 0), "NUL byte");
  expect_refused(path, raw_file(std::string("{}\0junk", 7), 0), "NUL byte");
  expect_refused(path, raw_file("[1, 2]", 0), "not a JSON object");
  expect_refused(path, raw_file("\"text\"", 0), "not a JSON object");
  expect_refused(path, raw_file("{\"t\": 3}", 0), "entry 't' is not an object");
  const std::string twice = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_refused(path, raw_file(twice, 2), "names 't' twice");
}

TEST_F(SafetensorsTest, RefusesUnknownDtypes) {
  const std::string path = file("bad.safetensors");
  for (const char* dtype : {"F8_E4M3", "I16", "U64", "f32", "C64", ""})
    expect_refused(
        path,
        one_entry(std::string("\"dtype\":\"") + dtype + "\",\"shape\":[1],\"data_offsets\":[0,1]",
                  8),
        "unsupported dtype '" + std::string(dtype) + "'");
  expect_refused(path, one_entry(R"("dtype":32,"shape":[1],"data_offsets":[0,4])", 4),
                 "tensor 't' has no dtype string");
  expect_refused(path, one_entry(R"("shape":[1],"data_offsets":[0,4])", 4),
                 "tensor 't' has no dtype string");
}

TEST_F(SafetensorsTest, RefusesBadShapes) {
  const std::string path = file("bad.safetensors");
  const std::string offsets = R"(,"data_offsets":[0,8])";
  for (const char* shape :
       {"[-1,2]", "[2.5]", "[2.0]", "[\"2\"]", "[null]", "[[2]]", "[9223372036854775808]"})
    expect_refused(path, one_entry(std::string(R"("dtype":"F32","shape":)") + shape + offsets, 8),
                   "expected non-negative integers");
  expect_refused(path, one_entry(R"("dtype":"F32","shape":2)" + offsets, 8), "no shape list");
  expect_refused(path, one_entry(R"("dtype":"F32")" + offsets, 8), "no shape list");
  // Sizes whose product overflows are refused before anything is allocated, even when
  // another size is zero (loom's strides must fit in int64).
  for (const char* shape :
       {"[4611686018427387904,8]", "[0,4611686018427387904,4]", "[4294967296,4294967296]"})
    expect_refused(
        path,
        one_entry(std::string(R"("dtype":"F64","shape":)") + shape + R"(,"data_offsets":[0,0])", 8),
        "too large");
  // Empty tensors of large (but addressable) extent load.
  write_bytes(path,
              one_entry(R"("dtype":"F64","shape":[0,1099511627776],"data_offsets":[0,0])", 0));
  EXPECT_EQ(load_safetensors(path).at("t").sizes(), (Shape{0, int64_t{1} << 40}));
}

TEST_F(SafetensorsTest, RefusesBadOffsets) {
  const std::string path = file("bad.safetensors");
  const std::string fields = R"("dtype":"F32","shape":[2],"data_offsets":)";
  for (const char* offsets : {"[0]", "[0,8,16]", "[]", "\"0,8\"", "[-8,0]", "[0,8.0]", "[null,8]",
                              "{\"begin\":0,\"end\":8}"})
    expect_refused(path, one_entry(fields + offsets, 8), "expected a pair of non-negative");
  expect_refused(path, one_entry(R"("dtype":"F32","shape":[2])", 8), "data_offsets (missing)");
  expect_refused(path, one_entry(fields + "[0,16]", 8), "out of range of the 8-byte");
  expect_refused(path, one_entry(fields + "[4,12]", 8), "out of range");
  expect_refused(path, one_entry(fields + "[8,0]", 8), "end before begin");
  expect_refused(path, one_entry(fields + "[0,12]", 12), "needs 8 bytes");
  expect_refused(path, one_entry(fields + "[0,4]", 8), "span 4");
  expect_refused(path, one_entry(fields + "[18446744073709551615,8]", 8),
                 "expected a pair of non-negative");
}

TEST_F(SafetensorsTest, RefusesOverlappingTensors) {
  const std::string path = file("bad.safetensors");
  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_refused(path, raw_file(overlap, 12), "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
  const std::string same = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  expect_refused(path, raw_file(same, 4), "overlap");
  // The file's order in the header does not matter: data order does.
  const std::string reversed = R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},)"
                               R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})";
  expect_refused(path, raw_file(reversed, 8), "tensors 'a' [0, 8) and 'b' [6, 8) overlap");
}

TEST_F(SafetensorsTest, RefusesBadMetadata) {
  const std::string path = file("bad.safetensors");
  expect_refused(path, raw_file(R"({"__metadata__":{"step":12}})", 0),
                 "__metadata__ value of 'step' is not a string");
  expect_refused(path, raw_file(R"({"__metadata__":{"a":"x","b":null}})", 0),
                 "__metadata__ value of 'b' is not a string");
  expect_refused(path, raw_file(R"({"__metadata__":{"a":{"b":"c"}}})", 0), "not a string");
  expect_refused(path, raw_file(R"({"__metadata__":["a"]})", 0), "__metadata__ is not an object");
  expect_refused(path, raw_file(R"({"__metadata__":"a"})", 0), "__metadata__ is not an object");
}

TEST_F(SafetensorsTest, RefusesBadTensorsOnSave) {
  const std::string path = file("out.safetensors");
  const Tensor t = zeros({2}, kFloat32);
  EXPECT_LOOM_ERROR(save_safetensors(path, {{"a", t}, {"a", t}}), ValueError,
                    {"save_safetensors", "'a' appears twice"});
  EXPECT_LOOM_ERROR(save_safetensors(path, {{"__metadata__", t}}), ValueError,
                    {"save_safetensors", "__metadata__"});
  EXPECT_LOOM_ERROR(save_safetensors(path, {{"a", Tensor()}}), ValueError,
                    {"save_safetensors", "'a' is undefined"});
  if (cuda_device_count() == 0) {  // a device tensor is copied to the host: here it cannot be
    float storage[2] = {0, 0};
    const Tensor on_gpu = from_blob(storage, {2}, kFloat32, Device(DeviceType::CUDA, 0));
    EXPECT_LOOM_ERROR(save_safetensors(path, {{"a", t}, {"g", on_gpu}}), DeviceError, {"cuda"});
  }
  EXPECT_LOOM_ERROR(save_safetensors(path, {{"bad \xff utf8", t}}), ValueError,
                    {"save_safetensors", "UTF-8"});
  EXPECT_TRUE(listing().empty());  // nothing was written
}

// ------------------------------------------------------------------------------ atomicity

TEST_F(SafetensorsTest, OverwritesAndLeavesNoTemporaryFile) {
  const std::string path = file("model.safetensors");
  save_safetensors(path, {{"w", full({3}, 1.0, kFloat64)}});
  save_safetensors(path, {{"w", full({5}, 2.0, kFloat64)}, {"b", zeros({1})}});
  const SafetensorsFile loaded = load_safetensors(path);
  EXPECT_TRUE(values_are(loaded.at("w"), {2, 2, 2, 2, 2}));
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, FailedSaveLeavesTheOldFile) {
  const std::string path = file("model.safetensors");
  save_safetensors(path, {{"w", full({3}, 1.0, kFloat64)}});
  const std::string before = read_bytes(path);

  // Make the write fail half way: a process file-size limit of 64 KiB against a 1 MiB tensor
  // (write then fails with EFBIG instead of raising SIGXFSZ, which is ignored meanwhile).
  {
    struct rlimit old_limit {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    struct rlimit small = old_limit;
    small.rlim_cur = 64 * 1024;
    auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    std::optional<std::string> error;
    try {
      save_safetensors(path, {{"w", zeros({1 << 18}, kFloat32)}});
    } catch (const IOError& e) {
      error = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::signal(SIGXFSZ, old_handler);
    ASSERT_TRUE(error.has_value()) << "the save should have failed";
    EXPECT_NE(error->find("write failed"), std::string::npos) << *error;
    EXPECT_NE(error->find(path), std::string::npos) << *error;
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, SaveIntoMissingDirectoryRaises) {
  const std::string path = file("no/such/dir/model.safetensors");
  EXPECT_LOOM_ERROR(save_safetensors(path, {{"w", zeros({2})}}), IOError,
                    {"save_safetensors", path, "cannot create a temporary file"});
  EXPECT_LOOM_ERROR(save_safetensors(dir_.string(), {{"w", zeros({2})}}), IOError,
                    {"save_safetensors", "cannot rename"});
  EXPECT_TRUE(listing().empty());
}

TEST_F(SafetensorsTest, LinkAtomicallyGivesAFileASecondName) {
  const std::string epoch = file("epoch-001.safetensors"), last = file("last.safetensors");
  save_safetensors(epoch, {{"w", full({3}, 1.0, kFloat64)}});
  save_safetensors(last, {{"w", full({2}, 7.0, kFloat64)}});  // an older last: replaced
  link_atomically(epoch, last, "checkpoint");
  EXPECT_TRUE(fs::equivalent(epoch, last));  // one file, two names: nothing was copied
  EXPECT_TRUE(values_are(load_safetensors(last).at("w"), {1, 1, 1}));
  // Saving the first name again makes a new file (rename): the second name keeps the old one.
  save_safetensors(epoch, {{"w", full({3}, 2.0, kFloat64)}});
  EXPECT_TRUE(values_are(load_safetensors(last).at("w"), {1, 1, 1}));
  const std::vector<std::string> names{"epoch-001.safetensors", "last.safetensors"};
  EXPECT_EQ(listing(), names);  // no temporary file left

  EXPECT_LOOM_ERROR(link_atomically(file("missing.safetensors"), last, "checkpoint"), IOError,
                    {"checkpoint", "missing.safetensors"});
  EXPECT_TRUE(values_are(load_safetensors(last).at("w"), {1, 1, 1}));
}

TEST_F(SafetensorsTest, ReadersSeeOldOrNewNeverHalf) {
  // A writer alternates between two versions of a file while a reader loads it: every load
  // sees one version whole.
  const std::string path = file("model.safetensors");
  const Tensor a = full({1 << 14}, 1.0, kFloat32), b = full({1 << 15}, 2.0, kFloat32);
  save_safetensors(path, {{"w", a}}, {{"version", "a"}});
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 20; ++i)
      save_safetensors(path, {{"w", i % 2 ? a : b}}, {{"version", i % 2 ? "a" : "b"}});
    done = true;
  });
  int loads = 0;
  while (!done || loads == 0) {
    const SafetensorsFile f = load_safetensors(path);
    const Tensor& expected = f.metadata.at("version") == "a" ? a : b;
    const auto whole = tensors_close(f.at("w"), expected, 0, 0);
    ++loads;
    if (!whole) {
      ADD_FAILURE() << "load " << loads << ": " << whole.message();
      break;
    }
  }
  writer.join();
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

// ------------------------------------------------------------------ a file Python wrote

TEST(SafetensorsGolden, LoadsAFileWrittenByPython) {
  const std::string path = std::string(LOOM_TEST_DATA_DIR) + "/dtypes.safetensors";
  const SafetensorsFile f = load_safetensors(path);
  const std::vector<std::string> order = {"f64", "f32", "f16",  "bf16",  "i64",
                                          "i32", "u8",  "bool", "empty", "scalar"};
  ASSERT_EQ(f.tensors.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(f.tensors[i].first, order[i]);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("generator"), "tools/make_golden.py");

  const std::vector<double> values = {-2.5, -1.0, 0.0, 0.5, 1.25, 3.0};
  const std::pair<const char*, DType> floats[] = {
      {"f64", kFloat64}, {"f32", kFloat32}, {"f16", kFloat16}, {"bf16", kBFloat16}};
  for (const auto& [name, dtype] : floats) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.at(name).dtype(), dtype);
    EXPECT_EQ(f.at(name).sizes(), (Shape{2, 3}));
    EXPECT_TRUE(values_are(f.at(name), values, 0));
  }
  EXPECT_EQ(f.at("i64").dtype(), kInt64);
  EXPECT_TRUE(values_are(f.at("i64"), {-3, -2, -1, 4, 97, 252}, 0));
  EXPECT_EQ(f.at("i32").dtype(), kInt32);
  EXPECT_TRUE(values_are(f.at("i32"), {-3, -2, -1, 4, 97, 252}, 0));
  EXPECT_EQ(f.at("u8").dtype(), kUInt8);
  EXPECT_TRUE(values_are(f.at("u8"), {0, 1, 2, 7, 100, 255}, 0));
  EXPECT_EQ(f.at("bool").dtype(), kBool);
  EXPECT_TRUE(values_are(f.at("bool"), {0, 1, 0, 1, 0, 1}, 0));
  EXPECT_EQ(f.at("empty").sizes(), (Shape{0, 3}));
  EXPECT_EQ(f.at("scalar").sizes(), Shape{});
  EXPECT_EQ(f.at("scalar").item(), 42.0);

  // Written back by loom and read again, the data is the same bytes.
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string copy = dir.file("dtypes_copy.safetensors");
  save_safetensors(copy, f.tensors, f.metadata);
  const SafetensorsFile again = load_safetensors(copy);
  for (size_t i = 0; i < order.size(); ++i)
    EXPECT_EQ(tensor_bytes(again.tensors[i].second), tensor_bytes(f.tensors[i].second));
}

TEST(SafetensorsGolden, EveryGoldenFileLoads) {
  for (const char* name : {"conv2d", "batch_norm", "cross_entropy", "layer_norm", "dtypes"}) {
    SCOPED_TRACE(name);
    const SafetensorsFile f =
        load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/" + name + ".safetensors");
    EXPECT_FALSE(f.tensors.empty());
    EXPECT_EQ(f.metadata.at("generator"), "tools/make_golden.py");
  }
}

}  // namespace
}  // namespace loom
