#!/usr/bin/python3
"""tools/make_gpt_golden.py — writes tests/golden/gpt.safetensors: two tiny GPT-2s (Hugging
Face's GPT2LMHeadModel math, written here with plain torch so torch 1.13 without transformers
runs it) with their weights under Hugging Face's keys, a batch of ids and targets, and the
logits, the loss and the gradients of a few parameters, in float64. loom's tests/nn/gpt_test.cpp
must reproduce them.

Run with the system Python, which has PyTorch:  /usr/bin/python3 tools/make_gpt_golden.py
Where `transformers` is importable (PYTHONPATH=.pydeps, scripts/setup.sh --torch), the script
also loads each biased case's weights into transformers.GPT2LMHeadModel and checks that it gives
the same logits, loss and gradients (the model here follows it; that check says so).

Cases (config in __metadata__ as "<case>.config", JSON with config.json's names):
  gpt         vocab 65, block 16, n_embd 32, n_layer 2, n_head 4, biases;   idx [2, 16]
  gpt_nobias  the same sizes without any bias (nanoGPT's bias=False);      idx [3, 7]
Keys per case: "<case>.<Hugging Face state_dict key>" (transformer.*, lm_head.weight: the same
values as transformer.wte.weight, tied), "<case>.idx", "<case>.targets" (int64 [B, T]),
"<case>.logits" [B, T, V], "<case>.loss" [] (mean cross entropy of logits against targets), and
"<case>.grad.<key>" for the keys in GRAD_KEYS (d loss / d parameter; wte's includes the head's).
The weights are not GPT-2's initialisation (N(0, 0.02) makes nearly uniform logits): every
weight is N(0, 0.3), and biases and LayerNorm parameters are perturbed from 0 and 1, so that each
part of the model moves the logits.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

from make_golden import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "gpt.safetensors")
EPS = 1e-5
GRAD_KEYS = ["transformer.wte.weight", "transformer.wpe.weight",
             "transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.weight",
             "transformer.ln_f.weight", "transformer.ln_f.bias", "transformer.h.0.ln_1.bias"]


def state_keys(cfg):
    """Hugging Face's GPT2LMHeadModel state_dict() keys and shapes, in its order."""
    C, bias = cfg["n_embd"], cfg["bias"]
    keys = [("transformer.wte.weight", [cfg["vocab_size"], C]),
            ("transformer.wpe.weight", [cfg["n_positions"], C])]

    def ln(name):
        return [(name + ".weight", [C])] + ([(name + ".bias", [C])] if bias else [])

    def conv1d(name, n_in, n_out):
        return [(name + ".weight", [n_in, n_out])] + ([(name + ".bias", [n_out])] if bias else [])

    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        keys += ln(p + "ln_1") + conv1d(p + "attn.c_attn", C, 3 * C)
        keys += conv1d(p + "attn.c_proj", C, C) + ln(p + "ln_2")
        keys += conv1d(p + "mlp.c_fc", C, 4 * C) + conv1d(p + "mlp.c_proj", 4 * C, C)
    keys += ln("transformer.ln_f") + [("lm_head.weight", [cfg["vocab_size"], C])]
    return keys


def make_weights(cfg):
    w = {}
    for key, shape in state_keys(cfg):
        if key == "lm_head.weight":
            continue  # tied: the same tensor as transformer.wte.weight
        if len(shape) == 2:
            w[key] = torch.randn(*shape, dtype=torch.float64) * 0.3
        elif key.endswith(".bias"):
            w[key] = torch.randn(*shape, dtype=torch.float64) * 0.1
        else:  # LayerNorm weight
            w[key] = 1 + torch.randn(*shape, dtype=torch.float64) * 0.1
    return {k: v.requires_grad_() for k, v in w.items()}


def gelu_new(x):  # transformers' NewGELUActivation: the tanh approximation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(w, cfg, idx):
    """GPT2LMHeadModel's forward in eval mode (no dropout): logits [B, T, V]."""
    B, T = idx.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    get = w.get  # an absent bias is None, as F.layer_norm and the addmm below take it

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], get(name + ".bias"), EPS)

    def conv1d(x, name):  # y = x W + b, W [in, out]
        y = x @ w[name + ".weight"]
        b = get(name + ".bias")
        return y if b is None else y + b

    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][torch.arange(T)]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        # torch 1.13 has no F.scaled_dot_product_attention: the math, as GPT2Attention._attn
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        y = torch.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + "attn.c_proj")
        h = gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"))
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].t()  # the tied head


def check_with_transformers(w, cfg, idx, targets, logits, loss):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("  transformers not importable: the cross-check is skipped")
        return
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg["vocab_size"], n_positions=cfg["n_positions"], n_embd=cfg["n_embd"],
        n_layer=cfg["n_layer"], n_head=cfg["n_head"], attn_pdrop=0.0, embd_pdrop=0.0,
        resid_pdrop=0.0)).double().eval()
    state = {k: v.detach() for k, v in w.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("attn.bias") or k.endswith("masked_bias")
                                  for k in missing), (missing, unexpected)
    out = model(idx).logits
    hf_loss = F.cross_entropy(out.view(-1, out.size(-1)), targets.view(-1))
    hf_loss.backward()
    grads = dict(model.named_parameters())
    assert torch.allclose(out, logits, atol=1e-12, rtol=0), (out - logits).abs().max()
    assert abs(hf_loss.item() - loss.item()) < 1e-12
    for key in GRAD_KEYS:
        assert torch.allclose(grads[key].grad, w[key].grad, atol=1e-12, rtol=0), key
    print("  transformers' GPT2LMHeadModel gives the same logits, loss and gradients")


def case(out, meta, name, cfg, batch, seq):
    w = make_weights(cfg)
    idx = torch.randint(0, cfg["vocab_size"], (batch, seq))
    targets = torch.randint(0, cfg["vocab_size"], (batch, seq))
    logits = forward(w, cfg, idx)
    loss = F.cross_entropy(logits.view(-1, cfg["vocab_size"]), targets.view(-1))
    loss.backward()
    for key, shape in state_keys(cfg):
        t = w["transformer.wte.weight"] if key == "lm_head.weight" else w[key]
        assert list(t.shape) == shape, (key, t.shape, shape)
        out[f"{name}.{key}"] = t.detach()
    out[f"{name}.idx"] = idx
    out[f"{name}.targets"] = targets
    out[f"{name}.logits"] = logits.detach()
    out[f"{name}.loss"] = loss.detach()
    for key in GRAD_KEYS:
        if key in w:
            out[f"{name}.grad.{key}"] = w[key].grad
    meta[f"{name}.config"] = json.dumps(cfg)
    print(f"{name}: loss {loss.item():.6f}")
    if cfg["bias"]:
        with torch.random.fork_rng():  # building the model draws: leave the fixture's stream
            check_with_transformers(w, cfg, idx, targets, logits.detach(), loss.detach())


def main():
    torch.manual_seed(20)
    out, meta = {}, {"format": "pt", "generator": "tools/make_gpt_golden.py",
                     "torch": torch.__version__}
    base = {"vocab_size": 65, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4,
            "dropout": 0.0}
    case(out, meta, "gpt", dict(base, bias=True), 2, 16)
    case(out, meta, "gpt_nobias", dict(base, bias=False), 3, 7)
    meta["cases"] = "gpt,gpt_nobias"
    save_file(OUT, out, meta)


if __name__ == "__main__":
    main()
