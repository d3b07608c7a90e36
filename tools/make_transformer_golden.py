#!/usr/bin/python3
"""tools/make_transformer_golden.py — writes tests/golden/transformer.safetensors: PyTorch's
nn.MultiheadAttention and nn.TransformerEncoderLayer (state dicts, inputs, masks, outputs and
gradients) for tests/nn/transformer_test.cpp to load into loom's modules and compare against.

Run with the system Python, which has PyTorch:  /usr/bin/python3 tools/make_transformer_golden.py
Everything is float64 and seeded, so a given PyTorch writes the same bytes every time. The modules
run in eval mode (dropout off) with inputs that require grad, which keeps torch 1.13 off its
inference "fast path" (it takes that path only when no input needs a gradient), so the ordinary
math path computes every number. The cases and keys are listed in tests/golden/README.md.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import base_metadata, save_file  # noqa: E402  (the small safetensors writer)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "transformer.safetensors")
D_MODEL = 16  # the encoder layer's d_model
EMBED_DIM = 8  # the attention cases' embed_dim (smaller: the file holds each case's state)


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def leaf(t):
    return t.clone().requires_grad_()


def randomise(module):
    """Default initialisation leaves the biases at zero and the norms at one, where a misplaced
    bias or norm parameter would go unnoticed: give them random values."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * randn(*p.shape))
            elif name.startswith("norm"):
                p.copy_(1 + 0.2 * randn(*p.shape))


def bool_mask(*shape, p=0.3):
    """True (masked) with probability p; each row keeps at least one key (no fully masked row:
    PyTorch gives NaN there and loom's fused kernel 0)."""
    mask = torch.rand(*shape) < p
    rows = mask.view(-1, shape[-1])
    for row in rows:
        row[torch.randint(0, shape[-1], ())] = False
    return mask


def float_mask(*shape):
    """Finite random values with some -inf entries; each row keeps a finite one."""
    return torch.where(bool_mask(*shape, p=0.2), torch.tensor(float("-inf"), dtype=torch.float64),
                       randn(*shape))


def record(out, meta, case, module, inputs, masks, output, grad_params, settings):
    """Writes the case: settings in the metadata, then state, inputs, masks, output, the upstream
    gradient, and the gradients of the inputs and of grad_params (after one backward)."""
    assert torch.isfinite(output).all(), f"{case}: a fully masked row"
    dy = randn(*output.shape)
    output.backward(dy)
    state = module.state_dict()
    meta.update({f"{case}.{k}": v for k, v in settings.items()})
    meta[f"{case}.state_keys"] = ",".join(state.keys())
    meta[f"{case}.repr"] = repr(module)
    out.update({f"{case}.state.{k}": v for k, v in state.items()})
    out.update({f"{case}.{k}": v for k, v in inputs.items()})
    out.update({f"{case}.{k}": v for k, v in masks.items() if v is not None})
    out.update({f"{case}.output": output, f"{case}.grad_output": dy})
    out.update({f"{case}.grad_{k}": v.grad for k, v in inputs.items()})
    params = dict(module.named_parameters())
    out.update({f"{case}.grad.{k}": params[k].grad for k in grad_params})


def flag(b):
    return "true" if b else "false"


# -------------------------------------------------------------------------- MultiheadAttention
def mha_case(out, meta, case, heads, L, S, N, bias=True, batch_first=False, self_attention=False,
             key_padding_mask=None, attn_mask=None):
    """N = 0: unbatched input [L, E]."""
    mha = nn.MultiheadAttention(EMBED_DIM, heads, dropout=0.1, bias=bias,
                                batch_first=batch_first)
    mha = mha.double().eval()
    randomise(mha)

    def shape(length):
        if N == 0:
            return (length, EMBED_DIM)
        return (N, length, EMBED_DIM) if batch_first else (length, N, EMBED_DIM)

    query = leaf(randn(*shape(L)))
    if self_attention:
        inputs = {"query": query}
        key = value = query
    else:
        key, value = leaf(randn(*shape(S))), leaf(randn(*shape(S)))
        inputs = {"query": query, "key": key, "value": value}
    output, _ = mha(query, key, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                    need_weights=False)
    grads = ["in_proj_weight", "in_proj_bias", "out_proj.weight"] if bias else \
        ["in_proj_weight", "out_proj.weight"]
    settings = {"module": "MultiheadAttention", "embed_dim": str(EMBED_DIM),
                "num_heads": str(heads), "dropout": "0.1", "bias": flag(bias), "batch_first": flag(batch_first),
                "self_attention": flag(self_attention)}
    record(out, meta, case, mha, inputs,
           {"key_padding_mask": key_padding_mask, "attn_mask": attn_mask}, output, grads, settings)


def make_mha(out, meta):
    N, L, S, H = 2, 4, 5, 4
    mha_case(out, meta, "mha_self", H, L, L, N, self_attention=True)
    mha_case(out, meta, "mha_cross_batch_first", 2, L, S, N, batch_first=True)
    mha_case(out, meta, "mha_no_bias", H, L, S, N, bias=False)
    mha_case(out, meta, "mha_no_bias_batch_first", 2, L, L, N, bias=False, batch_first=True,
             self_attention=True)
    mha_case(out, meta, "mha_key_padding", H, L, S, N, key_padding_mask=bool_mask(N, S))
    mha_case(out, meta, "mha_float_key_padding", 2, L, S, N, batch_first=True,
             key_padding_mask=randn(N, S))
    mha_case(out, meta, "mha_bool_mask", H, L, S, N, attn_mask=bool_mask(L, S))
    mha_case(out, meta, "mha_float_mask", 2, L, S, N, attn_mask=float_mask(N * 2, L, S))
    both = bool_mask(N, S, p=0.2), bool_mask(L, S, p=0.2)
    assert not (both[0][:, None, :] | both[1][None]).all(-1).any()
    mha_case(out, meta, "mha_both_masks", H, L, S, N, batch_first=True, key_padding_mask=both[0],
             attn_mask=both[1])
    mha_case(out, meta, "mha_float_mask_key_padding", 2, L, L, N, self_attention=True,
             key_padding_mask=bool_mask(N, L, p=0.2), attn_mask=randn(L, L))
    mha_case(out, meta, "mha_unbatched", H, L, S, 0, key_padding_mask=torch.tensor(
        [False, True, False, False, True]), attn_mask=float_mask(H, L, S))


# -------------------------------------------------------------------- TransformerEncoderLayer
def encoder_case(out, meta, case, heads, S, N, activation="relu", norm_first=False,
                 batch_first=False, src_key_padding_mask=None, causal=False):
    layer = nn.TransformerEncoderLayer(D_MODEL, heads, dim_feedforward=32, dropout=0.1,
                                       activation=activation, layer_norm_eps=1e-5,
                                       batch_first=batch_first, norm_first=norm_first)
    layer = layer.double().eval()
    randomise(layer)
    src = leaf(randn(*((N, S, D_MODEL) if batch_first else (S, N, D_MODEL))))
    # The causal mask as torch 1.13 spells it (nn.Transformer.generate_square_subsequent_mask).
    src_mask = torch.triu(torch.full((S, S), float("-inf"), dtype=torch.float64), diagonal=1) \
        if causal else None
    output = layer(src, src_mask=src_mask, src_key_padding_mask=src_key_padding_mask)
    settings = {"module": "TransformerEncoderLayer", "d_model": str(D_MODEL), "nhead": str(heads),
                "dim_feedforward": "32", "dropout": "0.1", "activation": activation,
                "layer_norm_eps": "1e-05", "batch_first": flag(batch_first),
                "norm_first": flag(norm_first), "causal": flag(causal)}
    grads = ["self_attn.in_proj_bias", "self_attn.out_proj.weight", "linear1.bias",
             "linear2.bias", "norm1.weight", "norm2.bias"]
    record(out, meta, case, layer, {"src": src},
           {"src_mask": src_mask, "src_key_padding_mask": src_key_padding_mask}, output, grads,
           settings)


def make_encoder(out, meta):
    N, S = 2, 5
    encoder_case(out, meta, "encoder_post_relu", 4, S, N)
    encoder_case(out, meta, "encoder_pre_gelu", 2, S, N, activation="gelu", norm_first=True,
                 batch_first=True)
    encoder_case(out, meta, "encoder_key_padding", 4, S, N, activation="gelu", batch_first=True,
                 src_key_padding_mask=bool_mask(N, S))
    encoder_case(out, meta, "encoder_causal", 2, S, N, norm_first=True, causal=True)


def main():
    torch.manual_seed(20)
    out = {}
    meta = base_metadata("nn.MultiheadAttention and nn.TransformerEncoderLayer: state dicts, "
                         "inputs, masks, outputs and gradients (eval mode)")
    meta["generator"] = "tools/make_transformer_golden.py"
    make_mha(out, meta)
    make_encoder(out, meta)
    save_file(OUT, out, meta)


if __name__ == "__main__":
    main()
