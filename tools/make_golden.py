#!/usr/bin/python3
"""tools/make_golden.py — writes the golden fixtures of tests/golden/: PyTorch's outputs and
gradients for a few ops (float64, small shapes, fixed seeds), as safetensors files that loom's
tests compare against without needing PyTorch when they run.

Run with the system Python, which has PyTorch:  /usr/bin/python3 tools/make_golden.py
The files are written with the small writer below (the `safetensors` package is not needed),
so the same PyTorch gives the same bytes. Keys are described in tests/golden/README.md.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}


def tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: take the raw 16-bit patterns
        t = t.view(torch.int16)
    elif t.dtype == torch.bool:
        t = t.to(torch.uint8)
    data = t.numpy().tobytes()
    assert sys.byteorder == "little"
    return data


def save_file(path, tensors, metadata):
    """The safetensors layout: u64 little-endian header length, JSON header padded with spaces
    to a multiple of 8 bytes, then the tensors' bytes in the order given."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        data = tensor_bytes(t)
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    print(f"{os.path.relpath(path)}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


def base_metadata(what):
    return {"format": "pt", "generator": "tools/make_golden.py", "torch": torch.__version__,
            "contents": what}


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def leaf(t):
    return t.clone().requires_grad_()


# --------------------------------------------------------------------------------- conv2d
def conv2d_case(out, meta, case, x_shape, w_shape, stride, padding, groups):
    x, w, b = leaf(randn(*x_shape)), leaf(randn(*w_shape)), leaf(randn(w_shape[0]))
    y = F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)
    dy = randn(*y.shape)
    y.backward(dy)
    out.update({f"{case}.input": x, f"{case}.weight": w, f"{case}.bias": b,
                f"{case}.output": y, f"{case}.grad_output": dy, f"{case}.grad_input": x.grad,
                f"{case}.grad_weight": w.grad, f"{case}.grad_bias": b.grad})
    meta.update({f"{case}.stride": f"{stride[0]},{stride[1]}",
                 f"{case}.padding": f"{padding[0]},{padding[1]}", f"{case}.groups": str(groups)})


def make_conv2d():
    torch.manual_seed(1)
    out, meta = {}, base_metadata("conv2d forward and backward")
    conv2d_case(out, meta, "plain", (2, 2, 4, 5), (3, 2, 3, 2), (1, 1), (0, 0), 1)
    conv2d_case(out, meta, "grouped", (2, 4, 5, 5), (4, 2, 3, 3), (2, 2), (1, 1), 2)
    save_file(os.path.join(OUT_DIR, "conv2d.safetensors"), out, meta)


# ----------------------------------------------------------------------------- batch_norm
def batch_norm_case(out, meta, case, x_shape, training, momentum=0.1, eps=1e-5):
    channels = x_shape[1]
    x, w, b = leaf(randn(*x_shape)), leaf(randn(channels)), leaf(randn(channels))
    running_mean = 0.1 * randn(channels)
    running_var = torch.rand(channels, dtype=torch.float64) + 0.5
    out.update({f"{case}.input": x, f"{case}.weight": w, f"{case}.bias": b,
                f"{case}.running_mean": running_mean.clone(),
                f"{case}.running_var": running_var.clone()})
    y = F.batch_norm(x, running_mean, running_var, w, b, training=training, momentum=momentum,
                     eps=eps)
    dy = randn(*y.shape)
    y.backward(dy)
    out.update({f"{case}.output": y, f"{case}.grad_output": dy, f"{case}.grad_input": x.grad,
                f"{case}.grad_weight": w.grad, f"{case}.grad_bias": b.grad})
    if training:  # updated in place by the forward
        out.update({f"{case}.running_mean_after": running_mean,
                    f"{case}.running_var_after": running_var})
    meta.update({f"{case}.training": str(training).lower(), f"{case}.momentum": repr(momentum),
                 f"{case}.eps": repr(eps)})


def make_batch_norm():
    torch.manual_seed(2)
    out, meta = {}, base_metadata("batch_norm forward and backward, training and eval")
    batch_norm_case(out, meta, "train", (4, 3, 2, 2), training=True)
    batch_norm_case(out, meta, "train2d", (6, 3), training=True)
    batch_norm_case(out, meta, "eval", (4, 3, 2, 2), training=False)
    save_file(os.path.join(OUT_DIR, "batch_norm.safetensors"), out, meta)


# -------------------------------------------------------------------------- cross_entropy
def cross_entropy_case(out, meta, case, logits_shape, ignored, ignore_index, label_smoothing):
    logits = leaf(randn(*logits_shape))
    classes = logits_shape[1]
    target_shape = (logits_shape[0],) + tuple(logits_shape[2:])
    target = torch.randint(0, classes, target_shape, dtype=torch.int64)
    flat = target.view(-1)
    for i in ignored:
        flat[i] = ignore_index
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="mean",
                           label_smoothing=label_smoothing)
    loss.backward()
    out.update({f"{case}.logits": logits, f"{case}.target": target, f"{case}.loss": loss,
                f"{case}.grad_logits": logits.grad})
    meta.update({f"{case}.ignore_index": str(ignore_index),
                 f"{case}.label_smoothing": repr(label_smoothing), f"{case}.reduction": "mean"})


def make_cross_entropy():
    torch.manual_seed(3)
    out, meta = {}, base_metadata("cross_entropy (mean) loss and gradient of the logits")
    cross_entropy_case(out, meta, "smoothing", (5, 4), [], -100, 0.1)
    cross_entropy_case(out, meta, "ignore", (6, 4), [1, 4], -1, 0.0)
    cross_entropy_case(out, meta, "smoothing_ignore", (6, 5), [0, 3], -100, 0.1)
    cross_entropy_case(out, meta, "spatial", (2, 3, 4), [5], -100, 0.1)
    save_file(os.path.join(OUT_DIR, "cross_entropy.safetensors"), out, meta)


# ----------------------------------------------------------------------------- layer_norm
def layer_norm_case(out, meta, case, x_shape, normalized_shape, eps=1e-5):
    x, w, b = leaf(randn(*x_shape)), leaf(randn(*normalized_shape)), leaf(randn(*normalized_shape))
    y = F.layer_norm(x, normalized_shape, w, b, eps)
    dy = randn(*y.shape)
    y.backward(dy)
    out.update({f"{case}.input": x, f"{case}.weight": w, f"{case}.bias": b,
                f"{case}.output": y, f"{case}.grad_output": dy, f"{case}.grad_input": x.grad,
                f"{case}.grad_weight": w.grad, f"{case}.grad_bias": b.grad})
    meta.update({f"{case}.normalized_shape": ",".join(map(str, normalized_shape)),
                 f"{case}.eps": repr(eps)})


def make_layer_norm():
    torch.manual_seed(4)
    out, meta = {}, base_metadata("layer_norm with weight and bias, forward and backward")
    layer_norm_case(out, meta, "two_dims", (3, 4, 5), (4, 5))
    layer_norm_case(out, meta, "last_dim", (2, 3, 6), (6,))
    save_file(os.path.join(OUT_DIR, "layer_norm.safetensors"), out, meta)


# --------------------------------------------------------------------------------- dtypes
def make_dtypes():
    """One small tensor per dtype loom reads, with values every dtype holds exactly, so the
    reader is checked against bytes PyTorch laid out (float16 and bfloat16 above all)."""
    values = torch.tensor([[-2.5, -1.0, 0.0], [0.5, 1.25, 3.0]], dtype=torch.float64)
    counts = torch.tensor([[0, 1, 2], [7, 100, 255]], dtype=torch.float64)
    out = {
        "f64": values.to(torch.float64), "f32": values.to(torch.float32),
        "f16": values.to(torch.float16), "bf16": values.to(torch.bfloat16),
        "i64": (counts - 3).to(torch.int64), "i32": (counts - 3).to(torch.int32),
        "u8": counts.to(torch.uint8), "bool": counts.remainder(2).to(torch.bool),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "scalar": torch.tensor(42.0, dtype=torch.float64),
    }
    meta = base_metadata("one tensor per dtype")
    save_file(os.path.join(OUT_DIR, "dtypes.safetensors"), out, meta)


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT_DIR, exist_ok=True)
    make_conv2d()
    make_batch_norm()
    make_cross_entropy()
    make_layer_norm()
    make_dtypes()
