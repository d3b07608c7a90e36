#!/usr/bin/python3
"""tools/check_resnet_logits.py WEIGHTS — the PyTorch side of loom's interop test: loads a
safetensors file written by loom (a ResNet state dict with torchvision's keys plus
"golden.input" and loom's "golden.logits_eval"), builds the model its metadata describes, and
exits 0 when PyTorch's eval-mode logits match loom's (atol 1e-4), 1 otherwise.
"""
import sys

import torch

from torch_resnet import ResNet, load_file

tensors, meta = load_file(sys.argv[1])
x = tensors.pop("golden.input")
expected = tensors.pop("golden.logits_eval")
model = ResNet(depth=int(meta["depth"]), width=int(meta["width"]),
               in_channels=int(meta["in_channels"]), num_classes=int(meta["num_classes"]),
               cifar_stem=meta.get("stem", "cifar") == "cifar")
model.load_state_dict(tensors, strict=True)
model.eval()
with torch.no_grad():
    got = model(x)
err = (got - expected).abs().max().item()
print(f"max |pytorch - loom| = {err:.3g}")
sys.exit(0 if err < 1e-4 else 1)
