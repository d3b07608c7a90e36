// tests/apps/loomplan_test.cpp — the loomplan program as a user runs it (and through loomrun
// --plan): the table of every strategy with and without activation checkpointing, the
// recommendation and, when nothing fits, what would; a model read from a checkpoint; bad input
// exiting with status 2 and a message that says what is wrong.

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "nn/gpt.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/loomplan";
const std::string kLauncher = std::string(LOOM_BINARY_DIR) + "/apps/loomrun";

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& program, const std::string& args) {
  Result r;
  const std::string command = program + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

const std::string kResNet = " --model resnet18 --width 8 --channels 1 --threads 1 ";
const std::string kGPT =
    " --model gpt --layers 2 --heads 2 --embd 32 --block 16 --vocab 64 --threads 1 ";

// The table's totals (MiB), by "DDP off", "ZeRO-3 on", ...
std::map<std::string, double> totals(const std::string& output) {
  std::map<std::string, double> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string strategy, checkpointing;
    double weights, gradients, state, activations, transient, total;
    if (words >> strategy >> checkpointing >> weights >> gradients >> state >> activations >>
        transient >> total)
      out[strategy + " " + checkpointing] = total;
  }
  return out;
}

class LoomPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kApp)) GTEST_SKIP() << kApp << " is not built";
  }
  loom::test::ScratchDir dir_;
};

TEST_F(LoomPlan, PrintsEveryStrategyAndRecommendsDDPWhenItFits) {
  const Result r = run(kApp, kResNet + "--batch 32 --world 2 --memory 1GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ResNet-18 (width 8, 1 channel, 10 classes, 32x32 images)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("global batch 32 on 2 ranks: 16 a rank"), std::string::npos) << r.output;
  const auto rows = totals(r.output);
  for (const char* row : {"DDP off", "ZeRO-1 off", "ZeRO-2 off", "ZeRO-3 off"})
    EXPECT_EQ(rows.count(row), 1u) << row << "\n" << r.output;
  EXPECT_EQ(rows.count("DDP on"), 0u) << "a ResNet's checkpointed rows are n/a\n" << r.output;
  EXPECT_NE(r.output.find("n/a"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("recommendation: DDP\n"), std::string::npos) << r.output;
  // Sharding saves: each stage needs less for its model states than the one before.
  EXPECT_LT(rows.at("ZeRO-1 off"), rows.at("DDP off"));
}

TEST_F(LoomPlan, AGPTsPlanFollowsTheDecisionTree) {
  // Model states (3 MiB of weights) that dwarf the activations of one sample a rank.
  const std::string wide =
      " --model gpt --layers 4 --heads 2 --embd 128 --block 16 --vocab 64 --threads 1 ";
  Result r = run(kApp, wide + "--batch 8 --world 8 --precision bf16 --memory 1GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("bf16 autocast"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ZeRO-1 and 2 keep a bfloat16 model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("AdamW, K = 8"), std::string::npos) << r.output;
  const auto rows = totals(r.output);
  ASSERT_EQ(rows.size(), 8u) << r.output;
  EXPECT_LT(rows.at("DDP on"), rows.at("DDP off"));  // checkpointing saves activations
  // A device between ZeRO-3 with checkpointing and everything else: that is the advice.
  double others = 1e30;
  for (const auto& [row, total] : rows)
    if (row != "ZeRO-3 on") others = std::min(others, total);
  ASSERT_LT(rows.at("ZeRO-3 on"), others) << r.output;
  const double between = (rows.at("ZeRO-3 on") + others) / 2;
  r = run(kApp, wide + "--batch 8 --world 8 --precision bf16 --memory " +
                    std::to_string(static_cast<int64_t>(between * 1048576)));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("recommendation: ZeRO-3 with activation checkpointing"),
            std::string::npos)
      << r.output;
  // Nothing fits in 64 KiB: it says so, and what would.
  r = run(kApp, kGPT + "--batch 8 --world 2 --memory 64KiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("recommendation: none fits on 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("what would:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more ranks:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a smaller batch:"), std::string::npos) << r.output;
}

TEST_F(LoomPlan, ReadsTheModelFromACheckpoint) {
  loom::nn::GPT gpt({.vocab_size = 64, .block_size = 16, .n_embd = 32, .n_layer = 3, .n_head = 2});
  const std::string path = dir_.file("model.safetensors");
  loom::nn::save_gpt(path, gpt);
  const Result r = run(kApp, "--checkpoint " + path + " --batch 4 --memory 1GiB --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("GPT (3 layers, 2 heads, 32 channels, block 16, vocabulary 64)"),
            std::string::npos)
      << r.output;
  const Result both = run(kApp, "--checkpoint " + path + " --layers 4 --batch 4 --memory 1GiB");
  EXPECT_EQ(both.status, 2) << both.output;
  EXPECT_NE(both.output.find("--layers: the checkpoint says the model's sizes"), std::string::npos)
      << both.output;
}

TEST_F(LoomPlan, LoomrunPlanRunsThePlannerForItsWorld) {
  if (!fs::exists(kLauncher)) GTEST_SKIP() << kLauncher << " is not built";
  Result r = run(kLauncher, "--nproc-per-node 4 --plan" + kResNet + "--batch 32 --memory 1GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("global batch 32 on 4 ranks: 8 a rank"), std::string::npos) << r.output;
  r = run(kLauncher, "--plan" + kResNet + "--batch 32 --world 2 --memory 1GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("on 2 ranks"), std::string::npos) << r.output;
  r = run(kLauncher, "--plan" + kResNet + "--batch 32 --memory 0");
  EXPECT_EQ(r.status, 2) << r.output;
}

TEST_F(LoomPlan, BadInputExitsTwoWithAMessage) {
  const std::string memory = " --memory 1GiB ";
  const std::pair<std::string, std::string> cases[] = {
      {"--batch 8" + memory, "give --model resnet18|gpt"},
      {"--model vgg --batch 8" + memory, "vgg"},
      {kResNet + "--batch 8 --memory 2XB", "unknown unit"},
      {kResNet + "--batch 8 --memory 0", "must be positive"},
      {kResNet + "--batch 10 --world 4" + memory, "does not split evenly over 4 ranks"},
      {kResNet + "--batch 8", "--memory is required"},
      {kResNet + "--memory 1GiB", "--batch is required"},
      {kResNet + "--batch 8 --precision fp8" + memory, "fp8"},
      {kResNet + "--batch 8 --optimizer lamb" + memory, "lamb"},
      {kResNet + "--batch 8 --probe-batches 4 2" + memory, "probe batches"},
      {kGPT + "--embd 30 --heads 4 --batch 8" + memory, "n_embd"},
      {"--checkpoint /nonexistent/model.safetensors --batch 8" + memory, "no such file"},
      {"--model gpt --checkpoint x.safetensors --batch 8" + memory, "not both"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run(kApp, args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
  const Result help = run(kApp, "--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--memory"), std::string::npos) << help.output;
}

}  // namespace
