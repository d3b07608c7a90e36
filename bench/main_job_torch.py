#!/usr/bin/python3
# bench/main_job_torch.py — the README's main job written for PyTorch, the peer of
# bench/main_job_bench.sh: ResNet-18 (tools/torch_resnet.py: torchvision's structure, CIFAR stem,
# one input channel, width 16) on Fashion-MNIST for 2 epochs, batch 128, SGD with nesterov
# momentum 0.9 and weight decay 5e-4, OneCycleLR to a peak lr of 0.2 (momentum cycled 0.95 to
# 0.85, PyTorch's default, as loom's), images padded with black to 32 x 32 and flipped at random,
# normalised with Fashion-MNIST's mean and std; evaluated on the test set after each epoch in
# batches of 256. The images are decoded and padded once up front (loom's loader threads do that
# per batch, concurrently with the step), so PyTorch is not charged for a Python data pipeline.
# Prints one line per epoch and a last JSON line:
#   {"accuracy": %, "seconds": wall seconds of training and evaluation, "images_per_s": ...}
import argparse
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        blob = f.read()
    dims = blob[3]
    shape = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch early (a smoke test)")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from torch_resnet import ResNet

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def load(prefix):
        images = torch.from_numpy(read_idx(os.path.join(args.data, f"{prefix}-images-idx3-ubyte.gz")).copy())
        labels = torch.from_numpy(read_idx(os.path.join(args.data, f"{prefix}-labels-idx1-ubyte.gz")).copy())
        x = F.pad(images.unsqueeze(1).float() / 255.0, (2, 2, 2, 2))  # black is 0 before normalising
        return (x - 0.2860) / 0.3530, labels.long()

    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    model = ResNet(depth=18, width=args.width, in_channels=1, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    n = train_x.shape[0]
    steps_per_epoch = (n + args.batch_size - 1) // args.batch_size
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                                   total_steps=args.epochs * steps_per_epoch)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{torch.backends.cpu.get_cpu_capability()}", flush=True)

    start = time.perf_counter()
    accuracy = 0.0
    trained = 0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(n)
        epoch_start = time.perf_counter()
        total_loss = 0.0
        for step in range(steps_per_epoch):
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            x = train_x[index]
            flip = torch.rand(x.shape[0]) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
            loss = F.cross_entropy(model(x), train_y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item()
            trained += x.shape[0]
        train_seconds = time.perf_counter() - epoch_start
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, test_x.shape[0], 256):
                correct += (model(test_x[i:i + 256]).argmax(1) == test_y[i:i + 256]).sum().item()
        accuracy = 100.0 * correct / test_x.shape[0]
        print(f"epoch {epoch + 1}/{args.epochs}  train loss {total_loss / steps_per_epoch:.4f}  "
              f"test acc {accuracy:.2f}%  "
              f"{steps_per_epoch * args.batch_size / train_seconds:.0f} img/s", flush=True)
    seconds = time.perf_counter() - start
    print(json.dumps({"accuracy": accuracy, "seconds": seconds, "images_per_s": trained / seconds}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
