// nn/gpt.cpp — GPT-2 (nn/gpt.h): Conv1D, the attention, MLP and block modules, the model with
// its KV cache and sampler, and its checkpoints (safetensors with Hugging Face's keys, the
// configuration and tokenizer in __metadata__, and Hugging Face's config.json).

#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "autograd/checkpoint.h"
#include "autograd/graph.h"
#include "autograd/ops.h"
#include "nn/init.h"
#include "tensor/atomic_file.h"
#include "tensor/random.h"

namespace loom::nn {

namespace {

void check_positive(const char* what, int64_t value) {
  LOOM_CHECK(value > 0, ValueError, "GPTConfig: ", what, " must be positive; got ", value);
}

// Hugging Face's nn.ModuleList: children "0", "1", ..., no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void append(ModulePtr module) {
    register_module(std::to_string(named_children().size()), std::move(module));
  }
};

// lm_head: logits = x wte^T, reading the embedding's weight (Note [GPT's tied head]). Prints as
// Hugging Face's Linear(in_features=C, out_features=V, bias=False).
class TiedHead : public Module {
 public:
  explicit TiedHead(std::shared_ptr<Embedding> wte) : Module("Linear"), wte_(std::move(wte)) {}
  Tensor forward(const Tensor& x) override { return linear(x, wte_->weight); }
  std::string extra_repr() const override {
    return detail::str("in_features=", wte_->embedding_dim, ", out_features=", wte_->num_embeddings,
                       ", bias=False");
  }

 private:
  std::shared_ptr<Embedding> wte_;
};

constexpr double kInitStd = 0.02;  // Hugging Face's initializer_range, nanoGPT's std
constexpr double kLayerNormEps = 1e-5;

LayerNormOptions layer_norm_options(const GPTConfig& config) {
  LayerNormOptions o;
  o.eps = kLayerNormEps;
  o.bias = config.bias;
  return o;
}

}  // namespace

// ------------------------------------------------------------------ GPTConfig

GPTConfig GPTConfig::gpt2_small() {
  GPTConfig c;
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  return c;
}

void GPTConfig::validate() const {
  check_positive("vocab_size", vocab_size);
  check_positive("block_size", block_size);
  check_positive("n_embd", n_embd);
  check_positive("n_layer", n_layer);
  check_positive("n_head", n_head);
  LOOM_CHECK(n_embd % n_head == 0, ValueError, "GPTConfig: n_embd (", n_embd,
             ") must be a multiple of n_head (", n_head, ")");
  LOOM_CHECK(dropout >= 0 && dropout < 1, ValueError, "GPTConfig: dropout must be in [0, 1); got ",
             dropout);
}

// ------------------------------------------------------------------ Conv1D

Conv1D::Conv1D(int64_t in, int64_t out, bool with_bias)
    : Module("Conv1D"), in_features(in), out_features(out) {
  LOOM_CHECK(in > 0 && out > 0, ValueError,
             "Conv1D: in_features and out_features must be positive; got ", in, " and ", out);
  weight = register_parameter("weight", empty({in, out}));
  bias = register_parameter("bias", with_bias ? zeros({out}) : Tensor());
  init::normal_(weight, 0.0, kInitStd);
}

// y = b + x2 @ W over x2 = x [N, in] (leading dims flattened), as Hugging Face's torch.addmm
Tensor Conv1D::forward(const Tensor& x) {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == in_features, ShapeError, "Conv1D: expected x [..., ",
             in_features, "]; got x=", x.sizes(), " weight=", weight.sizes());
  const Tensor x2 = x.dim() == 2 ? x : reshape(x, {-1, in_features});
  const Tensor y = bias.defined() ? addmm(bias, x2, weight) : matmul(x2, weight);
  if (x.dim() == 2) return y;
  Shape shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(out_features);
  return reshape(y, shape);
}

std::string Conv1D::extra_repr() const {
  return detail::str("nf=", out_features, ", nx=", in_features);
}

// ------------------------------------------------------------------ attention, MLP, block

// Note [GPT's KV cache]
// A layer's cache holds the keys and values of every position seen so far, k and v
// [B, H, T_cached, D]. A call with T_new positions computes their q, k, v, appends k and v
// (a cat along T: a copy per call, which keeps the tensors plain and autograd-safe) and attends
// from the new queries to all T_cached + T_new keys. Query i of the call sits at position
// T_cached + i and may see keys j <= T_cached + i:
// - an empty cache (the prefill): the causal mask, is_causal (L = S, so the op's top-left
//   aligned triangle is the right one);
// - one new position: every key, no mask;
// - several new positions after cached ones: a boolean [T_new, T_cached + T_new] mask with that
//   bottom-right aligned triangle (is_causal would align it top-left, which is wrong here).
// Positions only grow: past block_size the sampler rebuilds the cache from the last block_size
// tokens, since every cached key was computed at a position that then shifts.

GPTAttention::GPTAttention(const GPTConfig& config)
    : Module("GPT2Attention"), n_head(config.n_head), dropout_p(config.dropout) {
  c_attn = register_module("c_attn", make<Conv1D>(config.n_embd, 3 * config.n_embd, config.bias));
  c_proj = register_module("c_proj", make<Conv1D>(config.n_embd, config.n_embd, config.bias));
  attn_dropout = register_module("attn_dropout", make<Dropout>(config.dropout));
  resid_dropout = register_module("resid_dropout", make<Dropout>(config.dropout));
}

Tensor GPTAttention::forward(const Tensor& x) { return forward(x, nullptr); }

Tensor GPTAttention::forward(const Tensor& x, KVCache::Layer* layer) {
  LOOM_CHECK(x.dim() == 3 && x.size(2) == c_attn->in_features, ShapeError,
             "GPT2Attention: expected x [B, T, ", c_attn->in_features, "]; got x=", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_head;
  // [B, T, 3C] -> q, k, v [B, T, C] (views) -> [B, H, T, D] (views with a unit last stride)
  const std::vector<Tensor> qkv = split(c_attn->forward(x), C, 2);
  auto heads = [&](const Tensor& t) { return t.view({B, T, n_head, D}).transpose(1, 2); };
  const Tensor q = heads(qkv[0]);
  Tensor k = heads(qkv[1]), v = heads(qkv[2]);
  const double p = is_training() ? dropout_p : 0.0;

  Tensor mask;
  bool is_causal = true;
  if (layer != nullptr) {  // Note [GPT's KV cache]
    const int64_t past = layer->k.defined() ? layer->k.size(2) : 0;
    if (past > 0) {
      LOOM_CHECK(layer->k.size(0) == B, ShapeError, "GPT2Attention: the cache holds batch ",
                 layer->k.size(0), "; got x=", x.sizes());
      k = cat({layer->k, k}, 2);
      v = cat({layer->v, v}, 2);
      is_causal = false;
      if (T > 1) {
        std::vector<uint8_t> allowed(static_cast<size_t>(T * (past + T)));
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j < past + T; ++j)
            allowed[static_cast<size_t>(i * (past + T) + j)] = j <= past + i;
        mask = from_data(allowed.data(), {T, past + T}, kBool).to(x.device());
      }
    }
    layer->k = k;
    layer->v = v;
  }
  const Tensor y = scaled_dot_product_attention(q, k, v, mask, p, is_causal);  // [B, H, T, D]
  // The op lays y out as [B, T, H, D] (autograd/ops/attention.h): this reshape is a view.
  return resid_dropout->forward(c_proj->forward(y.transpose(1, 2).reshape({B, T, C})));
}

GPTMLP::GPTMLP(const GPTConfig& config) : Module("GPT2MLP") {
  c_fc = register_module("c_fc", make<Conv1D>(config.n_embd, 4 * config.n_embd, config.bias));
  c_proj = register_module("c_proj", make<Conv1D>(4 * config.n_embd, config.n_embd, config.bias));
  act = register_module("act", make<GELU>("tanh"));
  dropout = register_module("dropout", make<Dropout>(config.dropout));
}

Tensor GPTMLP::forward(const Tensor& x) {
  return dropout->forward(c_proj->forward(act->forward(c_fc->forward(x))));
}

GPTBlock::GPTBlock(const GPTConfig& config) : Module("GPT2Block") {
  ln_1 = register_module("ln_1", make<LayerNorm>(config.n_embd, layer_norm_options(config)));
  attn = register_module("attn", make<GPTAttention>(config));
  ln_2 = register_module("ln_2", make<LayerNorm>(config.n_embd, layer_norm_options(config)));
  mlp = register_module("mlp", make<GPTMLP>(config));
}

Tensor GPTBlock::forward(const Tensor& x) { return forward(x, nullptr); }

Tensor GPTBlock::forward(const Tensor& x, KVCache::Layer* layer) {
  const Tensor h = x + attn->forward(ln_1->forward(x), layer);
  return h + mlp->forward(ln_2->forward(h));
}

int64_t KVCache::length() const {
  return layers.empty() || !layers[0].k.defined() ? 0 : layers[0].k.size(2);
}

// ------------------------------------------------------------------ the model

GPTTransformer::GPTTransformer(const GPTConfig& config) : Module("GPT2Model") {
  wte = register_module("wte", make<Embedding>(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", make<Embedding>(config.block_size, config.n_embd));
  drop = register_module("drop", make<Dropout>(config.dropout));
  auto blocks = make<ModuleList>();
  for (int64_t i = 0; i < config.n_layer; ++i) {
    h.push_back(make<GPTBlock>(config));
    blocks->append(h.back());
  }
  register_module("h", blocks);
  ln_f = register_module("ln_f", make<LayerNorm>(config.n_embd, layer_norm_options(config)));
}

namespace {
const GPTConfig& validated(const GPTConfig& config) {
  config.validate();
  return config;
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

GPT::GPT(GPTConfig cfg) : Module("GPT2LMHeadModel"), config(validated(cfg)) {
  transformer = register_module("transformer", make<GPTTransformer>(config));
  lm_head = register_module("lm_head", ModulePtr(make<TiedHead>(transformer->wte)));
  // GPT-2's initialisation (Hugging Face's _init_weights, nanoGPT's _init_weights), in key
  // order: the residual projections scaled down by sqrt(2 n_layer), one per residual add.
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const auto& [name, p] : named_parameters()) {
    if (ends_with(name, "c_proj.weight"))
      init::normal_(p, 0.0, residual_std);
    else if (p.dim() == 2)
      init::normal_(p, 0.0, kInitStd);
    else if (ends_with(name, ".bias"))
      init::zeros_(p);
    else
      init::ones_(p);  // the LayerNorms' weights
  }
}

Tensor GPT::logits(const Tensor& idx, KVCache* cache) {
  LOOM_CHECK(idx.dim() == 2, ShapeError, "GPT: expected idx [B, T]; got idx=", idx.sizes());
  LOOM_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, DTypeError,
             "GPT: expected int64 token ids; got ", idx.dtype(), " idx=", idx.sizes());
  const int64_t T = idx.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  LOOM_CHECK(idx.size(0) > 0 && T > 0, ShapeError,
             "GPT: idx [B, T] must be non-empty; got idx=", idx.sizes());
  if (past == 0)
    LOOM_CHECK(T <= config.block_size, ShapeError, "GPT: a sequence of T=", T,
               " is longer than block_size=", config.block_size);
  else
    LOOM_CHECK(past + T <= config.block_size, ShapeError, "GPT: the cache holds ", past,
               " positions and idx adds T=", T, ": ", past + T,
               " is more than block_size=", config.block_size);
  if (past > 0)
    LOOM_CHECK(cache->layers[0].k.size(0) == idx.size(0), ShapeError, "GPT: the cache holds batch ",
               cache->layers[0].k.size(0), "; got idx=", idx.sizes());
  if (cache != nullptr && cache->layers.size() != transformer->h.size()) {
    LOOM_CHECK(past == 0, ValueError, "GPT: the cache has ", cache->layers.size(),
               " layers; this model has ", transformer->h.size());
    cache->layers.assign(transformer->h.size(), {});
  }

  const Tensor pos = arange(static_cast<double>(past), static_cast<double>(past + T), 1.0, kInt64)
                         .to(idx.device());
  Tensor x = transformer->drop->forward(transformer->wte->forward(idx.contiguous()) +
                                        transformer->wpe->forward(pos));  // [B, T, C]
  const bool recompute = gradient_checkpointing_ && cache == nullptr && autograd::grad_enabled();
  for (size_t i = 0; i < transformer->h.size(); ++i) {
    GPTBlock& block = *transformer->h[i];
    // Without a cache, through the module's hooks (Module::operator()).
    if (recompute)
      x = checkpoint([&block](const Tensor& in) { return block(in); }, x);
    else if (cache != nullptr)
      x = block.forward(x, &cache->layers[i]);
    else
      x = block(x);
  }
  return lm_head->forward(transformer->ln_f->forward(x));  // [B, T, V]
}

Tensor GPT::forward(const Tensor& idx) { return logits(idx, nullptr); }

Tensor GPT::forward(const Tensor& idx, KVCache& cache) { return logits(idx, &cache); }

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  LOOM_CHECK(targets.defined() && targets.sizes() == idx.sizes(), ShapeError,
             "GPT: targets must have idx's shape; got idx=", idx.sizes(),
             " targets=", targets.defined() ? targets.sizes() : Shape{});
  const Tensor out = forward(idx);
  return cross_entropy(out.reshape({-1, config.vocab_size}), targets.reshape({-1}));
}

NamedTensors GPT::hf_state_dict() const {
  NamedTensors state = state_dict();
  state.emplace_back("lm_head.weight", transformer->wte->weight);
  return state;
}

// ------------------------------------------------------------------ generation

namespace {

// One id from a row of logits (Philox for the draw: counter `gen.reserve(1)`, 53 bits of lanes
// 0 and 1 as the uniform), as GPT::generate describes.
int64_t sample_next(const std::vector<double>& row, double temperature, int64_t top_k,
                    Generator& gen) {
  const auto n = static_cast<int64_t>(row.size());
  if (temperature == 0.0) return std::max_element(row.begin(), row.end()) - row.begin();
  std::vector<double> z(row.size());
  for (size_t i = 0; i < row.size(); ++i) z[i] = row[i] / temperature;
  if (top_k > 0 && top_k < n) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<double>());
    const double kth = sorted[static_cast<size_t>(top_k - 1)];
    for (double& value : z)
      if (value < kth) value = -std::numeric_limits<double>::infinity();
  }
  const double top = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (double& value : z) total += (value = std::exp(value - top));
  const auto lanes = philox4x32(gen.seed(), gen.reserve(1));
  const double target = uniform_double(lanes[0], lanes[1]) * total;
  double cumulative = 0;
  int64_t last_possible = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (z[static_cast<size_t>(i)] == 0) continue;
    cumulative += z[static_cast<size_t>(i)];
    last_possible = i;
    if (target < cumulative) return i;
  }
  return last_possible;  // rounding left target at the very top
}

// Restores a module's training mode when it goes out of scope.
class TrainingModeGuard {
 public:
  explicit TrainingModeGuard(Module& m) : module_(m), was_training_(m.is_training()) {}
  ~TrainingModeGuard() { module_.train(was_training_); }
  TrainingModeGuard(const TrainingModeGuard&) = delete;
  TrainingModeGuard& operator=(const TrainingModeGuard&) = delete;

 private:
  Module& module_;
  bool was_training_;
};

}  // namespace

std::vector<int64_t> GPT::generate(std::span<const int64_t> prompt, int64_t max_new_tokens,
                                   double temperature, int64_t top_k, uint64_t seed,
                                   bool use_cache) {
  LOOM_CHECK(!prompt.empty(), ValueError, "GPT::generate: the prompt is empty");
  LOOM_CHECK(max_new_tokens >= 0, ValueError,
             "GPT::generate: max_new_tokens must be non-negative; got ", max_new_tokens);
  LOOM_CHECK(std::isfinite(temperature) && temperature >= 0, ValueError,
             "GPT::generate: temperature must be finite and non-negative; got ", temperature);
  LOOM_CHECK(top_k >= 0, ValueError, "GPT::generate: top_k must be non-negative (0: all); got ",
             top_k);
  autograd::NoGradGuard no_grad;
  TrainingModeGuard mode(*this);
  eval();
  const Device device = transformer->wte->weight.device();
  auto ids_tensor = [&](std::span<const int64_t> ids) {
    return tensor(std::vector<int64_t>(ids.begin(), ids.end()),
                  {1, static_cast<int64_t>(ids.size())})
        .to(device);
  };

  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  Generator gen(seed);
  KVCache cache;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    Tensor out;  // [1, T_new, V]
    if (use_cache && cache.length() > 0 && cache.length() < config.block_size) {
      out = forward(ids_tensor(std::span<const int64_t>(tokens).last(1)), cache);
    } else {  // the first step, every step without a cache, and a full cache: the whole window
      const size_t window = std::min(tokens.size(), static_cast<size_t>(config.block_size));
      const Tensor idx = ids_tensor(std::span<const int64_t>(tokens).last(window));
      cache.clear();
      out = use_cache ? forward(idx, cache) : forward(idx);
    }
    const Tensor last = out.select(0, 0).select(0, out.size(1) - 1).to(kCPU);
    tokens.push_back(sample_next(last.to_vector<double>(), temperature, top_k, gen));
  }
  return tokens;
}

// ------------------------------------------------------------------ configuration as JSON

namespace {

using json = nlohmann::json;

json parse_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw ValueError(detail::str(what, ": not valid JSON (", e.what(), ")"));
  }
}

int64_t int_field(const json& j, const std::string& key, const std::string& what) {
  LOOM_CHECK(j.contains(key), ValueError, what, ": the field '", key, "' is missing");
  LOOM_CHECK(j[key].is_number_integer(), ValueError, what, ": the field '", key,
             "' must be an integer; got ", j[key].dump());
  return j[key].get<int64_t>();
}

double number_field(const json& j, const std::string& key, const std::string& what,
                    double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  LOOM_CHECK(j[key].is_number(), ValueError, what, ": the field '", key, "' must be a number; got ",
             j[key].dump());
  return j[key].get<double>();
}

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return "float32";
    case kFloat64:
      return "float64";
    case kFloat16:
      return "float16";
    case kBFloat16:
      return "bfloat16";
    default:
      break;
  }
  throw DTypeError(detail::str("write_hf_config: a model's dtype must be floating; got ", dtype));
}

}  // namespace

std::string gpt_config_to_json(const GPTConfig& c) {
  nlohmann::ordered_json j;
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.block_size;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["dropout"] = c.dropout;
  j["bias"] = c.bias;
  return j.dump();
}

GPTConfig gpt_config_from_json(const std::string& text) {
  const std::string what = "GPT config";
  const json j = parse_json(text, what);
  LOOM_CHECK(j.is_object(), ValueError, what, ": expected a JSON object; got ", text);
  GPTConfig c;
  c.vocab_size = int_field(j, "vocab_size", what);
  c.block_size = int_field(j, "n_positions", what);
  c.n_embd = int_field(j, "n_embd", what);
  c.n_layer = int_field(j, "n_layer", what);
  c.n_head = int_field(j, "n_head", what);
  c.dropout = number_field(j, "dropout", what, 0.0);
  if (j.contains("bias")) {
    LOOM_CHECK(j["bias"].is_boolean(), ValueError, what,
               ": the field 'bias' must be true or false; got ", j["bias"].dump());
    c.bias = j["bias"].get<bool>();
  }
  c.validate();
  return c;
}

void write_hf_config(const std::string& path, const GPTConfig& c, DType dtype) {
  c.validate();
  LOOM_CHECK(c.bias, ValueError, "write_hf_config: '", path,
             "': a GPT without biases (bias=false) has no Hugging Face GPT2Config");
  nlohmann::ordered_json j;
  j["activation_function"] = "gelu_new";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["attn_pdrop"] = c.dropout;
  j["embd_pdrop"] = c.dropout;
  j["initializer_range"] = kInitStd;
  j["layer_norm_epsilon"] = kLayerNormEps;
  j["model_type"] = "gpt2";
  j["n_embd"] = c.n_embd;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;
  j["n_layer"] = c.n_layer;
  j["n_positions"] = c.block_size;
  j["reorder_and_upcast_attn"] = false;
  j["resid_pdrop"] = c.dropout;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  const std::string text = j.dump(2) + "\n";
  AtomicFile file(path, "write_hf_config");
  file.write(text.data(), text.size());
  file.commit();
}

GPTConfig read_hf_config(const std::string& path) {
  const std::string what = detail::str("read_hf_config: '", path, "'");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), IOError, what, ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  const json j = parse_json(text.str(), what);
  LOOM_CHECK(j.is_object(), ValueError, what, ": expected a JSON object");
  if (j.contains("model_type"))
    LOOM_CHECK(j["model_type"] == "gpt2", ValueError, what, ": model_type must be \"gpt2\"; got ",
               j["model_type"].dump());
  GPTConfig c;
  c.vocab_size = int_field(j, "vocab_size", what);
  c.block_size = int_field(j, "n_positions", what);
  c.n_embd = int_field(j, "n_embd", what);
  c.n_layer = int_field(j, "n_layer", what);
  c.n_head = int_field(j, "n_head", what);
  // GPT2Config's defaults where a field is absent: 0.1 for each dropout.
  c.dropout = number_field(j, "resid_pdrop", what, 0.1);
  for (const char* key : {"attn_pdrop", "embd_pdrop"})
    LOOM_CHECK(number_field(j, key, what, 0.1) == c.dropout, ValueError, what, ": ", key, " (",
               number_field(j, key, what, 0.1), ") differs from resid_pdrop (", c.dropout,
               "); loom's GPT has one dropout");
  if (j.contains("activation_function")) {
    const json& act = j["activation_function"];
    LOOM_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", ValueError, what,
               ": activation_function must be a tanh GELU (gelu_new); got ", act.dump());
  }
  LOOM_CHECK(number_field(j, "layer_norm_epsilon", what, kLayerNormEps) == kLayerNormEps,
             ValueError, what, ": layer_norm_epsilon must be 1e-05; got ",
             j["layer_norm_epsilon"].dump());
  if (j.contains("n_inner") && !j["n_inner"].is_null())
    LOOM_CHECK(int_field(j, "n_inner", what) == 4 * c.n_embd, ValueError, what, ": n_inner (",
               j["n_inner"].dump(), ") must be 4 n_embd (", 4 * c.n_embd, ") or null");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (j.contains(key))
      LOOM_CHECK(j[key] == false, ValueError, what, ": ", key, " must be false; got ",
                 j[key].dump());
  if (j.contains("scale_attn_weights"))
    LOOM_CHECK(j["scale_attn_weights"] == true, ValueError, what,
               ": scale_attn_weights must be true; got ", j["scale_attn_weights"].dump());
  c.validate();
  return c;
}

// ------------------------------------------------------------------ checkpoints

// Note [GPT checkpoints]
// A loom GPT file is a safetensors file with Hugging Face's GPT2LMHeadModel keys and layouts
// (hf_state_dict(): transformer.* then lm_head.weight, a copy of wte's values), so
// GPT2LMHeadModel.from_pretrained loads it beside a write_hf_config config.json. Its
// __metadata__ holds:
//   format                      "pt" (what from_pretrained asks of a safetensors file)
//   loom.gpt.config             gpt_config_to_json: vocab_size, n_positions, n_embd, n_layer,
//                               n_head (config.json's names), dropout, bias
//   loom.tokenizer              "byte" or "gpt2-bpe" (absent: none recorded)
//   loom.tokenizer.vocabulary   "byte": the vocabulary's bytes in id order as lowercase hex, two
//                               digits a byte, so any byte (NUL, newline, 0xff) round-trips
//   loom.tokenizer.files        "gpt2-bpe": a JSON object from each file's name to its sha256
//                               as 64 hex digits (the caller's, e.g. of vocab.json, merges.txt)
// plus the caller's own entries. load_gpt also reads the two forms others write: no
// lm_head.weight (save_pretrained leaves the tied copy out) and GPT2Model's keys without
// "transformer." (the hub's gpt2 model.safetensors), where old files also carry each layer's
// causal-mask buffers attn.bias and attn.masked_bias, which are not weights and are skipped.

namespace {

constexpr const char* kConfigKey = "loom.gpt.config";
constexpr const char* kTokenizerKey = "loom.tokenizer";
constexpr const char* kVocabularyKey = "loom.tokenizer.vocabulary";
constexpr const char* kFilesKey = "loom.tokenizer.files";

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return hex_digit(c) >= 0; });
}

std::string from_hex(const std::string& hex, const std::string& what) {
  LOOM_CHECK(hex.size() % 2 == 0 && is_hex(hex), ValueError, what, ": ", kVocabularyKey,
             " must be hex digits, two a byte; got '", hex.substr(0, 32),
             hex.size() > 32 ? "...'" : "'");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(hex_digit(hex[2 * i]) * 16 + hex_digit(hex[2 * i + 1]));
  return out;
}

void check_tokenizer(const GPTTokenizerInfo& t, const GPTConfig& config, const std::string& what) {
  if (t.kind.empty()) {
    LOOM_CHECK(t.vocabulary.empty() && t.files.empty(), ValueError, what,
               ": a tokenizer vocabulary or files without a tokenizer kind");
  } else if (t.kind == "byte") {
    LOOM_CHECK(
        !t.vocabulary.empty() && static_cast<int64_t>(t.vocabulary.size()) <= config.vocab_size,
        ValueError, what, ": a byte vocabulary of ", t.vocabulary.size(),
        " bytes for vocab_size=", config.vocab_size, " (it needs 1 to vocab_size bytes)");
    LOOM_CHECK(t.files.empty(), ValueError, what, ": a byte tokenizer has no files");
  } else if (t.kind == "gpt2-bpe") {
    LOOM_CHECK(t.vocabulary.empty(), ValueError, what,
               ": a gpt2-bpe tokenizer keeps its vocabulary in its files");
    LOOM_CHECK(!t.files.empty(), ValueError, what, ": a gpt2-bpe tokenizer names its files");
    for (const auto& [name, sha] : t.files)
      LOOM_CHECK(!name.empty() && sha.size() == 64 && is_hex(sha), ValueError, what,
                 ": tokenizer file '", name, "' needs a sha256 of 64 hex digits; got '", sha, "'");
  } else {
    throw ValueError(detail::str(what, ": tokenizer kind must be \"byte\" or \"gpt2-bpe\"; got \"",
                                 t.kind, "\""));
  }
}

GPTTokenizerInfo read_tokenizer(const std::map<std::string, std::string>& meta,
                                const std::string& what) {
  GPTTokenizerInfo t;
  auto it = meta.find(kTokenizerKey);
  if (it == meta.end()) return t;
  t.kind = it->second;
  if (t.kind == "byte") {
    auto v = meta.find(kVocabularyKey);
    LOOM_CHECK(v != meta.end(), ValueError, what, ": a byte tokenizer without ", kVocabularyKey);
    t.vocabulary = from_hex(v->second, what);
  } else if (t.kind == "gpt2-bpe") {
    auto f = meta.find(kFilesKey);
    LOOM_CHECK(f != meta.end(), ValueError, what, ": a gpt2-bpe tokenizer without ", kFilesKey);
    const json files = parse_json(f->second, what + ": " + kFilesKey);
    LOOM_CHECK(files.is_object(), ValueError, what, ": ", kFilesKey,
               " must be a JSON object of file name -> sha256");
    for (const auto& [name, sha] : files.items()) {
      LOOM_CHECK(sha.is_string(), ValueError, what, ": ", kFilesKey, "['", name,
                 "'] must be a string");
      t.files[name] = sha.get<std::string>();
    }
  }
  return t;
}

// Hugging Face's old causal-mask buffers: (transformer.)h.<i>.attn.bias / .attn.masked_bias.
bool is_mask_buffer(const std::string& key) {
  static const std::regex pattern(R"((transformer\.)?h\.[0-9]+\.attn\.(bias|masked_bias))");
  return std::regex_match(key, pattern);
}

}  // namespace

std::map<std::string, std::string> gpt_metadata(const GPTConfig& config,
                                                const GPTTokenizerInfo& tokenizer) {
  check_tokenizer(tokenizer, config, "gpt_metadata");
  std::map<std::string, std::string> meta{{kConfigKey, gpt_config_to_json(config)}};
  if (!tokenizer.kind.empty()) meta[kTokenizerKey] = tokenizer.kind;
  if (tokenizer.kind == "byte") meta[kVocabularyKey] = to_hex(tokenizer.vocabulary);
  if (tokenizer.kind == "gpt2-bpe") meta[kFilesKey] = json(tokenizer.files).dump();
  return meta;
}

std::pair<std::optional<GPTConfig>, GPTTokenizerInfo> read_gpt_metadata(
    const std::map<std::string, std::string>& metadata, const std::string& what) {
  std::optional<GPTConfig> config;
  if (auto it = metadata.find(kConfigKey); it != metadata.end())
    config = gpt_config_from_json(it->second);
  GPTTokenizerInfo tokenizer = read_tokenizer(metadata, what);
  if (config) check_tokenizer(tokenizer, *config, what);
  return {config, tokenizer};
}

double gpt_flops_per_token(const GPTConfig& c, int64_t T) {
  // Every parameter but wpe, exactly: wte (the head is tied to it), the blocks, ln_f.
  const double C = static_cast<double>(c.n_embd), b = c.bias ? 1.0 : 0.0;
  const double norm = C * (1.0 + b);
  const double block = 12.0 * C * C + b * 9.0 * C + 2.0 * norm;
  const double params = static_cast<double>(c.vocab_size) * C + c.n_layer * block + norm;
  return 6.0 * params + 12.0 * c.n_layer * C * static_cast<double>(T);
}

void save_gpt(const std::string& path, const GPT& model, const GPTTokenizerInfo& tokenizer,
              const std::map<std::string, std::string>& extra) {
  const std::string what = detail::str("save_gpt: '", path, "'");
  check_tokenizer(tokenizer, model.config, what);
  std::map<std::string, std::string> meta = extra;
  auto put = [&](const std::string& key, std::string value) {
    LOOM_CHECK(meta.emplace(key, std::move(value)).second, ValueError, what,
               ": the extra metadata key '", key, "' is save_gpt's own");
  };
  put("format", "pt");
  put(kConfigKey, gpt_config_to_json(model.config));
  if (!tokenizer.kind.empty()) put(kTokenizerKey, tokenizer.kind);
  if (tokenizer.kind == "byte") put(kVocabularyKey, to_hex(tokenizer.vocabulary));
  if (tokenizer.kind == "gpt2-bpe") put(kFilesKey, json(tokenizer.files).dump());
  save_safetensors(path, model.hf_state_dict(), meta);
}

GPTCheckpoint load_gpt(const std::string& path, const std::optional<GPTConfig>& given) {
  const std::string what = detail::str("load_gpt: '", path, "'");
  SafetensorsFile file = load_safetensors(path);

  GPTConfig config;
  if (auto it = file.metadata.find(kConfigKey); it != file.metadata.end()) {
    config = gpt_config_from_json(it->second);
    LOOM_CHECK(!given || *given == config, ValueError, what, ": the file's config ", it->second,
               " differs from the one given, ", gpt_config_to_json(*given));
  } else {
    LOOM_CHECK(given.has_value(), ValueError, what, ": the file has no ", kConfigKey,
               " metadata; pass the config (read_hf_config reads a config.json)");
    config = *given;
  }
  config.validate();

  // The file's tensors under loom's (Hugging Face's GPT2LMHeadModel's) keys.
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : file.tensors) {
    if (is_mask_buffer(name)) continue;
    const std::string key =
        name.starts_with("transformer.") || name == "lm_head.weight" ? name : "transformer." + name;
    LOOM_CHECK(tensors.emplace(key, t).second, ValueError, what, ": the tensor '", key,
               "' is in the file twice (with and without the \"transformer.\" prefix)");
  }
  auto wte = tensors.find("transformer.wte.weight");
  LOOM_CHECK(wte != tensors.end(), ValueError, what,
             ": no transformer.wte.weight (nor wte.weight): not a GPT-2 file");
  const Tensor wte_weight = wte->second;
  LOOM_CHECK(is_floating(wte_weight.dtype()), DTypeError, what,
             ": transformer.wte.weight must be floating point; got ", wte_weight.dtype());

  // Building the model draws its initial weights; they are overwritten here, so the caller's
  // default generator is left as it was.
  const Generator::State rng = default_generator().state();
  auto model = std::make_shared<GPT>(config);
  default_generator().set_state(rng);
  model->to(wte_weight.dtype());

  NamedTensors state;
  std::vector<std::string> missing;
  for (const auto& [key, own] : model->state_dict()) {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      missing.push_back(key);
      continue;
    }
    LOOM_CHECK(it->second.sizes() == own.sizes(), ShapeError, what, ": tensor '", key,
               "' has shape ", it->second.sizes(), " in the file; the config needs ", own.sizes());
    LOOM_CHECK(is_floating(it->second.dtype()), DTypeError, what, ": tensor '", key,
               "' must be floating point; got ", it->second.dtype());
    state.emplace_back(key, it->second);
    tensors.erase(it);
  }
  if (auto head = tensors.find("lm_head.weight"); head != tensors.end()) {
    const Tensor& w = wte_weight;
    LOOM_CHECK(head->second.sizes() == w.sizes(), ShapeError, what,
               ": tensor 'lm_head.weight' has shape ", head->second.sizes(),
               "; the tied head needs transformer.wte.weight's ", w.sizes());
    LOOM_CHECK(head->second.dtype() == w.dtype() &&
                   std::memcmp(head->second.data(), w.data(), w.nbytes()) == 0,
               ValueError, what,
               ": lm_head.weight differs from transformer.wte.weight; loom's GPT ties them "
               "(one tensor)");
    tensors.erase(head);
  }
  std::ostringstream problems;
  for (const std::string& key : missing) problems << "\n  missing key: " << key;
  for (const auto& [key, t] : tensors) problems << "\n  unexpected key: " << key;
  LOOM_CHECK(problems.str().empty(), ValueError, what, ": the tensors do not fit the config ",
             gpt_config_to_json(config), ":", problems.str());

  model->load_state_dict(state);
  GPTCheckpoint out;
  out.model = model;
  out.tokenizer = read_tokenizer(file.metadata, what);
  check_tokenizer(out.tokenizer, config, what);
  out.metadata = std::move(file.metadata);
  return out;
}

}  // namespace loom::nn
