#!/usr/bin/python3
"""tools/gpt_transformers_check.py — the Python side of loom's GPT interop test
(tests/nn/gpt_transformers_test.cpp), using Hugging Face transformers' GPT2LMHeadModel itself:

  gpt_transformers_check.py score DIR   GPT2LMHeadModel.from_pretrained(DIR) (DIR/config.json and
                                        DIR/model.safetensors, written by loom), in eval mode, on
                                        DIR/batch.safetensors's "idx" and "targets" [B, T]; writes
                                        DIR/scored.safetensors with "logits32", "loss32" (the
                                        model as loaded, float32) and "logits64", "loss64" (the
                                        same weights in float64), and prints {"loss32", "loss64",
                                        "dtype" (as loaded)} as JSON. loss = the mean cross
                                        entropy of the logits against targets (not the model's
                                        own shifted `labels` loss).
  gpt_transformers_check.py save DIR    a seeded GPT2LMHeadModel (vocab 65, 16 positions, 32
                                        channels, 2 layers, 4 heads; every parameter perturbed so
                                        that biases and LayerNorms matter) saved with
                                        save_pretrained(DIR/lm, safe_serialization=True), its
                                        GPT2Model with save_pretrained(DIR/base) (keys without
                                        "transformer."), and DIR/expected.safetensors: "idx"
                                        [2, 9], "logits32", "logits64" in eval mode.

Exit status 3 when torch or transformers is missing, so the caller can skip.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    print(f"missing: {e}", file=sys.stderr)
    sys.exit(3)


def logits_and_loss(model, idx, targets=None):
    with torch.no_grad():
        logits = model(idx).logits
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def score(path):
    batch = load_file(os.path.join(path, "batch.safetensors"))
    model = GPT2LMHeadModel.from_pretrained(path).eval()
    loaded_dtype = str(next(model.parameters()).dtype)
    logits32, loss32 = logits_and_loss(model, batch["idx"], batch["targets"])
    logits64, loss64 = logits_and_loss(model.double(), batch["idx"], batch["targets"])
    save_file({"logits32": logits32, "loss32": loss32, "logits64": logits64, "loss64": loss64},
              os.path.join(path, "scored.safetensors"))
    print(json.dumps({"loss32": loss32.item(), "loss64": loss64.item(),
                      "dtype": loaded_dtype}))


def save(path):
    torch.manual_seed(7)
    config = GPT2Config(vocab_size=65, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.2))
    model.save_pretrained(os.path.join(path, "lm"), safe_serialization=True)
    model.transformer.save_pretrained(os.path.join(path, "base"), safe_serialization=True)
    idx = torch.randint(0, config.vocab_size, (2, 9))
    logits32, _ = logits_and_loss(model, idx)
    logits64, _ = logits_and_loss(model.double(), idx)
    save_file({"idx": idx, "logits32": logits32, "logits64": logits64},
              os.path.join(path, "expected.safetensors"))
    print(json.dumps({"saved": path}))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    {"score": score, "save": save}[mode](path)


if __name__ == "__main__":
    main()
