// tests/apps/amp_recipe_slow_test.cpp — the Fashion-MNIST recipe of scripts/run_main.sh with
// --amp bf16 and --amp fp16 ends no more than 0.5 points below float32's test accuracy. Each run
// is the recipe (ResNet-18 width 16, batch 128, SGD nesterov, one-cycle to 0.2, flips) cut to one
// epoch so that the three runs fit a CI job (about 4 minutes each on 2 cores); the two-epoch
// figures are in docs/benchmarks.md. Slow: labelled so, and skipped where the dataset is not
// installed.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "scratch_dir.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";
const std::string kData = "/usr/share/datasets/fashion-mnist";

// The test accuracy of the recipe with --amp `amp`, read from the run's JSON log (-1 when the
// run failed; its output is then printed).
double recipe_accuracy(const std::string& amp) {
  const loom::test::ScratchDir dir(amp);  // Note [Test scratch directories]
  const fs::path log = dir.file("log.jsonl");
  const std::string command = kApp + " --dataset fashion-mnist --data " + kData +
                              " --epochs 1 --batch-size 128 --width 16 --lr 0.2 --momentum 0.9 "
                              "--nesterov --weight-decay 5e-4 --schedule onecycle --amp " +
                              amp + " --log-json " + log.string() + " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run " << command;
    return -1;
  }
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << command << "\n" << output;
    return -1;
  }
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const double accuracy = nlohmann::json::parse(last).at("test_acc").get<double>();
  std::printf("--amp %s: test accuracy %.2f%%\n", amp.c_str(), 100 * accuracy);
  return accuracy;
}

// One test, so that the three runs go one after the other (each uses every core) and the float32
// run serves both comparisons.
TEST(AmpRecipe, BFloat16AndFloat16EndNoMoreThanHalfAPointBelowFloat32) {
  if (!fs::exists(kApp)) GTEST_SKIP() << kApp << " is not built (LOOM_BUILD_APPS=OFF)";
  if (!fs::exists(fs::path(kData) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const double fp32 = recipe_accuracy("off");
  EXPECT_GT(fp32, 0.85);  // the recipe trains
  // One-sided: mixed precision must not cost accuracy. One epoch's accuracy moves by a few
  // tenths of a point with any change of rounding (16-bit layers gave fp16 +0.50 points in
  // session 7, +0.07 before), so a run above float32 is no defect to guard against.
  EXPECT_GT(recipe_accuracy("bf16"), fp32 - 0.005);
  EXPECT_GT(recipe_accuracy("fp16"), fp32 - 0.005);
}

}  // namespace
