#!/usr/bin/env bash
# scripts/run_main.sh — the README's main job: installs what is needed (Fashion-MNIST from
# Debian's dataset-fashion-mnist), builds loom and trains on it, printing the test accuracy.
# Until resnet18_cifar lands this is apps/fashion_mlp; arguments are passed on to it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh fashion_mlp
"${LOOM_BUILD_DIR:-build}/apps/fashion_mlp" --data /usr/share/datasets/fashion-mnist "$@"
