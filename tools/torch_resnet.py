"""tools/torch_resnet.py — torchvision's ResNet-18/34 (BasicBlock) written with plain torch.nn,
for the machines that have PyTorch but not torchvision: the same modules, names and order, so
its state_dict has torchvision's keys ("layer1.0.conv1.weight", ...). `cifar_stem` swaps the
7x7 stride-2 stem and max-pool for a 3x3 stride-1 conv and an Identity, as loom's ResNet does.

Also a small safetensors reader (the `safetensors` package is not needed); the writer is
make_golden.py's save_file, re-exported here.
"""
import json
import struct

import torch
import torch.nn as nn

from make_golden import save_file  # noqa: F401  (re-exported: the small safetensors writer)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
          "BOOL": torch.bool}


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, depth=18, width=64, in_channels=3, num_classes=10, cifar_stem=True):
        super().__init__()
        blocks = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}[depth]
        if cifar_stem:
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if cifar_stem else nn.MaxPool2d(3, 2, 1)
        inplanes = width
        for s, n in enumerate(blocks):
            planes = width << s
            layers = []
            for b in range(n):
                layers.append(BasicBlock(inplanes, planes, 2 if (b == 0 and s > 0) else 1))
                inplanes = planes
            setattr(self, f"layer{s + 1}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def load_file(path):
    """(ordered dict of tensors, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = blob[8 + n:]
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        if dtype == torch.bool:
            t = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.uint8).to(torch.bool)
        else:
            t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out, metadata
