#!/usr/bin/env python3
"""tools/make_attention_golden.py — writes tests/golden/attention.safetensors: PyTorch 2.x's
F.scaled_dot_product_attention (values and gradients, float64) for loom's fused attention.

Debian's torch 1.13 has no F.scaled_dot_product_attention, so this runs with the PyTorch 2.x of
the benchmarks' virtual environment:
    $(bench/torch_venv.sh --python) tools/make_attention_golden.py
It writes with tools/make_golden.py's own safetensors writer (no `safetensors` package needed).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import OUT_DIR, base_metadata, leaf, randn, save_file  # noqa: E402


def case(out, meta, name, q_shape, s_len, ev, mask=None, is_causal=False, scale=None):
    *lead, l_len, e = q_shape
    q = leaf(randn(*q_shape))
    k = leaf(randn(*lead, s_len, e))
    v = leaf(randn(*lead, s_len, ev))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    dy = randn(*y.shape)
    y.backward(dy)
    out.update({f"{name}.q": q, f"{name}.k": k, f"{name}.v": v, f"{name}.output": y,
                f"{name}.grad_output": dy, f"{name}.grad_q": q.grad, f"{name}.grad_k": k.grad,
                f"{name}.grad_v": v.grad})
    if mask is not None:
        out[f"{name}.mask"] = mask
    meta.update({f"{name}.is_causal": str(is_causal).lower(),
                 f"{name}.scale": "default" if scale is None else repr(scale)})


def main():
    torch.manual_seed(20)
    out, meta = {}, base_metadata("F.scaled_dot_product_attention forward and backward")
    case(out, meta, "causal", (2, 3, 7, 8), 7, 8, is_causal=True)
    keep = torch.rand(5, 9) > 0.4
    keep[:, 0] = True  # no row without a key
    case(out, meta, "bool_mask", (2, 3, 5, 8), 9, 6, mask=keep)
    case(out, meta, "float_mask", (2, 3, 5, 8), 9, 6, mask=randn(2, 1, 5, 9))
    case(out, meta, "scale_3d", (4, 6, 8), 10, 8, scale=0.3)
    save_file(os.path.join(OUT_DIR, "attention.safetensors"), out, meta)


if __name__ == "__main__":
    main()
