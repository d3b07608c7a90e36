#!/usr/bin/env python3
# bench/gpt_step_torch.py — PyTorch's side of bench/gpt_step_bench.cpp: one GPT training step
# (zero_grad, forward, cross-entropy, backward, gradient clipping at 1.0, AdamW with weight decay
# on matrices) of bench/torch_gpt.py's model on random token windows. Run with the PyTorch 2.x of
# bench/torch_venv.sh, as a co-process with --serve: prints a header line, then answers
#   step -> {"ms": t}    (one timed training step)
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=114)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--fused-adamw", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    try:
        import torch
        from torch_gpt import GPT, make_optimizer
    except ImportError as e:
        say({"error": f"no torch: {e}"})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        say({"error": "torch sees no CUDA device"})
        return 0
    model = GPT(args.vocab, args.block, args.embd, args.layers, args.heads).to(device)
    model.train()
    opt = make_optimizer(model, 1e-3, (0.9, 0.99), 0.1, fused=args.fused_adamw)
    x = torch.randint(0, args.vocab, (args.batch, args.block), device=device)
    y = torch.randint(0, args.vocab, (args.batch, args.block), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: allocations, the optimizer's state
    say({"torch": torch.__version__, "threads": torch.get_num_threads(),
         "params": sum(p.numel() for p in model.parameters())})
    for line in sys.stdin:
        if line.strip() == "step":
            start = time.perf_counter()
            step()
            say({"ms": (time.perf_counter() - start) * 1e3})
        else:
            say({"error": f"unknown request {line.strip()}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
