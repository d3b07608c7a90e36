// nn/gpt.h — GPT-2 as Hugging Face's GPT2LMHeadModel: the same modules, parameter names and
// layouts ("transformer.h.0.attn.c_attn.weight" [C, 3C] in Conv1D layout, y = x W + b), the
// same math (pre-LayerNorm blocks, learned positions, GELU with the tanh approximation, a
// head tied to the token embedding), so weights move between loom, nanoGPT and transformers
// through safetensors unchanged. Also a KV cache for generation, sampling, and checkpoints that
// carry the configuration and the tokenizer.
//
// Shapes: B, T, C, V, H, D = batch, time, channels (n_embd), vocabulary, heads, C / H.
//
// Note [GPT's tied head]
// lm_head.weight is transformer.wte.weight, one tensor. It is registered once, under
// transformer.wte, so named_parameters() (and an optimizer, DDP, a gradient clip) sees it once,
// as Hugging Face's named_parameters() does (it drops the repeat); the lm_head child holds no
// parameter of its own. Its gradient is the sum of the embedding's and the head's. Module's
// state_dict() therefore lacks lm_head.weight, as the file save_pretrained writes does;
// GPT::hf_state_dict() adds it at the end, which gives Hugging Face's state_dict() keys in its
// order, and is what save_gpt writes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nn/layers.h"

namespace loom::nn {

struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest context: Hugging Face's n_positions
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  double dropout = 0;  // attn_pdrop = resid_pdrop = embd_pdrop
  // false: no bias in any Conv1D or LayerNorm (nanoGPT's option; Hugging Face's GPT-2 has no
  // such option, so such a model has no config.json and its file lacks every *.bias key).
  bool bias = true;

  // GPT-2 small, 124M parameters: vocabulary 50257, 1024 positions, 768 channels, 12 layers,
  // 12 heads, biases.
  static GPTConfig gpt2_small();
  // ValueError naming the field(s) when a size is not positive, n_embd is not a multiple of
  // n_head, or dropout is outside [0, 1).
  void validate() const;
  int64_t head_dim() const { return n_embd / n_head; }
  bool operator==(const GPTConfig&) const = default;
};

// Hugging Face's Conv1D: y = x W + b with weight [in, out] (the transpose of Linear's), bias
// [out]. Weight N(0, 0.02), bias 0 (GPT-2's initialisation; GPT sets the residual projections'
// std).
class Conv1D : public Module {
 public:
  Conv1D(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;  // x [..., in] -> [..., out]
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  Tensor weight, bias;
};

// A layer's cached keys and values, k and v [B, H, T_cached, D] each, for every layer.
struct KVCache {
  struct Layer {
    Tensor k, v;  // undefined while nothing is cached
  };
  std::vector<Layer> layers;

  int64_t length() const;  // T_cached: 0 when empty
  void clear() { layers.clear(); }
};

// Causal self-attention: c_attn makes q, k, v [B, H, T, D] from x [B, T, C]; the heads go
// through loom::scaled_dot_product_attention and c_proj maps them back (Hugging Face's
// GPT2Attention).
class GPTAttention : public Module {
 public:
  explicit GPTAttention(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
  // With a cache: appends this call's keys and values to `layer` and attends to all of them
  // (Note [GPT's KV cache], nn/gpt.cpp).
  Tensor forward(const Tensor& x, KVCache::Layer* layer);

  const int64_t n_head;
  const double dropout_p;
  std::shared_ptr<Conv1D> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;  // attn_dropout: its p goes to the op
};

// c_fc (C -> 4C), GELU (tanh approximation: Hugging Face's "gelu_new"), c_proj (4C -> C),
// dropout.
class GPTMLP : public Module {
 public:
  explicit GPTMLP(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv1D> c_fc, c_proj;
  std::shared_ptr<GELU> act;
  std::shared_ptr<Dropout> dropout;
};

// x + attn(ln_1(x)), then that + mlp(ln_2(that)).
class GPTBlock : public Module {
 public:
  explicit GPTBlock(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
  Tensor forward(const Tensor& x, KVCache::Layer* layer);

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<GPTAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
};

// The "transformer" child (Hugging Face's GPT2Model): wte, wpe, drop, h.0 ... h.{n_layer-1},
// ln_f.
class GPTTransformer : public Module {
 public:
  explicit GPTTransformer(const GPTConfig& config);

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::vector<std::shared_ptr<GPTBlock>> h;  // registered under the child "h" as "0", "1", ...
  std::shared_ptr<LayerNorm> ln_f;
};

class GPT : public Module {
 public:
  // Builds the model in float32 and initialises it as GPT-2 does, from loom's default
  // generator: every weight (embeddings too) N(0, 0.02), the residual projections
  // attn.c_proj.weight and mlp.c_proj.weight N(0, 0.02 / sqrt(2 n_layer)), biases 0,
  // LayerNorms 1 and 0. The config is validated first.
  explicit GPT(GPTConfig config);

  // idx int64 [B, T] with T <= block_size (ShapeError naming T and block_size otherwise; an id
  // outside [0, vocab_size) raises IndexError) -> logits [B, T, V].
  Tensor forward(const Tensor& idx) override;
  // The next positions of the sequences in `cache`: idx [B, T_new] goes at positions
  // T_cached .. T_cached + T_new - 1 (their sum at most block_size, else ShapeError), the
  // cache grows by T_new, and the result is those positions' logits [B, T_new, V]. An empty
  // cache makes this a causal prefill, equal to forward(idx).
  Tensor forward(const Tensor& idx, KVCache& cache);
  // The mean cross entropy of forward(idx) against targets int64 [B, T] (targets equal to
  // -100 are left out, as Hugging Face's labels).
  Tensor loss(const Tensor& idx, const Tensor& targets);

  // prompt followed by max_new_tokens sampled ids (batch 1). Each step: the logits of the last
  // position; temperature 0 takes the argmax (the first, where several tie); otherwise the
  // logits / temperature, restricted to the top_k largest when 0 < top_k < vocab_size (ties
  // with the k-th kept, as nanoGPT's), softmax, and one draw from a Philox generator seeded
  // with `seed` (one counter per token). When the context would pass block_size, only its last
  // block_size tokens are fed, and the cache is rebuilt from them (positions start at 0 again).
  // Runs without gradients and in eval mode (the mode is restored after). use_cache false
  // recomputes the whole context each step: the same ids, slower.
  std::vector<int64_t> generate(std::span<const int64_t> prompt, int64_t max_new_tokens,
                                double temperature = 1.0, int64_t top_k = 0, uint64_t seed = 0,
                                bool use_cache = true);

  // Hugging Face's state_dict(): state_dict() then lm_head.weight (Note [GPT's tied head]).
  NamedTensors hf_state_dict() const;

  // With it on, each block's forward keeps only its input when grad mode is on and recomputes
  // the rest in backward (Note [Activation checkpointing], autograd/checkpoint.h): the same
  // gradients, the activations of one block instead of all. Hugging Face's
  // gradient_checkpointing_enable(). Off by default.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  const GPTConfig config;
  std::shared_ptr<GPTTransformer> transformer;
  ModulePtr lm_head;  // a Linear-shaped view of transformer->wte->weight, no parameter

 private:
  Tensor logits(const Tensor& idx, KVCache* cache);
  bool gradient_checkpointing_ = false;
};

// ------------------------------------------------------------------ checkpoints

// What a checkpoint records of the tokenizer in its __metadata__ (Note [GPT checkpoints],
// nn/gpt.cpp).
struct GPTTokenizerInfo {
  std::string kind;                          // "byte", "gpt2-bpe", or "" (none recorded)
  std::string vocabulary;                    // "byte": the vocabulary's bytes in id order
  std::map<std::string, std::string> files;  // "gpt2-bpe": file name -> sha256 (hex)
  bool operator==(const GPTTokenizerInfo&) const = default;
};

struct GPTCheckpoint {
  std::shared_ptr<GPT> model;
  GPTTokenizerInfo tokenizer;
  std::map<std::string, std::string> metadata;  // the whole __metadata__, as read
};

// The __metadata__ entries a GPT file records of its model and tokenizer (Note [GPT
// checkpoints]): loom.gpt.config and the loom.tokenizer entries, for other files (gpt_train's
// training checkpoints) to carry them too; and back: the config (none where the metadata has
// no loom.gpt.config) and the tokenizer. ValueError naming `what` for malformed entries.
std::map<std::string, std::string> gpt_metadata(const GPTConfig& config,
                                                const GPTTokenizerInfo& tokenizer);
std::pair<std::optional<GPTConfig>, GPTTokenizerInfo> read_gpt_metadata(
    const std::map<std::string, std::string>& metadata, const std::string& what);

// The model FLOPs of one token of a training step at context length T (forward and backward,
// PaLM's count as nanoGPT's estimate_mfu makes it): 6 per parameter other than the position
// embeddings, plus 12 n_layer n_embd T for attention's two products. Note [MFU] in
// apps/gpt_train/train.cpp.
double gpt_flops_per_token(const GPTConfig& config, int64_t T);

// Writes hf_state_dict() (transformer.* and lm_head.weight, in the model's dtype) to `path`,
// atomically, with __metadata__: format "pt", loom.gpt.config (the config as JSON with Hugging
// Face's names), the tokenizer's entries, and `extra` (other entries: step, loss, ...; a key
// that collides with one of those is a ValueError).
void save_gpt(const std::string& path, const GPT& model, const GPTTokenizerInfo& tokenizer = {},
              const std::map<std::string, std::string>& extra = {});

// Reads a GPT-2 safetensors file: loom's, Hugging Face's save_pretrained (no lm_head.weight),
// or GPT2Model's keys without the "transformer." prefix (the hub's gpt2 model.safetensors);
// the causal-mask buffers old files carry (h.{i}.attn.bias, h.{i}.attn.masked_bias) are
// ignored. The config comes from the file's loom.gpt.config, else from `config` (ValueError
// when there is neither, or both and they differ); read_hf_config reads a config.json. The
// model takes the dtype of the file's wte. ValueError names a missing or unexpected key (or an
// lm_head.weight that is not wte's values), ShapeError names the key and both shapes.
GPTCheckpoint load_gpt(const std::string& path,
                       const std::optional<GPTConfig>& config = std::nullopt);

// The config as JSON with Hugging Face's config.json names (n_embd, n_layer, n_head,
// n_positions, vocab_size) plus dropout and bias; and back (ValueError naming a missing or
// ill-typed field).
std::string gpt_config_to_json(const GPTConfig& config);
GPTConfig gpt_config_from_json(const std::string& text);

// Writes a Hugging Face config.json for `config` (model_type gpt2, GPT2LMHeadModel, gelu_new,
// the three dropouts, layer_norm_epsilon 1e-5, torch_dtype float32 or float64 from `dtype`), so
// GPT2LMHeadModel.from_pretrained(dir) loads dir/config.json with a save_gpt'd
// dir/model.safetensors. ValueError for bias false, which Hugging Face cannot express.
void write_hf_config(const std::string& path, const GPTConfig& config, DType dtype = kFloat32);
// A config.json's n_embd, n_layer, n_head, n_positions, vocab_size and dropout (resid_pdrop;
// ValueError when attn_pdrop or embd_pdrop differ from it, or activation_function is not a
// tanh GELU, or layer_norm_epsilon is not 1e-5).
GPTConfig read_hf_config(const std::string& path);

}  // namespace loom::nn
