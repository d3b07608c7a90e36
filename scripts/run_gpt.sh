#!/usr/bin/env bash
# scripts/run_gpt.sh — the README's GPT command: installs what is needed (Debian's fortunes, the
# corpus), builds loom and trains the fortunes-char recipe with gpt_train (4 layers, 4 heads,
# 128 embd, block 64, batch 12, 2000 iterations, AdamW lr 1e-3 betas (0.9, 0.99) weight decay
# 0.1, gradients clipped to 1, 100 warm-up steps then a cosine to 1e-4, no dropout: gpt_train's
# defaults), printing train and validation loss, ms per iteration, tokens/s and MFU, then a
# sample. Arguments are passed on to gpt_train and override these (e.g. --iters 200, or
# --data FILE for other text).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh gpt_train
"${LOOM_BUILD_DIR:-build}/apps/gpt_train" --eval-every 500 --eval-iters 200 "$@"
