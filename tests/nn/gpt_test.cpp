// tests/nn/gpt_test.cpp — nn::GPT against tests/golden/gpt.safetensors (tools/make_gpt_golden.py:
// Hugging Face's GPT2LMHeadModel math in float64, with and without biases): logits, loss and
// gradients, the state dict's keys and shapes, the tied head; then the initialisation, the KV
// cache and the sampler (cached generation equals uncached), checkpoints (round trip, the
// forms Hugging Face writes, every error), config.json, and the errors of the config and the
// forward.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "scratch_dir.h"
#include "test_util.h"

namespace loom::nn {
namespace {

using test::tensors_close;

// ------------------------------------------------------------------ the golden file

struct GoldenCase {
  GPTConfig config;
  NamedTensors state;  // Hugging Face's state_dict(), lm_head.weight included, in its order
  Tensor idx, targets, logits, loss;
  std::map<std::string, Tensor> grads;  // parameter key -> d loss / d parameter
};

GoldenCase golden(const std::string& name) {
  static const SafetensorsFile file =
      load_safetensors(std::string(LOOM_TEST_DATA_DIR) + "/gpt.safetensors");
  GoldenCase g;
  g.config = gpt_config_from_json(file.metadata.at(name + ".config"));
  const std::string prefix = name + ".", grad_prefix = name + ".grad.";
  for (const auto& [key, t] : file.tensors) {
    if (!key.starts_with(prefix)) continue;
    const std::string rest = key.substr(prefix.size());
    if (key.starts_with(grad_prefix))
      g.grads[key.substr(grad_prefix.size())] = t;
    else if (rest == "idx")
      g.idx = t;
    else if (rest == "targets")
      g.targets = t;
    else if (rest == "logits")
      g.logits = t;
    else if (rest == "loss")
      g.loss = t;
    else
      g.state.emplace_back(rest, t);
  }
  return g;
}

NamedTensors without_head(const NamedTensors& state) {
  NamedTensors out;
  for (const auto& [key, t] : state)
    if (key != "lm_head.weight") out.emplace_back(key, t);
  return out;
}

std::shared_ptr<GPT> golden_model(const GoldenCase& g) {
  auto model = make<GPT>(g.config);
  model->to(kFloat64);
  model->load_state_dict(without_head(g.state));
  return model;
}

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

// A float64 model whose every parameter is random (biases and LayerNorms included), so that
// every part of it shows in the logits.
std::shared_ptr<GPT> random_model(GPTConfig config = tiny_config(), uint64_t seed = 5) {
  manual_seed(seed);
  auto model = make<GPT>(config);
  model->to(kFloat64);
  autograd::NoGradGuard no_grad;
  for (auto [name, p] : model->named_parameters())
    p.copy_(randn(p.sizes(), kFloat64) * 0.3 + (p.dim() == 1 && name.ends_with("weight") ? 1 : 0));
  return model;
}

class GPTGolden : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Cases, GPTGolden, ::testing::Values("gpt", "gpt_nobias"));

TEST_P(GPTGolden, StateDictKeysAndShapesAreHuggingFaces) {
  const GoldenCase g = golden(GetParam());
  auto model = make<GPT>(g.config);
  const NamedTensors ours = model->hf_state_dict();
  ASSERT_EQ(ours.size(), g.state.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].first, g.state[i].first) << i;
    EXPECT_EQ(ours[i].second.sizes(), g.state[i].second.sizes()) << g.state[i].first;
  }
  // Module's own state and parameters are the same keys less the tied head.
  const NamedTensors params = model->named_parameters(), state = model->state_dict();
  ASSERT_EQ(params.size() + 1, ours.size());
  ASSERT_EQ(state.size() + 1, ours.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, ours[i].first);
    EXPECT_EQ(state[i].first, ours[i].first);
  }
  EXPECT_EQ(ours.back().first, "lm_head.weight");
}

TEST_P(GPTGolden, LogitsAndLossMatchTheFixture) {
  const GoldenCase g = golden(GetParam());
  auto model = golden_model(g);
  EXPECT_TRUE(tensors_close(model->forward(g.idx), g.logits, 0, 1e-10));
  const Tensor loss = model->loss(g.idx, g.targets);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item(), g.loss.item(), 1e-10);
}

TEST_P(GPTGolden, GradientsMatchTheFixture) {
  const GoldenCase g = golden(GetParam());
  auto model = golden_model(g);
  model->loss(g.idx, g.targets).backward();
  std::map<std::string, Tensor> params;
  for (const auto& [key, p] : model->named_parameters()) params[key] = p;
  ASSERT_GE(g.grads.size(), 5u);
  for (const auto& [key, expected] : g.grads) {
    ASSERT_TRUE(params.count(key)) << key;
    ASSERT_TRUE(params[key].grad().defined()) << key;
    EXPECT_TRUE(tensors_close(params[key].grad(), expected, 0, 1e-10)) << key;
  }
}

TEST(GPT, TheHeadIsTheEmbeddingOneParameter) {
  const GoldenCase g = golden("gpt");
  auto model = golden_model(g);
  const Tensor wte = model->transformer->wte->weight;
  const NamedTensors hf = model->hf_state_dict();
  EXPECT_TRUE(hf.back().second.is_same(wte));
  // Each parameter once, so an optimizer updates the shared one once.
  std::set<const TensorImpl*> seen;
  for (const Tensor& p : model->parameters())
    EXPECT_TRUE(seen.insert(p.unsafe_impl()).second) << "a parameter is listed twice";
  // The fixture's wte gradient is the embedding's plus the head's: without the head's, wte's
  // gradient would be zero in every row no idx names.
  model->loss(g.idx, g.targets).backward();
  const std::vector<int64_t> ids = g.idx.to_vector<int64_t>();
  const std::set<int64_t> used(ids.begin(), ids.end());
  int64_t unused = 0;
  while (used.count(unused)) ++unused;
  ASSERT_LT(unused, g.config.vocab_size);
  EXPECT_GT(std::fabs(wte.grad().select(0, unused).abs().sum().item()), 1e-6);
  EXPECT_TRUE(tensors_close(wte.grad(), g.grads.at("transformer.wte.weight"), 0, 1e-10));
  EXPECT_EQ(model->lm_head->type_name(), "Linear");
  EXPECT_TRUE(model->lm_head->named_parameters().empty());
}

TEST(GPT, PrintsAsHuggingFacesModules) {
  auto model = make<GPT>(golden("gpt").config);
  const std::string repr = model->repr();
  for (const char* part :
       {"GPT2LMHeadModel(", "(transformer): GPT2Model(", "(wte): Embedding(65, 32)",
        "(h): ModuleList(", "(0): GPT2Block(", "(attn): GPT2Attention(",
        "(c_attn): Conv1D(nf=96, nx=32)", "(mlp): GPT2MLP(", "(act): GELU(approximate='tanh')",
        "(lm_head): Linear(in_features=32, out_features=65, bias=False)"})
    EXPECT_NE(repr.find(part), std::string::npos) << part << "\n" << repr;
}

// ------------------------------------------------------------------ initialisation

TEST(GPT, InitialisationIsGPT2s) {
  GPTConfig c;
  c.vocab_size = 100;
  c.block_size = 64;
  c.n_embd = 768;
  c.n_layer = 2;
  c.n_head = 12;
  manual_seed(3);
  GPT model(c);
  std::map<std::string, Tensor> p;
  for (const auto& [key, t] : model.named_parameters()) p[key] = t;
  auto stats = [](const Tensor& t) {
    const std::vector<double> v = t.to_vector<double>();
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(sq / static_cast<double>(v.size()))};
  };
  const double residual = 0.02 / std::sqrt(2.0 * 2);
  const std::map<std::string, double> stds = {
      {"transformer.wte.weight", 0.02},
      {"transformer.wpe.weight", 0.02},
      {"transformer.h.0.attn.c_attn.weight", 0.02},
      {"transformer.h.1.attn.c_proj.weight", residual},  // 768 x 768
      {"transformer.h.0.mlp.c_fc.weight", 0.02},
      {"transformer.h.0.mlp.c_proj.weight", residual}};
  for (const auto& [key, want] : stds) {
    const auto [mean, std] = stats(p.at(key));
    EXPECT_NEAR(std, want, want * 0.03) << key;
    EXPECT_NEAR(mean, 0.0, want * 0.03) << key;
  }
  for (const auto& [key, t] : p) {
    if (key.ends_with(".bias")) {
      EXPECT_EQ(t.abs().sum().item(), 0.0) << key;
    }
    if (key.find("ln_") != std::string::npos && key.ends_with(".weight")) {
      EXPECT_EQ(t.sub(ones_like(t)).abs().sum().item(), 0.0) << key;
    }
  }
  // The seed fixes every weight.
  manual_seed(3);
  GPT first(tiny_config());
  manual_seed(3);
  GPT again(tiny_config());
  const NamedTensors a = first.state_dict(), b = again.state_dict();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
}

TEST(GPT, Conv1DIsXTimesWeightPlusBias) {
  manual_seed(1);
  Conv1D conv(4, 6);
  EXPECT_EQ(conv.weight.sizes(), (Shape{4, 6}));
  EXPECT_EQ(conv.bias.sizes(), (Shape{6}));
  {
    autograd::NoGradGuard no_grad;
    conv.bias.copy_(randn({6}));
  }
  const Tensor x = randn({2, 3, 4});
  EXPECT_TRUE(tensors_close(conv.forward(x), matmul(x, conv.weight) + conv.bias, 1e-6, 1e-6));
  Conv1D plain(4, 6, false);
  EXPECT_FALSE(plain.bias.defined());
  EXPECT_EQ(plain.named_parameters().size(), 1u);
  EXPECT_LOOM_ERROR(conv.forward(randn({2, 5})), ShapeError, {"Conv1D", "[2, 5]"});
}

// ------------------------------------------------------------------ config and forward errors

TEST(GPTConfig, GPT2SmallAndValidation) {
  const GPTConfig s = GPTConfig::gpt2_small();
  EXPECT_EQ(s.vocab_size, 50257);
  EXPECT_EQ(s.block_size, 1024);
  EXPECT_EQ(s.n_embd, 768);
  EXPECT_EQ(s.n_layer, 12);
  EXPECT_EQ(s.n_head, 12);
  EXPECT_EQ(s.dropout, 0.0);
  EXPECT_TRUE(s.bias);
  EXPECT_NO_THROW(s.validate());

  GPTConfig c = tiny_config();
  c.n_embd = 13;
  EXPECT_LOOM_ERROR(c.validate(), ValueError, {"n_embd (13)", "n_head (3)"});
  EXPECT_LOOM_ERROR(GPT{c}, ValueError, {"n_embd", "n_head"});
  for (auto field : {&GPTConfig::vocab_size, &GPTConfig::block_size, &GPTConfig::n_embd,
                     &GPTConfig::n_layer, &GPTConfig::n_head}) {
    c = tiny_config();
    c.*field = 0;
    EXPECT_THROW(c.validate(), ValueError);
  }
  c = tiny_config();
  c.vocab_size = -1;
  EXPECT_LOOM_ERROR(c.validate(), ValueError, {"vocab_size", "-1"});
  c = tiny_config();
  c.dropout = 1.0;
  EXPECT_LOOM_ERROR(c.validate(), ValueError, {"dropout", "1"});
}

TEST(GPT, ForwardErrorsNameTheProblem) {
  auto model = random_model();
  EXPECT_LOOM_ERROR(model->forward(zeros({1, 9}, kInt64)), ShapeError, {"T=9", "block_size=8"});
  EXPECT_LOOM_ERROR(model->forward(tensor<int64_t>({1, 11, 2}, {1, 3})), IndexError, {"11"});
  EXPECT_LOOM_ERROR(model->forward(tensor<int64_t>({1, -1}, {1, 2})), IndexError, {"-1"});
  EXPECT_LOOM_ERROR(model->forward(zeros({4}, kInt64)), ShapeError, {"[B, T]", "[4]"});
  EXPECT_LOOM_ERROR(model->forward(zeros({1, 4})), DTypeError, {"int64"});
  EXPECT_LOOM_ERROR(model->loss(zeros({2, 4}, kInt64), zeros({2, 3}, kInt64)), ShapeError,
                    {"[2, 4]", "[2, 3]"});
  KVCache cache;
  model->forward(zeros({1, 6}, kInt64), cache);
  EXPECT_LOOM_ERROR(model->forward(zeros({1, 3}, kInt64), cache), ShapeError,
                    {"6", "T=3", "block_size=8"});
  EXPECT_LOOM_ERROR(model->forward(zeros({2, 1}, kInt64), cache), ShapeError, {"batch 1"});
}

TEST(GPT, DropoutActsOnlyInTraining) {
  GPTConfig c = tiny_config();
  c.dropout = 0.2;
  auto model = random_model(c);
  auto plain = random_model(tiny_config());  // the same weights (same seed), no dropout
  const Tensor idx = tensor<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  model->eval();
  EXPECT_TRUE(tensors_close(model->forward(idx), plain->forward(idx), 0, 1e-12));
  model->train();
  const Tensor a = model->forward(idx), b = model->forward(idx);
  EXPECT_FALSE(tensors_close(a, plain->forward(idx), 0, 1e-6));
  EXPECT_FALSE(tensors_close(a, b, 0, 1e-6));  // new masks each call
}

// ------------------------------------------------------------------ KV cache and generation

TEST(GPT, CachedLogitsEqualTheFullForward) {
  auto model = random_model();
  model->eval();
  const Tensor idx = tensor<int64_t>({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, {2, 8});
  const Tensor full = model->forward(idx);
  // A prefill of 3, two single tokens, then a chunk of 3 after the cached ones.
  KVCache cache;
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t n : {3, 1, 1, 3}) {
    parts.push_back(model->forward(idx.narrow(1, at, n), cache));
    at += n;
    EXPECT_EQ(cache.length(), at);
  }
  ASSERT_EQ(cache.layers.size(), 2u);
  EXPECT_EQ(cache.layers[0].k.sizes(), (Shape{2, 3, 8, 4}));  // [B, H, T, D]
  EXPECT_EQ(cache.layers[1].v.sizes(), (Shape{2, 3, 8, 4}));
  EXPECT_TRUE(tensors_close(cat(parts, 1), full, 0, 1e-12));
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_TRUE(tensors_close(model->forward(idx, cache), full, 0, 1e-12));
}

TEST(GPT, GenerationWithTheCacheEqualsWithout) {
  auto model = random_model();
  const std::vector<int64_t> prompt = {4, 2, 7};
  model->train();  // generate runs in eval mode and restores the mode
  // 3 + 12 tokens pass block_size 8: the context is cropped and the cache rebuilt.
  struct Setting {
    double temperature;
    int64_t top_k;
    uint64_t seed;
  };
  for (const Setting s :
       {Setting{0.0, 0, 0}, Setting{1.0, 0, 1}, Setting{0.8, 4, 2}, Setting{1.5, 0, 3}}) {
    const std::vector<int64_t> cached = model->generate(prompt, 12, s.temperature, s.top_k, s.seed);
    const std::vector<int64_t> uncached =
        model->generate(prompt, 12, s.temperature, s.top_k, s.seed, /*use_cache=*/false);
    EXPECT_EQ(cached, uncached) << "temperature " << s.temperature << " top_k " << s.top_k;
    ASSERT_EQ(cached.size(), 15u);
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), cached.begin()));
    for (int64_t id : cached) EXPECT_TRUE(id >= 0 && id < 11) << id;
    EXPECT_EQ(model->generate(prompt, 12, s.temperature, s.top_k, s.seed), cached);
  }
  EXPECT_TRUE(model->is_training());
  // Sampling depends on the seed; greedy is top_k 1 and the argmax of the logits.
  EXPECT_NE(model->generate(prompt, 12, 1.5, 0, 3), model->generate(prompt, 12, 1.5, 0, 4));
  EXPECT_EQ(model->generate(prompt, 12, 0.0, 0, 0), model->generate(prompt, 12, 1.0, 1, 9));
  model->eval();
  const Tensor logits = model->forward(tensor<int64_t>(prompt, {1, 3}));
  const int64_t argmax = loom::argmax(logits.select(0, 0).select(0, 2)).item<int64_t>();
  EXPECT_EQ(model->generate(prompt, 1, 0.0, 0, 0).back(), argmax);
}

TEST(GPT, GenerateChecksItsArguments) {
  auto model = random_model();
  const std::vector<int64_t> prompt = {1};
  EXPECT_LOOM_ERROR(model->generate({}, 3), ValueError, {"prompt is empty"});
  EXPECT_LOOM_ERROR(model->generate(prompt, -1), ValueError, {"max_new_tokens", "-1"});
  EXPECT_LOOM_ERROR(model->generate(prompt, 1, -0.5), ValueError, {"temperature", "-0.5"});
  EXPECT_LOOM_ERROR(model->generate(prompt, 1, 1.0, -2), ValueError, {"top_k", "-2"});
  const std::vector<int64_t> bad = {1, 11};
  EXPECT_LOOM_ERROR(model->generate(bad, 1), IndexError, {"11"});
  EXPECT_EQ(model->generate(prompt, 0), prompt);
}

// ------------------------------------------------------------------ checkpoints

void expect_same_state(const GPT& a, const GPT& b) {
  const NamedTensors sa = a.hf_state_dict(), sb = b.hf_state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(sa[i].second.dtype(), sb[i].second.dtype()) << sa[i].first;
    EXPECT_EQ(sa[i].second.to_vector<double>(), sb[i].second.to_vector<double>()) << sa[i].first;
  }
}

class GPTCheckpoints : public ::testing::Test {
 protected:
  const test::ScratchDir dir_;  // Note [Test scratch directories]
  const std::string path_ = dir_.file("gpt.safetensors");
};

TEST_F(GPTCheckpoints, RoundTripIsBitExact) {
  std::string vocabulary = "\n !abc";
  vocabulary += '\0';
  vocabulary += '\xff';
  vocabulary += '"';
  vocabulary += '\\';
  GPTTokenizerInfo byte{"byte", vocabulary, {}};
  for (DType dtype : {kFloat32, kFloat64}) {
    auto model = random_model();
    model->to(dtype);
    save_gpt(path_, *model, byte, {{"step", "120"}, {"loss", "1.25"}});
    const SafetensorsFile file = load_safetensors(path_);
    EXPECT_EQ(file.metadata.at("format"), "pt");
    EXPECT_EQ(file.metadata.at("loom.tokenizer"), "byte");
    EXPECT_EQ(file.metadata.at("loom.tokenizer.vocabulary"),
              "0a2021616263"
              "00ff225c");
    const nlohmann::json config = nlohmann::json::parse(file.metadata.at("loom.gpt.config"));
    EXPECT_EQ(config["n_positions"], 8);
    EXPECT_EQ(config["n_embd"], 12);
    EXPECT_EQ(config["bias"], true);
    EXPECT_TRUE(file.contains("lm_head.weight"));
    EXPECT_EQ(file.tensors.size(), model->hf_state_dict().size());

    const GPTCheckpoint loaded = load_gpt(path_);
    EXPECT_EQ(loaded.model->config, model->config);
    EXPECT_EQ(loaded.tokenizer, byte);
    EXPECT_EQ(loaded.metadata.at("step"), "120");
    EXPECT_EQ(loaded.metadata.at("loss"), "1.25");
    expect_same_state(*loaded.model, *model);
    EXPECT_TRUE(loaded.model->hf_state_dict().back().second.is_same(
        loaded.model->transformer->wte->weight));
  }
  GPTTokenizerInfo bpe{
      "gpt2-bpe", "", {{"vocab.json", std::string(64, 'a')}, {"merges.txt", std::string(64, '0')}}};
  GPTConfig c = tiny_config();
  c.bias = false;
  c.dropout = 0.1;
  auto model = random_model(c);
  save_gpt(path_, *model, bpe);
  const GPTCheckpoint loaded = load_gpt(path_);
  EXPECT_EQ(loaded.tokenizer, bpe);
  EXPECT_EQ(loaded.model->config, c);
  expect_same_state(*loaded.model, *model);
}

TEST_F(GPTCheckpoints, LoadingLeavesTheDefaultGeneratorAlone) {
  save_gpt(path_, *random_model());
  manual_seed(77);
  const Tensor expected = randn({4});
  manual_seed(77);
  load_gpt(path_);
  EXPECT_EQ(randn({4}).to_vector<float>(), expected.to_vector<float>());
}

// The forms others write: save_pretrained's (no lm_head.weight) and the hub's gpt2 file
// (GPT2Model's keys without "transformer.", with each layer's causal-mask buffers).
TEST_F(GPTCheckpoints, ReadsHuggingFacesForms) {
  auto model = random_model();
  NamedTensors no_head = without_head(model->hf_state_dict());
  save_safetensors(path_, no_head, {{"format", "pt"}});
  EXPECT_LOOM_ERROR(load_gpt(path_), ValueError, {"loom.gpt.config", "read_hf_config"});
  expect_same_state(*load_gpt(path_, tiny_config()).model, *model);

  NamedTensors hub;
  for (const auto& [key, t] : no_head) {
    hub.emplace_back(key.substr(std::string("transformer.").size()), t);
    if (key.ends_with("ln_1.weight")) {  // the buffers come first in each layer of such files
      const std::string layer = key.substr(12, key.size() - 12 - std::string("ln_1.weight").size());
      hub.emplace_back(layer + "attn.bias", ones({1, 1, 8, 8}, kUInt8));
      hub.emplace_back(layer + "attn.masked_bias", full({}, -1e4, kFloat32));
    }
  }
  ASSERT_EQ(hub[1].first, "wpe.weight");
  ASSERT_EQ(hub[3].first, "h.0.attn.bias");
  save_safetensors(path_, hub, {{"format", "pt"}});
  const GPTCheckpoint loaded = load_gpt(path_, tiny_config());
  expect_same_state(*loaded.model, *model);
  EXPECT_EQ(loaded.tokenizer, GPTTokenizerInfo{});
  const Tensor idx = tensor<int64_t>({1, 2, 3}, {1, 3});
  EXPECT_TRUE(tensors_close(loaded.model->forward(idx), model->forward(idx), 0, 0));
}

TEST_F(GPTCheckpoints, ErrorsNameTheKeyAndTheShapes) {
  auto model = random_model();
  const NamedTensors state = model->hf_state_dict();
  auto write_with = [&](const std::function<void(NamedTensors&)>& edit) {
    NamedTensors s = state;
    edit(s);
    save_safetensors(path_, s, {{"format", "pt"}});
  };
  const GPTConfig c = tiny_config();

  write_with([](NamedTensors& s) { s[4].second = zeros({12, 30}, kFloat64); });
  ASSERT_EQ(state[4].first, "transformer.h.0.attn.c_attn.weight");
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ShapeError,
                    {"transformer.h.0.attn.c_attn.weight", "[12, 30]", "[12, 36]"});
  write_with([](NamedTensors& s) { s.erase(s.begin() + 5); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ValueError,
                    {"missing key: transformer.h.0.attn.c_attn.bias"});
  write_with([](NamedTensors& s) { s.emplace_back("transformer.h.2.ln_1.weight", ones({12})); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ValueError,
                    {"unexpected key: transformer.h.2.ln_1.weight"});
  write_with([](NamedTensors& s) { s.back().second = zeros({11, 12}, kFloat64); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ValueError, {"lm_head.weight", "ties"});
  write_with([](NamedTensors& s) { s.back().second = zeros({12, 12}, kFloat64); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ShapeError, {"lm_head.weight", "[12, 12]", "[11, 12]"});
  write_with([](NamedTensors& s) { s.emplace_back("wpe.weight", s[1].second); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ValueError, {"transformer.wpe.weight", "twice"});
  write_with([](NamedTensors& s) { s.erase(s.begin()); });
  EXPECT_LOOM_ERROR(load_gpt(path_, c), ValueError, {"transformer.wte.weight"});
  GPTConfig bigger = c;
  bigger.block_size = 16;
  write_with([](NamedTensors&) {});
  EXPECT_LOOM_ERROR(load_gpt(path_, bigger), ShapeError,
                    {"transformer.wpe.weight", "[8, 12]", "[16, 12]"});

  // A loom file's own config wins, and must agree with a given one.
  save_gpt(path_, *model);
  EXPECT_LOOM_ERROR(load_gpt(path_, bigger), ValueError, {"differs", "\"n_positions\":16"});
  EXPECT_NO_THROW(load_gpt(path_, c));

  EXPECT_LOOM_ERROR(save_gpt(path_, *model, {}, {{"format", "x"}}), ValueError, {"'format'"});
  EXPECT_LOOM_ERROR(save_gpt(path_, *model, {}, {{"loom.gpt.config", "{}"}}), ValueError,
                    {"loom.gpt.config"});
  EXPECT_LOOM_ERROR(save_gpt(path_, *model, {"byte", std::string(12, 'a'), {}}), ValueError,
                    {"12 bytes", "vocab_size=11"});
  EXPECT_LOOM_ERROR(save_gpt(path_, *model, {"gpt2-bpe", "", {{"vocab.json", "abc"}}}), ValueError,
                    {"vocab.json", "sha256"});
  EXPECT_LOOM_ERROR(save_gpt(path_, *model, {"sentencepiece", "", {}}), ValueError,
                    {"sentencepiece"});
  save_safetensors(path_, state,
                   {{"format", "pt"},
                    {"loom.gpt.config", gpt_config_to_json(c)},
                    {"loom.tokenizer", "byte"},
                    {"loom.tokenizer.vocabulary", "0g"}});
  EXPECT_LOOM_ERROR(load_gpt(path_), ValueError, {"loom.tokenizer.vocabulary", "hex"});
  save_safetensors(path_, state, {{"loom.gpt.config", R"({"vocab_size": 11})"}});
  EXPECT_LOOM_ERROR(load_gpt(path_), ValueError, {"n_positions", "missing"});
}

// ------------------------------------------------------------------ config.json

TEST_F(GPTCheckpoints, HuggingFaceConfigJson) {
  GPTConfig c = tiny_config();
  c.dropout = 0.25;
  const std::string path = dir_.file("config.json");
  write_hf_config(path, c);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["n_positions"], 8);
  EXPECT_EQ(j["n_embd"], 12);
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_EQ(j["n_head"], 3);
  EXPECT_EQ(j["vocab_size"], 11);
  EXPECT_EQ(j["attn_pdrop"], 0.25);
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(read_hf_config(path), c);

  c.bias = false;
  EXPECT_LOOM_ERROR(write_hf_config(path, c), ValueError, {"bias=false"});
  auto write_json = [&](const std::string& text) { std::ofstream(path) << text; };
  write_json(R"({"n_embd": 12, "n_layer": 2, "n_head": 3, "n_positions": 8, "vocab_size": 11})");
  EXPECT_EQ(read_hf_config(path).dropout, 0.1);  // GPT2Config's default
  write_json(R"({"n_embd": 12, "n_layer": 2, "n_head": 3, "n_positions": 8, "vocab_size": 11,
                 "attn_pdrop": 0.0, "resid_pdrop": 0.1, "embd_pdrop": 0.1})");
  EXPECT_LOOM_ERROR(read_hf_config(path), ValueError, {"attn_pdrop", "resid_pdrop"});
  write_json(R"({"n_embd": 12, "n_layer": 2, "n_head": 3, "vocab_size": 11})");
  EXPECT_LOOM_ERROR(read_hf_config(path), ValueError, {"n_positions", "missing"});
  write_json(R"({"n_embd": 12, "n_layer": 2, "n_head": 3, "n_positions": 8, "vocab_size": 11,
                 "activation_function": "relu"})");
  EXPECT_LOOM_ERROR(read_hf_config(path), ValueError, {"activation_function", "relu"});
  write_json(R"({"n_embd": 12, "n_layer": 2, "n_head": 5, "n_positions": 8, "vocab_size": 11})");
  EXPECT_LOOM_ERROR(read_hf_config(path), ValueError, {"n_embd (12)", "n_head (5)"});
  EXPECT_THROW(read_hf_config(dir_.file("absent.json")), IOError);
}

}  // namespace
}  // namespace loom::nn
