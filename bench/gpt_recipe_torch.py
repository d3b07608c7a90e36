#!/usr/bin/env python3
"""bench/gpt_recipe_torch.py — PyTorch 2.x's run of gpt_train's fortunes-char recipe, the peer
for its validation loss: the same corpus and 90/10 split (data/text.cpp's read_corpus), the byte
vocabulary of the whole text, bench/torch_gpt.py's model (GPT-2's architecture), AdamW with
weight decay on the matrices and embeddings (nanoGPT's groups), gradient clipping, the warm-up
and cosine schedule, and the evaluation gpt_train makes at the end (the mean loss over
--eval-iters batches of validation windows). Windows are drawn with torch.randint (gpt_train
draws them with Philox): the same distribution, not the same windows.

    $(bench/torch_venv.sh --python) bench/gpt_recipe_torch.py            # prints JSON lines
    ... --iters 2000 --threads 2 --seed 1337
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, learning_rate, make_optimizer, read_corpus  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-iters", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    text = read_corpus(a.data)
    vocab = sorted(set(text))
    index = {b: i for i, b in enumerate(vocab)}
    ids = torch.tensor([index[b] for b in text], dtype=torch.long)
    n = int(len(ids) * 0.9)
    train, val = ids[:n], ids[n:]

    def batch(data, gen):
        starts = torch.randint(len(data) - a.block - 1, (a.batch_size,), generator=gen)
        x = torch.stack([data[s:s + a.block] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + a.block] for s in starts])
        return x, y

    model = GPT(len(vocab), a.block, a.embd, a.layers, a.heads)
    opt = make_optimizer(model, a.lr, (a.beta1, a.beta2), a.weight_decay)
    train_gen = torch.Generator().manual_seed(a.seed)

    @torch.no_grad()
    def evaluate(data, seed):
        model.eval()
        gen = torch.Generator().manual_seed(seed)
        losses = [model(*batch(data, gen)).item() for _ in range(a.eval_iters)]
        model.train()
        return sum(losses) / len(losses)

    start = time.perf_counter()
    for it in range(a.iters):
        for group in opt.param_groups:
            group["lr"] = learning_rate(it, a.lr, a.min_lr, a.warmup, a.iters)
        loss = model(*batch(train, train_gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        if (it + 1) % a.eval_every == 0 or it + 1 == a.iters:
            print(json.dumps({"step": it + 1, "train_loss": evaluate(train, a.seed + 2),
                              "val_loss": evaluate(val, a.seed + 1),
                              "seconds": time.perf_counter() - start,
                              "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
