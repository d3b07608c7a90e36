// tests/dist/gpt_train_app_test.cpp — gpt_train end to end on a small text: world-size
// invariance (1 rank at batch 8 and 2 ranks at batch 4 see the same windows and end with the
// same weights), the ZeRO stages ending with DDP's weights, resuming (2 + 2 steps equal 4), a
// checkpoint that transformers' layout names and that samples, and every bad input exiting with
// status 2 and writing nothing.

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

const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/gpt_train";
const std::string kBpeDir = std::string(LOOM_TEST_DATA_DIR) + "/bpe";

// A tiny model and short runs: the point is the plumbing, not the loss.
const std::string kModel =
    " --layers 1 --heads 2 --embd 16 --block 16 --eval-iters 2 --log-every 1 --threads 1"
    " --no-sample --warmup 1 ";

class GptTrainApp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kApp)) GTEST_SKIP() << kApp << " is not built";
    std::ofstream text(path("text.txt"));
    for (int i = 0; i < 200; ++i) text << "The quick brown fox " << i << " jumps over the dog.\n";
  }
  std::string path(const std::string& name) const { return dir_.file(name); }

  // Runs the app with `args`; its exit status, its output in `output`.
  int run(const std::string& args, std::string* output = nullptr) const {
    const std::string log = path("run.log");
    const int status = std::system((kApp + " " + args + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    if (output) *output = s.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string data() const { return " --data " + path("text.txt"); }

  loom::test::ScratchDir dir_;
};

void expect_same_weights(const std::string& a_path, const std::string& b_path, double rtol,
                         double atol) {
  const loom::SafetensorsFile a = loom::load_safetensors(a_path);
  const loom::SafetensorsFile b = loom::load_safetensors(b_path);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors)
    EXPECT_TRUE(loom::test::tensors_close(b.at(name), t, rtol, atol)) << name;
}

// SGD, whose step is linear in the gradient, so that rounding stays rounding (Adam's step is
// about lr sign(g) where g is near 0, which turns a rounding difference into a whole step).
TEST_F(GptTrainApp, OneRankAtBatchEightEqualsTwoRanksAtBatchFour) {
  std::string out;
  const std::string sgd = "--optimizer sgd --lr 0.05 --iters 3 --eval-every 3 ";
  ASSERT_EQ(run(data() + kModel + sgd + "--batch-size 8 --checkpoint-dir " + path("one"), &out), 0)
      << out;
  ASSERT_EQ(
      run(data() + kModel + sgd + "--batch-size 4 --nproc 2 --checkpoint-dir " + path("two"), &out),
      0)
      << out;
  EXPECT_NE(out.find("world 2"), std::string::npos) << out;
  // The same windows, gradients averaged over the ranks: equal up to rounding.
  expect_same_weights(path("one/model.safetensors"), path("two/model.safetensors"), 1e-4, 1e-6);
}

// --strategy (Note [resnet18_cifar's strategies]): DataParallel's replicas in one process and
// the Horovod-style optimizer on two ranks take the same steps as one process on the whole batch.
TEST_F(GptTrainApp, DataParallelAndHorovodStyleEqualOneProcess) {
  std::string out;
  const std::string sgd = "--optimizer sgd --lr 0.05 --iters 3 --eval-every 3 ";
  ASSERT_EQ(run(data() + kModel + sgd + "--batch-size 8 --checkpoint-dir " + path("one"), &out), 0)
      << out;
  ASSERT_EQ(run(data() + kModel + sgd + "--strategy dp --nproc 2 --batch-size 8 --log-json " +
                    path("dp.json") + " --checkpoint-dir " + path("dp"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("DataParallel: 2 replicas"), std::string::npos) << out;
  EXPECT_NE(out.find("through device 0"), std::string::npos) << out;
  {
    SCOPED_TRACE("dp");
    expect_same_weights(path("one/model.safetensors"), path("dp/model.safetensors"), 1e-4, 1e-6);
  }
  ASSERT_EQ(run(data() + kModel + sgd + "--strategy horovod --nproc 2 --batch-size 4 " +
                    "--checkpoint-dir " + path("hvd"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("Horovod-style"), std::string::npos) << out;
  {
    SCOPED_TRACE("horovod");
    expect_same_weights(path("one/model.safetensors"), path("hvd/model.safetensors"), 1e-4, 1e-6);
  }
  // The log says which strategy ran and what it moved.
  std::ifstream log(path("dp.json"));
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  EXPECT_NE(line.find("\"strategy\":\"dp\""), std::string::npos) << line;
  // Flags that contradict each other are refused with status 2.
  EXPECT_EQ(run(data() + kModel + "--strategy dp --zero 2", &out), 2);
  EXPECT_NE(out.find("--zero"), std::string::npos) << out;
  EXPECT_EQ(run(data() + kModel + "--strategy zero1 --zero 2", &out), 2);
  EXPECT_EQ(run(data() + kModel + "--strategy horovod --iters 1", &out), 2);
  EXPECT_NE(out.find("--nproc N"), std::string::npos) << out;
}

// Note [Activation checkpointing]: recomputing each block in backward changes no bit, also under
// DDP (whose end-of-backward wait is queued from inside the recomputation) and with dropout.
TEST_F(GptTrainApp, CheckpointActivationsChangesNoBitOnTwoRanks) {
  std::string out;
  const std::string args = data() + kModel + "--layers 2 --dropout 0.1 --iters 3 --eval-every 3 " +
                           "--batch-size 4 --nproc 2 --checkpoint-dir ";
  ASSERT_EQ(run(args + path("plain"), &out), 0) << out;
  ASSERT_EQ(run(args + path("recomputed") + " --checkpoint-activations", &out), 0) << out;
  expect_same_weights(path("plain/model.safetensors"), path("recomputed/model.safetensors"), 0, 0);
}

// Note [ZeRO stages]: each stage ends with DDP's weights (the apps' bound, 1e-5), with AdamW
// and clipping, and with SGD over two micro-batches (each reduce-scattered: the sums are
// rounded in another order); the run summary prints the bytes each collective moved.
TEST_F(GptTrainApp, EachZeroStageEndsWithDDPsWeightsOnTwoRanks) {
  std::string out;
  const std::string common = data() + kModel + "--layers 2 --iters 3 --eval-every 3 " +
                             "--batch-size 4 --nproc 2 --grad-clip 1 ";
  const std::string sgd = "--optimizer sgd --lr 0.05 --accumulate 2 ";
  ASSERT_EQ(run(common + "--checkpoint-dir " + path("adamw-0"), &out), 0) << out;
  EXPECT_NE(out.find("allreduce"), std::string::npos) << out;
  ASSERT_EQ(run(common + sgd + "--checkpoint-dir " + path("sgd-0"), &out), 0) << out;
  for (const std::string stage : {"1", "2", "3"}) {
    SCOPED_TRACE("--zero " + stage);
    const std::string trace = path("trace-" + stage + ".json");
    ASSERT_EQ(run(common + "--zero " + stage + " --print-memory --trace " + trace +
                      " --checkpoint-dir " + path("adamw-" + stage),
                  &out),
              0)
        << out;
    // The trace: the steps' phases and, under ZeRO-3, each block's all-gather and reduce-scatter.
    std::ifstream in(trace);
    std::stringstream events;
    events << in.rdbuf();
    EXPECT_NE(events.str().find("\"backward\""), std::string::npos);
    if (stage == "3") {
      EXPECT_NE(events.str().find("\"allgather transformer.h.0\""), std::string::npos);
      EXPECT_NE(events.str().find("\"reduce_scatter transformer.h.1\""), std::string::npos);
    }
    EXPECT_NE(out.find("(ZeRO-" + stage + "; bus bytes"), std::string::npos) << out;
    EXPECT_NE(out.find("reduce_scatter"), std::string::npos) << out;
    EXPECT_NE(out.find("allgather"), std::string::npos) << out;
    EXPECT_NE(out.find("memory after the second step on cpu, ZeRO-" + stage + " over 2 rank(s)"),
              std::string::npos)
        << out;
    expect_same_weights(path("adamw-" + stage + "/model.safetensors"),
                        path("adamw-0/model.safetensors"), 1e-5, 1e-7);
    ASSERT_EQ(
        run(common + sgd + "--zero " + stage + " --checkpoint-dir " + path("sgd-" + stage), &out),
        0)
        << out;
    expect_same_weights(path("sgd-" + stage + "/model.safetensors"),
                        path("sgd-0/model.safetensors"), 1e-5, 1e-7);
  }
}

// Note [Sharded checkpoints]: a --zero run writes last.sharded/, a shard per rank; resuming it on
// as many ranks changes no bit, and on another number of ranks (4 -> 2, each with twice the
// windows) it continues DDP's run (SGD: the sums are rounded in another order).
TEST_F(GptTrainApp, AZeroRunResumesFromItsShardsOnAnyNumberOfRanks) {
  std::string out;
  const std::string common = data() + kModel + "--layers 2 --eval-every 2 --grad-clip 1 ";
  const std::string four = "--nproc 4 --batch-size 2 ", two = "--nproc 2 --batch-size 4 ";
  ASSERT_EQ(run(common + four + "--zero 1 --iters 4 --checkpoint-dir " + path("whole"), &out), 0)
      << out;
  ASSERT_EQ(run(common + four + "--zero 1 --iters 2 --checkpoint-dir " + path("half"), &out), 0)
      << out;
  EXPECT_TRUE(fs::exists(path("half/last.sharded/shard-3-of-4.safetensors")));
  EXPECT_FALSE(fs::exists(path("half/last.safetensors")));
  ASSERT_EQ(run(common + four + "--zero 1 --iters 4 --checkpoint-dir " + path("half") +
                    " --resume " + path("half/last.sharded"),
                &out),
            0)
      << out;
  expect_same_weights(path("half/model.safetensors"), path("whole/model.safetensors"), 0, 0);

  const std::string sgd = "--optimizer sgd --lr 0.05 ";
  ASSERT_EQ(run(common + sgd + four + "--iters 4 --checkpoint-dir " + path("ddp"), &out), 0) << out;
  ASSERT_EQ(run(common + sgd + four + "--zero 3 --iters 2 --checkpoint-dir " + path("fsdp"), &out),
            0)
      << out;
  ASSERT_EQ(run(common + sgd + two + "--zero 3 --iters 4 --checkpoint-dir " + path("fsdp") +
                    " --resume " + path("fsdp/last.sharded"),
                &out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(path("fsdp/last.sharded/shard-1-of-2.safetensors")));
  expect_same_weights(path("fsdp/model.safetensors"), path("ddp/model.safetensors"), 1e-5, 1e-7);

  // A sharded folder needs --zero; sampling reads the exported model instead.
  EXPECT_EQ(run(common + sgd + four + "--iters 6 --resume " + path("fsdp/last.sharded"), &out), 2);
  EXPECT_NE(out.find("resume it with --zero"), std::string::npos) << out;
  EXPECT_EQ(run("--sample 'The' --resume " + path("fsdp/last.sharded"), &out), 2);
  EXPECT_NE(out.find("model.safetensors beside it"), std::string::npos) << out;
}

TEST_F(GptTrainApp, ResumingContinuesWhereTheRunStopped) {
  std::string out;
  ASSERT_EQ(
      run(data() + kModel + "--iters 4 --eval-every 2 --checkpoint-dir " + path("whole"), &out), 0)
      << out;
  ASSERT_EQ(
      run(data() + kModel + "--iters 2 --eval-every 2 --checkpoint-dir " + path("half"), &out), 0)
      << out;
  ASSERT_EQ(run(data() + kModel + "--iters 4 --eval-every 2 --checkpoint-dir " + path("half") +
                    " --resume " + path("half/last.safetensors"),
                &out),
            0)
      << out;
  expect_same_weights(path("whole/model.safetensors"), path("half/model.safetensors"), 0, 0);

  // The exported folder: Hugging Face's keys and a config.json; and it samples.
  const loom::SafetensorsFile model = loom::load_safetensors(path("whole/model.safetensors"));
  EXPECT_TRUE(model.contains("transformer.h.0.attn.c_attn.weight"));
  EXPECT_TRUE(model.contains("lm_head.weight"));
  EXPECT_TRUE(fs::exists(path("whole/config.json")));
  ASSERT_EQ(
      run("--sample 'The quick' --sample-tokens 20 --resume " + path("whole/last.safetensors"),
          &out),
      0)
      << out;
  EXPECT_EQ(out.rfind("The quick", 0), 0u) << out;
  ASSERT_EQ(
      run("--sample 'The quick' --sample-tokens 5 --resume " + path("whole/model.safetensors"),
          &out),
      0)
      << out;
}

// GPT-2's BPE (the fixture's 1000-token one): training records the files' hashes, and sampling
// from the exported folder (model.safetensors beside config.json) needs the same files.
TEST_F(GptTrainApp, TrainsAndSamplesWithTheBpeTokenizer) {
  std::string out;
  const std::string bpe = " --tokenizer gpt2 --bpe-dir " + kBpeDir + " ";
  ASSERT_EQ(
      run(data() + kModel + bpe + "--iters 2 --eval-every 2 --checkpoint-dir " + path("b"), &out),
      0)
      << out;
  EXPECT_NE(out.find("GPT-2 BPE"), std::string::npos) << out;
  const loom::SafetensorsFile model = loom::load_safetensors(path("b/model.safetensors"));
  EXPECT_EQ(model.metadata.at("loom.tokenizer"), "gpt2-bpe");
  EXPECT_NE(model.metadata.at("loom.tokenizer.files").find("merges.txt"), std::string::npos);
  ASSERT_EQ(run("--sample 'The quick' --sample-tokens 8" + bpe + "--resume " +
                    path("b/model.safetensors"),
                &out),
            0)
      << out;
  EXPECT_EQ(out.rfind("The quick", 0), 0u) << out;
  // Without --tokenizer gpt2 the checkpoint's tokenizer is refused, not guessed.
  EXPECT_EQ(run("--sample 'The quick' --resume " + path("b/model.safetensors"), &out), 2) << out;
  EXPECT_NE(out.find("GPT-2's BPE"), std::string::npos) << out;
}

TEST_F(GptTrainApp, BadInputExitsWithTwoAndWritesNothing) {
  std::string out;
  ASSERT_EQ(run(data() + kModel + "--iters 1 --eval-every 1 --checkpoint-dir " + path("ok"), &out),
            0)
      << out;
  const std::string checkpoint = path("ok/last.safetensors");
  {
    std::ofstream other(path("other.txt"));
    for (int i = 0; i < 50; ++i) other << "ZZZ qqq ~~~ " << i << "\n";  // bytes the model lacks
  }
  struct Bad {
    std::string args, fragment;
  };
  const Bad cases[] = {
      {"--data " + path("missing.txt") + kModel, "missing.txt"},
      {"--data " + path("empty_dir") + kModel, "empty_dir"},
      {"--data " + path("other.txt") + kModel + "--resume " + checkpoint, "vocabulary"},
      {data() + kModel + "--embd 32 --resume " + checkpoint, "--embd 32 does not match"},
      {"--sample '" + std::string(40, 'o') + "' --resume " + checkpoint, "longer than"},
      {"--sample 'ZZZ' --resume " + checkpoint, "'Z'"},
      {data() + kModel + "--tokenizer gpt2 --bpe-dir " + path("no_bpe"), "no_bpe"},
      {data() + kModel + "--tokenizer gpt2 --bpe-dir " + kBpeDir + " --resume " + checkpoint,
       "trained on bytes"},
      {data() + kModel + "--layers 0", "--layers"},
      {data() + kModel + "--zero 4", "--zero"},
      {data() + kModel + "--zero 2", "--nproc N"},
      {data() + kModel + "--zero 3 --nproc 2 --resume " + checkpoint, "resume it without --zero"},
  };
  fs::create_directories(path("empty_dir"));
  fs::create_directories(path("no_bpe"));
  std::ofstream(path("no_bpe/vocab.json")) << "{not json";
  std::ofstream(path("no_bpe/merges.txt")) << "#version: 0.2\n";
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string dir = path("bad");
    EXPECT_EQ(run(c.args + " --checkpoint-dir " + dir + " --log-json " + dir + "/log.jsonl", &out),
              2)
        << out;
    EXPECT_NE(out.find(c.fragment), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir)) << "a failed run wrote " << dir;
  }
}

}  // namespace
