#!/usr/bin/python3
# bench/train_step_torch.py — PyTorch's side of bench/train_step_bench.cpp: one training step
# (zero_grad, forward, cross-entropy, backward, SGD with nesterov momentum and weight decay) of
# the same ResNet-18 (tools/torch_resnet.py: torchvision's structure, CIFAR stem) on the same
# batch shape (with --channels-last: the model and the batch in torch.channels_last). Run as a
# co-process with --serve: prints a header line, then answers
#   step -> {"ms": t}     (one timed training step)
#   step amp -> {"ms": t}   (with --amp bf16|fp16: a second model of the same weights takes the
#                            step under torch.autocast, fp16 with a GradScaler on GPUs), or
#                            {"error": why} where this torch cannot autocast to that dtype
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"])
    parser.add_argument("--channels-last", action="store_true")
    args = parser.parse_args()
    try:
        import torch
        from torch_resnet import ResNet
    except ImportError as e:
        say({"error": f"no torch: {e}"})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        say({"error": "torch sees no CUDA device"})
        return 0
    def make_trainer():
        torch.manual_seed(0)
        model = ResNet(depth=18, width=args.width, in_channels=3, num_classes=10, cifar_stem=True)
        model.to(device)
        if args.channels_last:
            model.to(memory_format=torch.channels_last)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                              weight_decay=5e-4)
        return model, opt

    model, opt = make_trainer()
    x = torch.randn(args.batch, 3, 32, 32).to(device)
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch,)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    amp_error = None
    if amp_dtype is not None:
        amp_model, amp_opt = make_trainer()
        scaler = torch.cuda.amp.GradScaler() if (args.amp == "fp16" and device.type == "cuda") \
            else None
        # An unsupported dtype raises (torch 1.13 on CPUs) or disables the region with a warning.
        try:
            with torch.autocast(device_type=device.type, dtype=amp_dtype):
                enabled = (torch.is_autocast_cpu_enabled() if device.type == "cpu"
                           else torch.is_autocast_enabled())
        except RuntimeError:
            enabled = False
        if not enabled:
            amp_error = f"torch {torch.__version__} cannot autocast to {args.amp} on {device.type}"

    def step_amp():
        amp_opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(amp_model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(amp_opt)
            scaler.update()
        else:
            loss.backward()
            amp_opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    say({"torch": torch.__version__, "threads": torch.get_num_threads(),
         "mkldnn": torch.backends.mkldnn.is_available(), "device": str(device),
         "channels_last": args.channels_last})
    if not args.serve:
        return 0
    for line in sys.stdin:
        words = line.split()
        if words and words[0] == "step":
            use_amp = words[1:] == ["amp"]
            if use_amp and (amp_dtype is None or amp_error):
                say({"error": amp_error or "started without --amp"})
                continue
            start = time.perf_counter()
            step_amp() if use_amp else step()
            say({"ms": (time.perf_counter() - start) * 1e3})
        elif words:
            say({"error": f"unknown request {words[0]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
