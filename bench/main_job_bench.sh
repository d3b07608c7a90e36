#!/usr/bin/env bash
# bench/main_job_bench.sh — the README's main job (scripts/run_main.sh's recipe) against the same
# recipe in PyTorch 2.x (bench/main_job_torch.py, in bench/torch_venv.sh's environment), run one
# after the other, alternating, ROUNDS times (default 1: a round is about 8 minutes on 2 cores).
# Prints the CPU, each run's test accuracy and its seconds of training and evaluation (the sum
# of loom's epoch times; PyTorch's time from its first step to its last evaluation; neither
# counts start-up or reading the dataset), and PyTorch's seconds / loom's.
#
#   bench/main_job_bench.sh [ROUNDS] [-- extra resnet18_cifar flags, e.g. --conv-algorithm benchmark]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rounds=1
if [[ $# -gt 0 && "$1" != "--" ]]; then rounds="$1"; shift; fi
[[ "${1:-}" == "--" ]] && shift
python="$(bench/torch_venv.sh --python)"
scripts/build.sh resnet18_cifar >/dev/null
app="${LOOM_BUILD_DIR:-build}/apps/resnet18_cifar"
log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "loom flags beyond the recipe: ${*:-(none)}"
echo
echo "| round | loom accuracy | loom s | PyTorch accuracy | PyTorch s | PyTorch s / loom s |"
echo "|---|---|---|---|---|---|"
for ((r = 1; r <= rounds; ++r)); do
  scripts/run_main.sh "$@" >"$log/loom.txt" 2>&1
  "$python" bench/main_job_torch.py >"$log/torch.txt" 2>&1
  loom_acc=$(grep -o 'test accuracy [0-9.]*' "$log/loom.txt" | tail -1 | awk '{print $3}')
  loom_s=$(grep '^epoch ' "$log/loom.txt" | awk '{s += $(NF-1)} END {printf "%.1f", s}')
  torch_acc=$(tail -1 "$log/torch.txt" | "$python" -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["accuracy"])')
  torch_s=$(tail -1 "$log/torch.txt" | "$python" -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["seconds"])')
  ratio=$(awk -v t="$torch_s" -v l="$loom_s" 'BEGIN {printf "%.2f", t / l}')
  echo "| $r | $loom_acc% | $loom_s | $torch_acc% | $torch_s | $ratio |"
  cat "$log/loom.txt" >>"$log/loom_all.txt"
  cat "$log/torch.txt" >>"$log/torch_all.txt"
done
echo
echo "loom's runs:"
grep -E '^(resnet18_cifar|batch|epoch)' "$log/loom_all.txt" || true
echo "PyTorch's runs:"
cat "$log/torch_all.txt"
