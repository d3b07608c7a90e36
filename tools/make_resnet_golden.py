#!/usr/bin/python3
"""tools/make_resnet_golden.py — writes tests/golden/resnet18_cifar_w4.safetensors: the weights of
a PyTorch ResNet-18 (CIFAR stem, width 4, 3 input channels, 10 classes) with torchvision's keys,
trained for a few steps so that the batch-norm statistics are not the defaults, plus an input
batch and PyTorch's logits for it in eval mode ("golden.input", "golden.logits_eval") and in
training mode ("golden.logits_train", batch statistics). loom's test loads the weights and must
reproduce both.

Run with the system Python, which has PyTorch:  /usr/bin/python3 tools/make_resnet_golden.py
"""
import os

import torch

from torch_resnet import ResNet, save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "resnet18_cifar_w4.safetensors")

torch.manual_seed(0)
model = ResNet(depth=18, width=4, in_channels=3, num_classes=10, cifar_stem=True)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for _ in range(3):  # move the weights and the running statistics away from their defaults
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

x = torch.randn(4, 3, 32, 32)
model.eval()
with torch.no_grad():
    logits_eval = model(x)
state = {k: v.clone() for k, v in model.state_dict().items()}
model.train()
with torch.no_grad():
    logits_train = model(x)

tensors = dict(state)
tensors["golden.input"] = x
tensors["golden.logits_eval"] = logits_eval
tensors["golden.logits_train"] = logits_train
save_file(OUT, tensors, {"generator": "tools/make_resnet_golden.py", "torch": torch.__version__,
                         "model": "resnet18", "width": "4", "in_channels": "3",
                         "num_classes": "10"})
print(f"{os.path.relpath(OUT)}: {len(tensors)} tensors, {os.path.getsize(OUT)} bytes")
