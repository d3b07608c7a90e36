// tests/nn/gpt_transformers_test.cpp — loom's GPT against Hugging Face transformers'
// GPT2LMHeadModel itself (tools/gpt_transformers_check.py): a loom checkpoint with its
// config.json loads with GPT2LMHeadModel.from_pretrained and gives loom's logits and loss; a
// model save_pretrained wrote (and its GPT2Model, keys without "transformer.") loads in loom and
// gives transformers' logits. Skipped where no Python with torch was found at configure time or
// transformers does not import from .pydeps/ (scripts/setup.sh --torch installs it).

#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "scratch_dir.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

struct Output {
  int status = -1;
  std::string text;
};

// Runs tools/gpt_transformers_check.py MODE DIR with .pydeps/ on PYTHONPATH; stdout is the text.
Output check_script(const std::string& mode, const std::string& dir) {
  const std::string command = std::string("PYTHONPATH=") + LOOM_PYDEPS_DIR + " " +
                              LOOM_TORCH_PYTHON + " " + LOOM_SOURCE_DIR +
                              "/tools/gpt_transformers_check.py " + mode + " " + dir;
  Output out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.text.append(buf, n);
  const int raw = pclose(pipe);
  out.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

constexpr const char* kSkipReason =
    "transformers does not import (with Debian's torch 1.13 from .pydeps/): run "
    "scripts/setup.sh --torch";

class GPTTransformers : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(LOOM_TORCH_PYTHON).empty())
      GTEST_SKIP() << "no Python with torch was found at configure time";
  }
  const test::ScratchDir dir_;  // Note [Test scratch directories]
};

TEST_F(GPTTransformers, TransformersLoadsALoomCheckpoint) {
  GPTConfig c;
  c.vocab_size = 50;
  c.block_size = 12;
  c.n_embd = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.dropout = 0.1;  // from_pretrained's model runs in eval mode, as loom's does here
  manual_seed(21);
  auto model = make<GPT>(c);
  {
    autograd::NoGradGuard no_grad;  // every parameter away from its initial value
    for (auto [name, p] : model->named_parameters())
      p.add_(randn(p.sizes()) * (p.dim() == 1 ? 0.1f : 0.2f));
  }
  model->eval();
  save_gpt(dir_.file("model.safetensors"), *model, {"byte", "abcdefghij", {}});
  write_hf_config(dir_.file("config.json"), c);
  const Tensor idx = randint(0, c.vocab_size, {3, 12});
  const Tensor targets = randint(0, c.vocab_size, {3, 12});
  save_safetensors(dir_.file("batch.safetensors"), {{"idx", idx}, {"targets", targets}});

  const Output out = check_script("score", dir_.path().string());
  if (out.status == 3) GTEST_SKIP() << kSkipReason;
  ASSERT_EQ(out.status, 0) << out.text;
  const nlohmann::json j = nlohmann::json::parse(out.text);
  EXPECT_EQ(j["dtype"], "torch.float32");
  const SafetensorsFile scored = load_safetensors(dir_.file("scored.safetensors"));

  // float32 on both sides: the two implementations' roundings.
  EXPECT_TRUE(tensors_close(model->forward(idx), scored.at("logits32"), 1e-4, 1e-4));
  EXPECT_NEAR(model->loss(idx, targets).item(), j["loss32"].get<double>(), 1e-5);
  // The same float32 weights in float64 on both sides: the same math to rounding.
  model->to(kFloat64);
  EXPECT_TRUE(tensors_close(model->forward(idx), scored.at("logits64"), 0, 1e-10));
  EXPECT_NEAR(model->loss(idx, targets).item(), j["loss64"].get<double>(), 1e-10);
}

TEST_F(GPTTransformers, LoomLoadsWhatSavePretrainedWrites) {
  const Output out = check_script("save", dir_.path().string());
  if (out.status == 3) GTEST_SKIP() << kSkipReason;
  ASSERT_EQ(out.status, 0) << out.text;
  const SafetensorsFile expected = load_safetensors(dir_.file("expected.safetensors"));
  const Tensor idx = expected.at("idx");

  for (const char* form : {"lm", "base"}) {
    SCOPED_TRACE(form);
    const std::string folder = dir_.file(form);
    const SafetensorsFile file = load_safetensors(folder + "/model.safetensors");
    EXPECT_FALSE(file.contains("lm_head.weight"));  // tied: save_pretrained leaves it out
    EXPECT_EQ(file.contains("wte.weight"), std::string(form) == "base");
    const GPTConfig config = read_hf_config(folder + "/config.json");
    EXPECT_EQ(config.vocab_size, 65);
    EXPECT_EQ(config.block_size, 16);
    EXPECT_EQ(config.dropout, 0.1);
    const GPTCheckpoint loaded = load_gpt(folder + "/model.safetensors", config);
    EXPECT_EQ(loaded.metadata.at("format"), "pt");
    auto model = loaded.model;
    model->eval();
    EXPECT_EQ(model->transformer->wte->weight.dtype(), kFloat32);
    EXPECT_TRUE(tensors_close(model->forward(idx), expected.at("logits32"), 1e-4, 1e-4));
    model->to(kFloat64);
    EXPECT_TRUE(tensors_close(model->forward(idx), expected.at("logits64"), 0, 1e-10));
  }
}

}  // namespace
}  // namespace loom::nn
