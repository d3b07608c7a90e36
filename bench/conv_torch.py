#!/usr/bin/python3
# bench/conv_torch.py — PyTorch's side of bench/conv_bench.cpp: times conv2d forward and the
# backward (data + weight, through aten::convolution_backward, the kernel autograd calls).
# --dtype bf16 makes the input, weight and output gradient bfloat16 tensors (oneDNN's bf16
# convolutions, what autocast runs). Prints JSON. Two modes:
#   --serve: a co-process of conv_bench, so that loom and PyTorch repetitions alternate (the
#     machine is shared and noisy). Prints a header line, then answers one line per request:
#       layer N,C,H,W,O,k,s,p  -> {"ok": true}    (allocate and warm up)
#       fwd | bwd              -> {"ms": t}       (one timed run)
#   --layers "N,C,H,W,O,k,s,p;...": times each layer on its own, prints one JSON object.
import argparse
import json
import statistics
import sys
import time


class Layer:
    def __init__(self, torch, spec, dtype):
        n, c, h, w, o, k, s, p = (int(v) for v in spec.split(","))
        self.torch, self.stride, self.padding = torch, s, p
        self.x = torch.randn(n, c, h, w).to(dtype)
        self.weight = (torch.randn(o, c, k, k) * 0.1).to(dtype)
        with torch.no_grad():
            y = torch.nn.functional.conv2d(self.x, self.weight, None, s, p)
        self.dy = torch.randn_like(y)

    def forward(self):
        with self.torch.no_grad():
            self.torch.nn.functional.conv2d(self.x, self.weight, None, self.stride, self.padding)

    def backward(self):
        s, p = self.stride, self.padding
        self.torch.ops.aten.convolution_backward(self.dy, self.x, self.weight, None, [s, s],
                                                 [p, p], [1, 1], False, [0, 0], 1,
                                                 [True, True, False])


def timed_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--layers", default="")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bf16"])
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        say({"error": f"no torch: {e}"})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    header = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "mkldnn": torch.backends.mkldnn.is_available()}
    if args.serve:
        say(header)
        layer = None
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "layer":
                layer = Layer(torch, words[1], dtype)
                for _ in range(2):
                    layer.forward()
                    layer.backward()
                say({"ok": True})
            elif words[0] == "fwd":
                say({"ms": timed_ms(layer.forward)})
            elif words[0] == "bwd":
                say({"ms": timed_ms(layer.backward)})
            else:
                say({"error": f"unknown request {words[0]}"})
        return 0
    results = []
    for spec in filter(None, args.layers.split(";")):
        layer = Layer(torch, spec, dtype)
        times = {}
        for name, fn in (("forward", layer.forward), ("backward", layer.backward)):
            for _ in range(2):
                fn()
            times[name] = statistics.median(timed_ms(fn) for _ in range(args.repeats))
        results.append({"layer": spec, "forward_ms": times["forward"],
                        "backward_ms": times["backward"]})
    say(dict(header, layers=results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
