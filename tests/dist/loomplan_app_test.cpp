// tests/dist/loomplan_app_test.cpp — the planner against the real run, program to program: for
// DDP and each ZeRO stage at 2 and 4 ranks, loomplan's total for a GPT is within 10% of what
// gpt_train --print-memory measures on rank 0 in the same configuration (its model states plus
// the step's peak above what it holds, Note [The memory report]).

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "scratch_dir.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kBin = std::string(LOOM_BINARY_DIR) + "/apps/";

class LoomplanApp : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* app : {"loomplan", "gpt_train"})
      if (!fs::exists(kBin + app)) GTEST_SKIP() << kBin << app << " is not built";
    std::ofstream text(dir_.file("text.txt"));
    for (int i = 0; i < 300; ++i) text << "The quick brown fox " << i << " jumps over the dog.\n";
  }
  // Runs an app; its exit status, its output in `output`.
  int run(const std::string& app, const std::string& args, std::string* output) const {
    const std::string log = dir_.file("run.log");
    const int status = std::system((kBin + app + " " + args + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    *output = s.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  loom::test::ScratchDir dir_;
};

double number(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stod(m[1]);
}

TEST_F(LoomplanApp, ItsTotalsAreWithinTenPercentOfTheMeasuredPeaks) {
  const std::string model = "--layers 4 --heads 4 --embd 128 --block 64 ";
  const int64_t per_rank = 4;
  for (const int world : {2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE("world " + std::to_string(world) + " stage " + std::to_string(stage));
      std::string out;
      ASSERT_EQ(run("gpt_train",
                    "--data " + dir_.file("text.txt") + " " + model + "--batch-size " +
                        std::to_string(per_rank) + " --iters 2 --eval-every 2 --eval-iters 1 " +
                        "--threads 1 --no-sample --print-memory --nproc " + std::to_string(world) +
                        " --zero " + std::to_string(stage),
                    &out),
                0)
          << out;
      const double vocab = number(out, "vocabulary ([0-9]+)");
      const double states = number(out, "\n  model states +([0-9.]+)");
      const double peak = number(out, "\n  step peak +([0-9.]+)");
      ASSERT_GT(vocab, 0) << out;
      ASSERT_GT(states, 0) << out;
      ASSERT_GE(peak, 0) << out;
      const double measured = states + peak;

      std::string plan;
      ASSERT_EQ(run("loomplan",
                    "--model gpt " + model + "--vocab " + std::to_string(static_cast<int>(vocab)) +
                        " --batch " + std::to_string(per_rank * world) + " --world " +
                        std::to_string(world) + " --precision fp32 --optimizer adamw --memory 1GiB",
                    &plan),
                0)
          << plan;
      const std::string row = stage == 0 ? "DDP" : "ZeRO-" + std::to_string(stage);
      const double planned = number(
          plan, "\n" + row + " +off +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +([0-9.]+)");
      ASSERT_GT(planned, 0) << plan;
      EXPECT_NEAR(planned, measured, 0.1 * measured) << plan << "\nmeasured:\n" << out;
      std::printf("%s on %d ranks: planned %.2f MiB, measured %.2f MiB (%+.1f%%)\n", row.c_str(),
                  world, planned, measured, 100 * (planned - measured) / measured);
    }
  }
}

}  // namespace
