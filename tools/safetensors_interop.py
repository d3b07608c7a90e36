#!/usr/bin/python3
"""tools/safetensors_interop.py — the Python side of loom's safetensors interop test, using the
`safetensors` package itself (not loom's or our own reader):

  safetensors_interop.py read PATH    load PATH with safetensors.torch.load_file and
                                      safe_open(...).metadata(); print one JSON object:
                                      {"metadata": {...}, "tensors": {name: {"dtype", "shape",
                                      "values": [...] as float64}}}
  safetensors_interop.py write PATH   write PATH with safetensors.torch.save_file: one tensor of
                                      each dtype, values i * 0.5 - 3 (i the flat index; cast to
                                      the dtype), shapes as below, metadata {"writer": "safetensors"}

Exit status 3 when the package (or torch) is missing, so the caller can skip.
"""
import json
import sys

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"missing: {e}", file=sys.stderr)
    sys.exit(3)

SHAPES = {"f32": ([2, 3], torch.float32), "f64": ([3], torch.float64),
          "f16": ([2, 2], torch.float16), "bf16": ([4], torch.bfloat16),
          "i64": ([2, 2], torch.int64), "i32": ([3], torch.int32),
          "u8": ([5], torch.uint8), "bool": ([3], torch.bool), "scalar": ([], torch.float32)}


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "write":
        tensors = {}
        for name, (shape, dtype) in SHAPES.items():
            n = 1
            for s in shape:
                n *= s
            values = torch.arange(n, dtype=torch.float64) * 0.5 - 3
            if dtype == torch.uint8:
                values = values.abs()
            tensors[name] = values.reshape(shape).to(dtype)
        save_file(tensors, path, metadata={"writer": "safetensors"})
        return 0
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    out = {"metadata": metadata, "tensors": {}}
    for name, t in tensors.items():
        out["tensors"][name] = {"dtype": str(t.dtype).replace("torch.", ""),
                                "shape": list(t.shape),
                                "values": t.to(torch.float64).flatten().tolist()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
