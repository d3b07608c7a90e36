// tests/tensor/safetensors_python_test.cpp — loom's safetensors files against the `safetensors`
// Python package itself (tools/safetensors_interop.py): what loom writes, the package loads with
// the same dtypes, shapes, values and metadata; what the package writes (from PyTorch tensors),
// loom loads. Skipped where no Python with torch and the package is found (scripts/setup.sh
// --torch installs both).

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "scratch_dir.h"
#include "test_util.h"

namespace loom {
namespace {

using nlohmann::json;

struct Output {
  int status = -1;
  std::string text;
};

// Runs tools/safetensors_interop.py MODE PATH with the package on PYTHONPATH.
Output interop(const std::string& mode, const std::string& path) {
  const std::string command = std::string("PYTHONPATH=") + LOOM_PYDEPS_DIR + " " +
                              LOOM_TORCH_PYTHON + " " + LOOM_SOURCE_DIR +
                              "/tools/safetensors_interop.py " + mode + " " + path;
  Output out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.text.append(buf, n);
  const int raw = pclose(pipe);
  out.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

class SafetensorsPython : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(LOOM_TORCH_PYTHON).empty()) GTEST_SKIP() << "no Python with torch";
  }
  const test::ScratchDir dir_;  // Note [Test scratch directories]
  const std::string path_ = dir_.file("file.safetensors");
};

TEST_F(SafetensorsPython, ThePackageLoadsWhatLoomWrites) {
  const NamedTensors tensors = {
      {"f32", tensor<float>({1.5f, -2.f, 3.25f, 0.f, 7.f, -0.5f}, {2, 3})},
      {"f64", tensor<double>({0.1, 0.2}, {2})},
      {"f16", tensor<double>({1.0, -0.5, 2048.0}, {3}).to(kFloat16)},
      {"bf16", tensor<double>({1.0, -0.5, 3.0, 256.0}, {2, 2}).to(kBFloat16)},
      {"i64", tensor<int64_t>({-4, 5}, {2})},
      {"i32", tensor<int32_t>({7}, {1})},
      {"u8", tensor<uint8_t>({0, 255, 9}, {3})},
      {"bool", tensor<bool>({true, false}, {2})},
      {"transposed", tensor<float>({0, 1, 2, 3, 4, 5}, {2, 3}).t()},  // written contiguous
  };
  save_safetensors(path_, tensors, {{"model", "resnet18"}, {"epoch", "3"}});
  const Output out = interop("read", path_);
  if (out.status == 3) GTEST_SKIP() << "the safetensors package is missing (setup.sh --torch)";
  ASSERT_EQ(out.status, 0) << out.text;
  const json j = json::parse(out.text);
  EXPECT_EQ(j["metadata"]["model"], "resnet18");
  EXPECT_EQ(j["metadata"]["epoch"], "3");
  const std::map<std::string, std::string> dtype_names = {
      {"f32", "float32"},   {"f64", "float64"}, {"f16", "float16"},
      {"bf16", "bfloat16"}, {"i64", "int64"},   {"i32", "int32"},
      {"u8", "uint8"},      {"bool", "bool"},   {"transposed", "float32"}};
  for (const auto& [name, t] : tensors) {
    const json& e = j["tensors"][name];
    EXPECT_EQ(e["dtype"], dtype_names.at(name)) << name;
    EXPECT_EQ(e["shape"].get<Shape>(), t.sizes()) << name;
    EXPECT_EQ(e["values"].get<std::vector<double>>(), t.to_vector<double>()) << name;
  }
}

TEST_F(SafetensorsPython, LoomLoadsWhatThePackageWrites) {
  const Output out = interop("write", path_);
  if (out.status == 3) GTEST_SKIP() << "the safetensors package is missing (setup.sh --torch)";
  ASSERT_EQ(out.status, 0) << out.text;
  const SafetensorsFile file = load_safetensors(path_);
  EXPECT_EQ(file.metadata.at("writer"), "safetensors");
  const std::map<std::string, std::pair<Shape, DType>> expected = {
      {"f32", {{2, 3}, kFloat32}}, {"f64", {{3}, kFloat64}},  {"f16", {{2, 2}, kFloat16}},
      {"bf16", {{4}, kBFloat16}},  {"i64", {{2, 2}, kInt64}}, {"i32", {{3}, kInt32}},
      {"u8", {{5}, kUInt8}},       {"bool", {{3}, kBool}},    {"scalar", {{}, kFloat32}}};
  ASSERT_EQ(file.tensors.size(), expected.size());
  for (const auto& [name, want] : expected) {
    const Tensor& t = file.at(name);
    EXPECT_EQ(t.sizes(), want.first) << name;
    EXPECT_EQ(t.dtype(), want.second) << name;
    // Values i * 0.5 - 3 cast to the dtype (absolute value for uint8).
    const std::vector<double> got = t.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) {
      double v = static_cast<double>(i) * 0.5 - 3;
      if (want.second == kUInt8) v = std::fabs(v);
      const double cast =
          want.second == kBool ? (v != 0 ? 1.0 : 0.0)
          : (want.second == kInt64 || want.second == kInt32 || want.second == kUInt8)
              ? std::trunc(v)
              : v;
      EXPECT_EQ(got[i], cast) << name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace loom
