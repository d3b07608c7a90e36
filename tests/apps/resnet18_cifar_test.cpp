// tests/apps/resnet18_cifar_test.cpp — the resnet18_cifar program as a user runs it: a run cut
// short and resumed gives the same numbers as the run that never stopped; --eval-only reproduces
// the last test accuracy; the JSON log and checkpoints hold what they promise; bad input exits
// with status 2 and a message that says what is wrong, never a crash. Small synthetic runs.

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "apps/checkpoint_updates.h"
#include "dist/tensorboard.h"
#include "scratch_dir.h"
#include "tensor/accelerator.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run_app(const std::string& args) {
  Result r;
  const std::string command = kApp + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

std::vector<json> read_log(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

class App : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kApp)) GTEST_SKIP() << kApp << " is not built (LOOM_BUILD_APPS=OFF)";
  }
  // Under this test's own directory (Note [Test scratch directories]).
  std::string path(const std::string& name) const { return dir_.file(name); }
  loom::test::ScratchDir dir_;
};

const std::string kSmall =
    "--dataset synthetic --synthetic-size 192 --width 4 --batch-size 32 --epochs 2 --workers 1 "
    "--threads 1 ";

TEST_F(App, AResumedRunMatchesTheUninterruptedOne) {
  Result straight = run_app(kSmall + "--log-json " + path("a.json"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const std::vector<json> a = read_log(path("a.json"));
  ASSERT_EQ(a.size(), 2u);

  // Cut after 4 of the 6 steps of epoch 1, then resume from the end-of-run checkpoint.
  Result cut = run_app(kSmall + "--max-steps 4 --checkpoint-dir " + path("ckpt") + " --log-json " +
                       path("b.json"));
  ASSERT_EQ(cut.status, 0) << cut.output;
  EXPECT_NE(cut.output.find("stopped by --max-steps"), std::string::npos) << cut.output;
  ASSERT_TRUE(fs::exists(path("ckpt/last.safetensors")));
  EXPECT_FALSE(fs::exists(path("ckpt/epoch-001.safetensors")));  // epoch 1 never finished
  Result resumed = run_app(kSmall + "--resume " + path("ckpt/last.safetensors") +
                           " --checkpoint-dir " + path("ckpt") + " --log-json " + path("b.json"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const std::vector<json> b = read_log(path("b.json"));
  ASSERT_EQ(b.size(), 3u);  // the cut epoch, its resumed rest, epoch 2
  EXPECT_FALSE(b[0]["complete"].get<bool>());
  EXPECT_EQ(b[0]["steps"], 4);
  // The end of epoch 1 and all of epoch 2 are the same numbers, bit for bit.
  EXPECT_EQ(b[1]["test_loss"], a[0]["test_loss"]);
  EXPECT_EQ(b[1]["test_acc"], a[0]["test_acc"]);
  for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc", "steps"})
    EXPECT_EQ(b[2][key], a[1][key]) << key;
  EXPECT_TRUE(fs::exists(path("ckpt/epoch-001.safetensors")));
  EXPECT_TRUE(fs::exists(path("ckpt/epoch-002.safetensors")));
  // The newest epoch's checkpoint is also last.safetensors: the same file, written once.
  EXPECT_TRUE(fs::equivalent(path("ckpt/epoch-002.safetensors"), path("ckpt/last.safetensors")));

  // The JSON line has every field the issue names.
  for (const char* key :
       {"epoch", "train_loss", "train_acc", "test_loss", "test_acc", "images_per_s", "seconds"})
    EXPECT_TRUE(a[1].contains(key)) << key;
  EXPECT_GT(a[1]["images_per_s"].get<double>(), 0.0);
  // The epoch's peak of tensor memory holds at least one batch of 32 float32 images.
  EXPECT_GT(a[1]["peak_memory_bytes"].get<int64_t>(), 32 * 3 * 32 * 32 * 4);
}

// --amp fp16: the loss scale is logged and checkpointed, so a resumed run continues with the
// scale (and growth count) it stopped with and matches the run that never stopped.
TEST_F(App, AMixedPrecisionRunResumesWithItsLossScale) {
  const std::string amp = kSmall + "--amp fp16 ";
  Result straight = run_app(amp + "--log-json " + path("a.json"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_NE(straight.output.find("mixed precision"), std::string::npos) << straight.output;
  const std::vector<json> a = read_log(path("a.json"));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1]["amp"], "fp16");
  EXPECT_GT(a[1]["loss_scale"].get<double>(), 0.0);

  Result cut = run_app(amp + "--max-steps 4 --checkpoint-dir " + path("ckpt"));
  ASSERT_EQ(cut.status, 0) << cut.output;
  const loom::SafetensorsFile file = loom::load_safetensors(path("ckpt/last.safetensors"));
  EXPECT_TRUE(file.metadata.count("scaler.scale")) << "the loss scale is not checkpointed";
  Result resumed =
      run_app(amp + "--resume " + path("ckpt/last.safetensors") + " --log-json " + path("b.json"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const std::vector<json> b = read_log(path("b.json"));
  ASSERT_EQ(b.size(), 2u);  // the resumed rest of epoch 1, epoch 2
  for (const char* key : {"train_loss", "test_loss", "test_acc", "loss_scale", "steps"})
    EXPECT_EQ(b[1][key], a[1][key]) << key;

  // bf16 needs no scaler: its checkpoint has none, and the run ends with a finite loss.
  Result bf16 = run_app(kSmall + "--amp bf16 --epochs 1 --checkpoint-dir " + path("bf16"));
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_FALSE(
      loom::load_safetensors(path("bf16/last.safetensors")).metadata.count("scaler.scale"));
  // Switching to fp16 from such a checkpoint starts a new loss scale.
  Result switched = run_app(kSmall + "--amp fp16 --resume " + path("bf16/last.safetensors"));
  ASSERT_EQ(switched.status, 0) << switched.output;
  EXPECT_NE(switched.output.find("holds no loss scale"), std::string::npos) << switched.output;
  EXPECT_EQ(run_app(kSmall + "--amp fp8").status, 2);
  EXPECT_EQ(run_app(kSmall + "--comm-dtype fp64").status, 2);
}

// --print-memory (Note [The memory report]): the weights are the parameters' bytes, the
// gradients and SGD's momentum as large; what a step holds beyond them grows with the batch,
// they do not.
TEST_F(App, TheMemoryReportAccountsForTheModelAndGrowsWithTheBatch) {
  const auto report = [&](int batch) {
    Result r = run_app(
        "--dataset synthetic --synthetic-size 128 --width 16 --epochs 1 --workers 1 "
        "--threads 1 --max-steps 2 --print-memory --batch-size " +
        std::to_string(batch));
    EXPECT_EQ(r.status, 0) << r.output;
    std::map<std::string, double> mib;
    for (const char* line : {"weights", "gradients", "optimizer state", "buffers", "other held",
                             "step peak", "cached"}) {
      const std::regex pattern(std::string("\\n  ") + line + " +(-?[0-9.]+)");
      std::smatch m;
      EXPECT_TRUE(std::regex_search(r.output, m, pattern)) << line << "\n" << r.output;
      if (!m.empty()) mib[line] = std::stod(m[1]);
    }
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex("\\(([0-9]+) parameters\\)")));
    if (!m.empty()) mib["parameters"] = std::stod(m[1]);
    return mib;
  };
  std::map<std::string, double> small = report(8), large = report(64);
  EXPECT_NEAR(small["weights"], small["parameters"] * 4 / (1 << 20), 0.006);  // float32
  EXPECT_EQ(small["gradients"], small["weights"]);
  EXPECT_EQ(small["optimizer state"], small["weights"]);  // momentum: one buffer per weight
  EXPECT_GT(small["buffers"], 0);
  EXPECT_GE(small["other held"], 0);
  for (const char* fixed : {"weights", "gradients", "optimizer state", "buffers"})
    EXPECT_EQ(large[fixed], small[fixed]) << fixed;
  EXPECT_GT(large["step peak"], 4 * small["step peak"]);  // 8 times the activations
}

// The flags of apps/common/train_flags.h, on the first optimizer step, read from checkpoints:
// --max-steps 0 writes the initial weights, --max-steps 1 those after one step. Plain SGD
// (cosine schedule: the first step runs at --lr) unless a test says otherwise.
const std::string kStep =
    "--dataset synthetic --synthetic-size 256 --width 4 --epochs 1 --workers 1 --threads 1 "
    "--schedule cosine --lr 0.1 --momentum 0 --weight-decay 0 ";

// Note [Gradient accumulation]: 4 micro-batches of 32 give the step one batch of 128 gives,
// with batch norm frozen (Note [Frozen batch norm]); in training mode each micro-batch is
// normalised with its own statistics, and the two steps differ.
TEST_F(App, AccumulatingFourBatchesOf32IsOneStepOfABatchOf128WithFrozenBatchNorm) {
  using namespace loom::test;
  Result init = run_app(kStep + "--batch-size 128 --max-steps 0 --checkpoint-dir " + path("init"));
  ASSERT_EQ(init.status, 0) << init.output;
  const Parameters before = checkpoint_parameters(path("init/last.safetensors"));
  std::map<std::string, Parameters> updates;
  for (const std::string bn : {"--freeze-bn ", ""})
    for (const bool accumulate : {false, true}) {
      const std::string name = std::string(bn.empty() ? "train_bn_" : "frozen_bn_") +
                               (accumulate ? "accumulated" : "big");
      const std::string batch =
          accumulate ? "--batch-size 32 --accumulate 4 " : "--batch-size 128 ";
      Result r = run_app(kStep + bn + batch + "--max-steps 1 --checkpoint-dir " + path(name));
      ASSERT_EQ(r.status, 0) << r.output;
      const loom::SafetensorsFile file = loom::load_safetensors(path(name + "/last.safetensors"));
      EXPECT_EQ(file.metadata.at("loom.step"), "1") << name;  // steps count optimizer steps
      if (accumulate) {
        EXPECT_NE(r.output.find("effective batch 128"), std::string::npos) << r.output;
        EXPECT_EQ(file.metadata.at("loom.batch"), "4");  // and batches count micro-batches
      }
      updates[name] = update(before, checkpoint_parameters(path(name + "/last.safetensors")));
    }
  EXPECT_GT(norm(updates["frozen_bn_big"]), 1e-4);  // the step moved the weights
  EXPECT_LT(relative_difference(updates["frozen_bn_accumulated"], updates["frozen_bn_big"]), 1e-4);
  EXPECT_GT(relative_difference(updates["train_bn_accumulated"], updates["train_bn_big"]), 1e-2);
}

// --optimizer adam / adamw: the checkpoint holds Adam's moments, made with the betas given:
// after one step m = (1 - beta1) g and v = (1 - beta2) g^2, so m^2 = (1 - beta1)^2 / (1 - beta2) v.
TEST_F(App, AdamAndAdamWKeepTheirMomentsWithTheBetasGiven) {
  for (const std::string optimizer : {"adam", "adamw"}) {
    SCOPED_TRACE(optimizer);
    const std::string dir = path(optimizer);
    Result r = run_app(kStep + "--batch-size 64 --max-steps 1 --optimizer " + optimizer +
                       " --beta1 0.8 --beta2 0.99 --weight-decay 0.01 --checkpoint-dir " + dir);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(std::string(optimizer == "adam" ? "Adam" : "AdamW") +
                            " lr 0.1 betas (0.8, 0.99) weight decay 0.01"),
              std::string::npos)
        << r.output;
    const loom::SafetensorsFile file = loom::load_safetensors(dir + "/last.safetensors");
    EXPECT_EQ(file.metadata.at("optimizer.optimizer"), optimizer == "adam" ? "Adam" : "AdamW");
    EXPECT_EQ(file.metadata.at("optimizer.beta1"), "0.8");
    EXPECT_EQ(file.metadata.at("optimizer.beta2"), "0.99");
    EXPECT_EQ(std::stod(file.metadata.at("optimizer.weight_decay")), 0.01);
    const int params = std::stoi(file.metadata.at("optimizer.num_params"));
    ASSERT_GT(params, 60);
    for (int i = 0; i < params; ++i) {
      const std::string state = "optimizer.state." + std::to_string(i) + ".";
      // at() throws, naming the tensors the file has, when a moment is missing.
      const std::vector<double> m = file.at(state + "exp_avg").to_vector<double>();
      const std::vector<double> v = file.at(state + "exp_avg_sq").to_vector<double>();
      for (size_t j = 0; j < m.size(); ++j)
        ASSERT_NEAR(m[j] * m[j], 4 * v[j], 1e-4 * 4 * v[j] + 1e-30) << state << j;
    }
  }
  EXPECT_EQ(run_app(kStep + "--optimizer adam --beta2 1 --max-steps 1").status, 2);
  EXPECT_EQ(run_app(kStep + "--optimizer lamb").status, 2);
}

// --grad-clip C with plain SGD: the first update is the unclipped one times C / |g|, where |g|,
// the gradients' total norm, is |unclipped update| / lr. With fp16 the gradients are unscaled
// before they are clipped: clipping the loss-scaled ones would shrink the update by another
// factor of the loss scale (65536).
TEST_F(App, GradClipScalesTheFirstUpdateByMaxNormOverTheGradientNorm) {
  using namespace loom::test;
  Result init = run_app(kStep + "--batch-size 64 --max-steps 0 --checkpoint-dir " + path("init"));
  ASSERT_EQ(init.status, 0) << init.output;
  const Parameters before = checkpoint_parameters(path("init/last.safetensors"));
  // A large lr, so that the clipped update stands well above the weights' float32 rounding.
  const double lr = 10, max_norm = 1e-2;
  for (const std::string amp : {"off", "fp16"}) {
    SCOPED_TRACE("--amp " + amp);
    const std::string run = kStep + "--lr 10 --batch-size 64 --max-steps 1 --amp " + amp + " ";
    Result plain = run_app(run + "--checkpoint-dir " + path(amp + "_plain"));
    ASSERT_EQ(plain.status, 0) << plain.output;
    Result clipped = run_app(run + "--grad-clip 0.01 --checkpoint-dir " + path(amp + "_clip"));
    ASSERT_EQ(clipped.status, 0) << clipped.output;
    EXPECT_NE(clipped.output.find("gradients clipped to norm 0.01"), std::string::npos);
    const Parameters unclipped_update =
        update(before, checkpoint_parameters(path(amp + "_plain/last.safetensors")));
    const Parameters clipped_update =
        update(before, checkpoint_parameters(path(amp + "_clip/last.safetensors")));
    const double total_norm = norm(unclipped_update) / lr;
    ASSERT_GT(total_norm, 100 * max_norm);                 // so the clip matters
    const double factor = max_norm / (total_norm + 1e-6);  // clip_grad_norm_'s
    EXPECT_LT(relative_difference(clipped_update, unclipped_update, factor), 1e-4)
        << "gradient norm " << total_norm;
  }
}

TEST_F(App, EvalOnlyReproducesTheLastTestAccuracyAndCheckpointsDescribeTheModel) {
  Result train = run_app(kSmall + "--epochs 1 --checkpoint-dir " + path("ckpt") + " --log-json " +
                         path("a.json"));
  ASSERT_EQ(train.status, 0) << train.output;
  Result eval = run_app(kSmall + "--eval-only --resume " + path("ckpt/last.safetensors") +
                        " --log-json " + path("e.json"));
  ASSERT_EQ(eval.status, 0) << eval.output;
  EXPECT_EQ(read_log(path("e.json")).back()["test_acc"], read_log(path("a.json"))[0]["test_acc"]);
  // The same weights fed channels-last batches: the same evaluation (sums in another order).
  Result eval_cl = run_app(kSmall + "--eval-only --channels-last --resume " +
                           path("ckpt/last.safetensors") + " --log-json " + path("cl.json"));
  ASSERT_EQ(eval_cl.status, 0) << eval_cl.output;
  EXPECT_NE(eval_cl.output.find("channels-last"), std::string::npos) << eval_cl.output;
  EXPECT_EQ(read_log(path("cl.json")).back()["test_acc"], read_log(path("a.json"))[0]["test_acc"]);
  EXPECT_NEAR(read_log(path("cl.json")).back()["test_loss"].get<double>(),
              read_log(path("e.json")).back()["test_loss"].get<double>(), 1e-5);

  const loom::SafetensorsFile file = loom::load_safetensors(path("ckpt/epoch-001.safetensors"));
  EXPECT_EQ(file.metadata.at("model"), "resnet18");
  EXPECT_EQ(file.metadata.at("width"), "4");
  EXPECT_EQ(file.metadata.at("in_channels"), "3");
  EXPECT_EQ(file.metadata.at("num_classes"), "10");
  EXPECT_EQ(json::parse(file.metadata.at("mean")).size(), 3u);
  EXPECT_EQ(json::parse(file.metadata.at("std")).size(), 3u);
  EXPECT_TRUE(file.contains("layer4.1.bn2.running_var"));
}

TEST_F(App, BadInputExitsWithStatusTwoAndSaysWhy) {
  Result missing = run_app("--dataset cifar10 --data " + path("nowhere"));
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("nowhere"), std::string::npos) << missing.output;

  // A Fashion-MNIST directory whose label file is cut short.
  fs::create_directories(path("fm"));
  for (const char* name : {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte",
                           "train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::ofstream f(path("fm/") + name, std::ios::binary);
    const bool images = std::string(name).find("images") != std::string::npos;
    const unsigned char header[] = {0, 0, 8, static_cast<unsigned char>(images ? 3 : 1),
                                    0, 0, 0, 4};
    f.write(reinterpret_cast<const char*>(header), sizeof header);
    if (images) {
      const unsigned char dims[] = {0, 0, 0, 28, 0, 0, 0, 28};
      f.write(reinterpret_cast<const char*>(dims), sizeof dims);
      f << std::string(4 * 28 * 28, '\0');
    } else {
      f << std::string(2, '\0');  // 2 of the 4 labels
    }
  }
  Result truncated = run_app("--dataset fashion-mnist --data " + path("fm"));
  EXPECT_EQ(truncated.status, 2);
  EXPECT_NE(truncated.output.find("labels-idx1-ubyte"), std::string::npos) << truncated.output;

  Result garbage_checkpoint = run_app(kSmall + "--resume " + path("fm/t10k-labels-idx1-ubyte"));
  EXPECT_EQ(garbage_checkpoint.status, 2);
  EXPECT_NE(garbage_checkpoint.output.find("t10k-labels-idx1-ubyte"), std::string::npos);

  EXPECT_EQ(run_app("--dataset imagenet").status, 2);
  EXPECT_EQ(run_app("--epochs 0").status, 2);
  EXPECT_EQ(run_app("--eval-only").status, 2);
  Result help = run_app("--help");
  EXPECT_EQ(help.status, 0);
  for (const char* flag :
       {"--data",       "--dataset",      "--epochs",         "--batch-size", "--lr",
        "--momentum",   "--weight-decay", "--nesterov",       "--schedule",   "--width",
        "--seed",       "--threads",      "--checkpoint-dir", "--resume",     "--eval-only",
        "--max-steps",  "--log-json",     "--gpus",           "--backend",    "--amp",
        "--comm-dtype", "--channels-last"})
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag;
}

// --conv-algorithm benchmark: the run ends with a line per layer shape and pass, naming the
// method chosen beside every candidate's time; a name it does not know is refused.
TEST_F(App, ConvolutionsChosenByMeasurementAreReported) {
  Result r = run_app(kSmall + "--epochs 1 --max-steps 2 --conv-algorithm benchmark");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("convolutions chosen by measurement");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string report = r.output.substr(at);
  // The 3x3 stride-1 layers race four methods, the stride-2 and 1x1 ones two.
  EXPECT_NE(report.find("w [4, 4, 3, 3] stride 1 pad 1, forward: "), std::string::npos) << report;
  EXPECT_NE(report.find("winograd F(4x4,3x3) "), std::string::npos) << report;
  EXPECT_NE(report.find("backward dx dw"), std::string::npos) << report;
  EXPECT_NE(report.find("stride 2"), std::string::npos) << report;
  EXPECT_EQ(run_app(kSmall + "--conv-algorithm fastest").status, 2);
  // Without it, no report.
  Result plain = run_app(kSmall + "--epochs 1 --max-steps 1");
  EXPECT_EQ(plain.output.find("convolutions chosen by measurement"), std::string::npos);
}

TEST_F(App, GpuFlagsAreCheckedBeforeAnyWork) {
  Result nccl_on_cpus = run_app(kSmall + "--backend nccl");
  EXPECT_EQ(nccl_on_cpus.status, 2);
  EXPECT_NE(nccl_on_cpus.output.find("--backend nccl needs GPUs"), std::string::npos)
      << nccl_on_cpus.output;
  Result both = run_app(kSmall + "--gpus 2 --nproc 2");
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.output.find("--nproc"), std::string::npos) << both.output;
  if (loom::cuda_device_count() == 0) {  // here: a clear refusal, not a crash
    Result no_gpu = run_app(kSmall + "--gpus 1");
    EXPECT_EQ(no_gpu.status, 2);
    EXPECT_NE(no_gpu.output.find("no CUDA device"), std::string::npos) << no_gpu.output;
  }
}

TEST_F(App, TrainsOnAGpu) {
  if (loom::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  Result gpu = run_app(kSmall + "--gpus 1 --log-json " + path("gpu.json"));
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  Result cpu = run_app(kSmall + "--log-json " + path("cpu.json"));
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  const std::vector<json> g = read_log(path("gpu.json")), c = read_log(path("cpu.json"));
  ASSERT_EQ(g.size(), c.size());
  // Same data, same initialisation; float rounding differs between the devices.
  EXPECT_NEAR(g.back()["train_loss"].get<double>(), c.back()["train_loss"].get<double>(), 0.05);
}

// --tensorboard: an event file whose records are framed as TFRecords with valid CRCs, holding
// the training scalars every --tensorboard-every steps and the epoch's; read back by the
// tensorboard package where it is installed.
TEST_F(App, TensorBoardFilesHoldTheScalars) {
  Result r = run_app(kSmall + "--epochs 1 --tensorboard " + path("tb") + " --tensorboard-every 2");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path("tb"))) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(files[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data() + at, 8);
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    ASSERT_LE(at + 16 + n, bytes.size());
    std::memcpy(&data_crc, bytes.data() + at + 12 + n, 4);
    EXPECT_EQ(length_crc, loom::dist::masked_crc32c(bytes.data() + at, 8));
    EXPECT_EQ(data_crc, loom::dist::masked_crc32c(bytes.data() + at + 12, n));
    at += 16 + n, ++records;
  }
  EXPECT_EQ(at, bytes.size());
  // The version, 6 steps / 2 x 3 training scalars (no loss scale without fp16), 6 epoch scalars.
  EXPECT_EQ(records, 1u + 3 * 3 + 6);
  for (const char* tag :
       {"train/loss", "train/lr", "train/images_per_s", "epoch/test_acc", "epoch/peak_memory_mib"})
    EXPECT_NE(bytes.find(tag), std::string::npos) << tag;

  const std::string env = std::string("PYTHONPATH=") + LOOM_PYDEPS_DIR;
  if (std::system((env + " python3 -c 'import tensorboard' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "the tensorboard Python package is not importable (scripts/setup.sh --torch)";
  std::ofstream(path("read.py"))
      << "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
         "import sys\n"
         "acc = EventAccumulator(sys.argv[1]); acc.Reload()\n"
         "print(' '.join(str(e.step) for e in acc.Scalars('train/loss')))\n"
         "print(len(acc.Scalars('epoch/test_acc')))\n";
  FILE* pipe =
      popen((env + " python3 " + path("read.py") + " " + path("tb") + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  EXPECT_EQ(out, "2 4 6\n1\n");
}

}  // namespace
