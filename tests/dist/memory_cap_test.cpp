// tests/dist/memory_cap_test.cpp — a device's memory cap in the training programs (Note [Device
// memory cap] in tensor/memory_limit.h, Note [Out of memory in training] in
// dist/memory_report.h): the demonstration, a GPT whose model states exceed the cap on
// one rank stopping under DDP on 4 ranks with the error that says why and what to change, and
// training under ZeRO-3 on 4 ranks within the same cap; --max-memory and LOOM_MAX_MEMORY, their
// bad sizes, and a cap too small for anything, each exiting with status 2.

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "scratch_dir.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kGptTrain = std::string(LOOM_BINARY_DIR) + "/apps/gpt_train";
const std::string kResnet = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";

// A GPT of 1.59 million parameters (8 blocks of 128 channels) on short windows, so that its
// model states dominate a rank's memory: with AdamW in float32, 16 bytes a parameter, 24.31 MiB a
// rank under DDP and a quarter of it, 6.08 MiB, under ZeRO-3 on 4 ranks. Measured on these
// runs: DDP needs between 26 and 27 MiB, ZeRO-3 (with its gathered units and the evaluation's
// whole model) between 14 and 14.5 MiB; the cap of 20 MiB stands well between them.
const std::string kGpt =
    " --layers 8 --heads 4 --embd 128 --block 16 --batch-size 2 --iters 2 --eval-every 2"
    " --eval-iters 2 --log-every 1 --threads 1 --no-sample --warmup 1 ";

class MemoryCap : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& app : {kGptTrain, kResnet})
      if (!fs::exists(app)) GTEST_SKIP() << app << " is not built";
    std::ofstream text(path("text.txt"));
    for (int i = 0; i < 200; ++i) text << "The quick brown fox " << i << " jumps over the dog.\n";
  }
  std::string path(const std::string& name) const { return dir_.file(name); }
  std::string gpt() const { return kGptTrain + " --data " + path("text.txt") + kGpt; }

  // Runs `command` (with its environment first, if any); its exit status, its output in `out`.
  int run(const std::string& command, std::string* out) const {
    const std::string log = path("run.log");
    const int status = std::system((command + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    *out = s.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  loom::test::ScratchDir dir_;
};

void expect_contains(const std::string& out, const std::string& fragment) {
  EXPECT_NE(out.find(fragment), std::string::npos) << "no '" << fragment << "' in:\n" << out;
}

TEST_F(MemoryCap, DdpStopsOverTheCapAndZero3TrainsWithinItOnFourRanks) {
  std::string out;
  // DDP: every rank holds all 24.31 MiB of model states; the optimizer's state does not fit.
  ASSERT_EQ(run(gpt() + "--nproc 4 --max-memory 20MiB", &out), 2) << out;
  expect_contains(out, "gpt_train: out of memory on cpu: allocating ");
  expect_contains(out, "for the optimizer state of AdamW would take loom's tensors on cpu to ");
  expect_contains(out, "over the cap of 20.00 MiB (--max-memory)");
  expect_contains(out, "Nothing was allocated.");
  expect_contains(out,
                  "held on cpu by kind: weights 6.08 MiB, gradients 6.08 MiB (in 2 DDP "
                  "buckets), optimizer state ");
  expect_contains(out, "needed: under DDP on 4 ranks the model states come to 24.31 MiB a rank");
  expect_contains(out,
                  "over the cap of 20.00 MiB\nadvice: the model states alone do not fit: "
                  "shard them (ZeRO-2 (--zero 2) keeps 10.64 MiB a rank on 4, ZeRO-3 "
                  "(--zero 3) keeps 6.08 MiB a rank on 4)");
  EXPECT_EQ(out.find("step 1:"), std::string::npos) << "DDP took a step:\n" << out;

  // ZeRO-3 on the same 4 ranks and the same cap: a quarter of the model states each, and it
  // trains (the step, the evaluation with the whole model gathered, the end).
  ASSERT_EQ(run(gpt() + "--nproc 4 --max-memory 20MiB --zero 3 --print-memory", &out), 0) << out;
  expect_contains(out, "memory after the second step on cpu, ZeRO-3 over 4 rank(s)");
  expect_contains(out, "  model states          6.08      6.08");
  expect_contains(out, "step 2: train loss");
  EXPECT_EQ(out.find("out of memory"), std::string::npos) << out;
}

TEST_F(MemoryCap, TheVariableCapsEveryRankAsTheFlagDoes) {
  std::string out;
  ASSERT_EQ(run("LOOM_MAX_MEMORY=20MiB " + gpt() + "--nproc 4", &out), 2) << out;
  expect_contains(out, "over the cap of 20.00 MiB (LOOM_MAX_MEMORY)");
  expect_contains(out, "needed: under DDP on 4 ranks the model states come to 24.31 MiB a rank");
  // The flag overrides the variable on the job's device.
  ASSERT_EQ(run("LOOM_MAX_MEMORY=1MiB " + gpt() + "--nproc 4 --zero 3 --max-memory 20MiB", &out), 0)
      << out;
}

TEST_F(MemoryCap, BadSizesAndACapTooSmallForAnythingExitWithTwoAndWriteNothing) {
  struct Bad {
    std::string command, fragments[2];
  };
  const std::string dir = " --checkpoint-dir " + path("bad");
  const Bad cases[] = {
      {gpt() + "--max-memory 2XB", {"--max-memory='2XB': unknown unit 'XB'", "2GiB, 512MiB"}},
      {gpt() + "--max-memory -1GiB", {"--max-memory='-1GiB'", "cannot be negative"}},
      {"LOOM_MAX_MEMORY=lots " + gpt(), {"LOOM_MAX_MEMORY='lots': expected a number", "1.5GB"}},
      {gpt() + "--max-memory 64KiB", {"out of memory on cpu", "(--max-memory)"}},
      {"LOOM_MAX_MEMORY=64KiB " + gpt(), {"out of memory on cpu", "(LOOM_MAX_MEMORY)"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.command);
    std::string out;
    EXPECT_EQ(run(c.command + dir, &out), 2) << out;
    for (const std::string& fragment : c.fragments) expect_contains(out, fragment);
    EXPECT_FALSE(fs::exists(path("bad"))) << "a failed run wrote " << path("bad");
  }
}

// resnet18_cifar over its cap in the step: the breakdown and the activations' advice.
TEST_F(MemoryCap, ResnetSaysTheActivationsDoNotFit) {
  std::string out;
  ASSERT_EQ(
      run(kResnet + " --dataset synthetic --synthetic-size 64 --width 4 --workers 1 --threads 1 "
                    "--epochs 1 --max-steps 2 --batch-size 16 --max-memory 4MiB",
          &out),
      2)
      << out;
  expect_contains(out, "resnet18_cifar: out of memory on cpu: allocating ");
  expect_contains(out, "in the forward of ");
  expect_contains(out, "over the cap of 4.00 MiB (--max-memory)");
  expect_contains(out, "held on cpu by kind: weights 174.30 KiB");
  expect_contains(out, "needed: in one process the model states come to 522.91 KiB a rank");
  expect_contains(out,
                  "within the cap of 4.00 MiB\nadvice: the model states fit; the rest is "
                  "activations and temporaries, which grow with the batch: a smaller "
                  "--batch-size");
}

}  // namespace
