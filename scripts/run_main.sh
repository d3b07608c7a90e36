#!/usr/bin/env bash
# scripts/run_main.sh — the README's main job: installs what is needed (Fashion-MNIST from
# Debian's dataset-fashion-mnist), builds loom and trains ResNet-18 (CIFAR stem, width 16) on
# Fashion-MNIST for 2 epochs with the issue's recipe (batch 128, SGD with nesterov momentum 0.9,
# weight decay 5e-4, one-cycle to a peak lr of 0.2, horizontal flips), printing the test
# accuracy. Arguments are passed on to resnet18_cifar and override these (e.g. --epochs 1, or
# --dataset cifar10 --data DIR --width 64 for CIFAR-10 once a user provides it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh resnet18_cifar
"${LOOM_BUILD_DIR:-build}/apps/resnet18_cifar" \
  --dataset fashion-mnist --data /usr/share/datasets/fashion-mnist \
  --epochs 2 --batch-size 128 --width 16 \
  --lr 0.2 --momentum 0.9 --nesterov --weight-decay 5e-4 --schedule onecycle \
  "$@"
