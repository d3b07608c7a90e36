#!/usr/bin/python3
# bench/norm_torch.py — PyTorch's side of bench/norm_bench.cpp: batch norm with the ReLU after
# it (as torchvision's ResNet runs them: batch_norm, then relu) and layer norm, forward and
# backward, timed one call at a time. A co-process (--serve) answering one JSON line per request:
#   bn N,C,H,W,cl,dtype -> {"ok": true}   (allocate and warm up; cl 1: channels-last; dtype
#                                          float32 or bf16: x, dy and y, the parameters float32)
#   ln M,D          -> {"ok": true}
#   fwd | bwd       -> {"ms": t}      (one timed run of the current case)
# The backward is the two kernels autograd runs: relu's threshold_backward, then
# native_batch_norm_backward (dx, dweight, dbias); for layer norm, native_layer_norm_backward.
import argparse
import json
import sys
import time


class BatchNormRelu:
    def __init__(self, torch, spec):
        fields = spec.split(",")
        n, c, h, w, cl = (int(v) for v in fields[:5])
        dtype = torch.bfloat16 if len(fields) > 5 and fields[5] == "bf16" else torch.float32
        fmt = torch.channels_last if cl else torch.contiguous_format
        self.torch = torch
        self.x = torch.randn(n, c, h, w).to(dtype).contiguous(memory_format=fmt)
        self.weight, self.bias = torch.randn(c), torch.randn(c)
        self.running_mean, self.running_var = torch.zeros(c), torch.ones(c)
        self.dy = torch.randn(n, c, h, w).to(dtype).contiguous(memory_format=fmt)
        self.forward()

    def forward(self):
        t = self.torch
        self.y, self.mean, self.invstd = t.ops.aten.native_batch_norm(
            self.x, self.weight, self.bias, self.running_mean, self.running_var, True, 0.1, 1e-5)
        self.out = t.relu(self.y)

    def backward(self):
        t = self.torch
        g = t.ops.aten.threshold_backward(self.dy, self.out, 0)
        t.ops.aten.native_batch_norm_backward(g, self.x, self.weight, self.running_mean,
                                              self.running_var, self.mean, self.invstd, True,
                                              1e-5, [True, True, True])


class LayerNorm:
    def __init__(self, torch, spec):
        m, d = (int(v) for v in spec.split(","))
        self.torch, self.d = torch, d
        self.x = torch.randn(m, d)
        self.weight, self.bias = torch.randn(d), torch.randn(d)
        self.dy = torch.randn(m, d)
        self.forward()

    def forward(self):
        self.out, self.mean, self.rstd = self.torch.ops.aten.native_layer_norm(
            self.x, [self.d], self.weight, self.bias, 1e-5)

    def backward(self):
        self.torch.ops.aten.native_layer_norm_backward(self.dy, self.x, [self.d], self.mean,
                                                       self.rstd, self.weight, self.bias,
                                                       [True, True, True])


def timed_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve", action="store_true", required=True)
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        say({"error": f"no torch: {e}"})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    say({"torch": torch.__version__, "threads": torch.get_num_threads()})
    case = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        with torch.no_grad():
            if words[0] in ("bn", "ln"):
                case = (BatchNormRelu if words[0] == "bn" else LayerNorm)(torch, words[1])
                for _ in range(2):
                    case.forward()
                    case.backward()
                say({"ok": True})
            elif words[0] == "fwd":
                say({"ms": timed_ms(case.forward)})
            elif words[0] == "bwd":
                say({"ms": timed_ms(case.backward)})
            else:
                say({"error": f"unknown request {words[0]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
