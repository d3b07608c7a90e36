#!/usr/bin/python3
# bench/strategies_row.py — the two halves of bench/strategies_bench.sh's bookkeeping:
#   strategies_row.py JSON LOG MODEL WORLD LABEL   one run's figures (from the app's --log-json
#                                                  file and its output) as a JSON line
#   strategies_row.py --table RESULTS              the tables: per model and world size, a row
#                                                  per strategy, the median ms/step and speed
#                                                  over the rounds, the rest from the last round
import json
import re
import statistics
import sys

REFERENCE = "1 process, whole batch"


def row(path, log, model, world, label):
    record = [json.loads(line) for line in open(path) if line.strip()][-1]
    if model == "resnet":
        ms = 64e3 / record["images_per_s"]
        speed, loss, overlap = record["images_per_s"], record["test_loss"], record["overlap"]
    else:
        found = re.search(r"hidden behind backward: (\d+)%", open(log).read())
        ms, speed, loss = record["ms_per_iter"], record["tokens_per_s"], record["val_loss"]
        overlap = int(found.group(1)) / 100 if found else -1
    print(json.dumps({"model": model, "world": int(world), "label": label, "ms": ms,
                      "speed": speed, "overlap": overlap, "bytes": record["bytes_per_step"],
                      "peak": record["peak_memory_bytes"], "loss": loss}))


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    tables, labels = [], []
    for r in rows:
        if r["label"] != REFERENCE and (r["model"], r["world"]) not in tables:
            tables.append((r["model"], r["world"]))
        if r["label"] not in labels:
            labels.append(r["label"])
    for model, world in tables:
        if model == "resnet":
            name, unit = "ResNet-18 width 16 (synthetic images, --freeze-bn), global batch 64", "images/s"
        else:
            name, unit = "GPT 2 x 64, block 64 (fortunes, bytes), global batch 16 windows", "tokens/s"
        print("\n%s, %d ranks (dp: 1 process, %d replicas)\n" % (name, world, world))
        print("| strategy | ms/step | %s | comm. hidden | MiB/step | peak MiB (rank 0) | loss |" % unit)
        print("|---|---|---|---|---|---|---|")
        for label in labels:
            runs = [r for r in rows if r["model"] == model and r["label"] == label and
                    (label == REFERENCE or r["world"] == world)]
            if not runs:
                continue
            last = runs[-1]
            hidden = "%.0f%%" % (100 * last["overlap"]) if last["overlap"] >= 0 else "-"
            print("| %s | %.1f | %.0f | %s | %.3f | %.1f | %.4f |" % (
                label, statistics.median(r["ms"] for r in runs),
                statistics.median(r["speed"] for r in runs), hidden, last["bytes"] / 2**20,
                last["peak"] / 2**20, last["loss"]))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        row(*sys.argv[1:])
