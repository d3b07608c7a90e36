#!/usr/bin/env bash
# bench/zero_memory_table.sh — the ZeRO paper's model-state table against what loom's ranks hold:
# runs gpt_train and resnet18_cifar for two steps under DDP and each ZeRO stage, at 2 and 4 ranks,
# in float32 and with --amp bf16, and prints rank 0's memory report (--print-memory, Note [The
# memory report]) as one markdown table: the model states measured (weights + gradients +
# optimizer state) beside the formula's figure for loom's layout (Note [Model-state
# arithmetic]), and the paper's 16-bit column where it applies. Needs a build (scripts/build.sh).
#   bench/zero_memory_table.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
text="$(mktemp)"
trap 'rm -f "$text"' EXIT
for i in $(seq 400); do echo "The quick brown fox $i jumps over the lazy dog."; done >"$text"

gpt=("$build/apps/gpt_train" --data "$text" --layers 4 --heads 4 --embd 128 --block 64
  --batch-size 4 --iters 2 --eval-every 2 --eval-iters 1 --threads 1 --no-sample)
resnet=("$build/apps/resnet18_cifar" --dataset synthetic --synthetic-size 64 --width 16
  --batch-size 8 --epochs 1 --max-steps 2 --threads 1 --workers 1 --optimizer adamw --lr 1e-3)

figures() {  # figures LOG KIND -> "measured formula"
  grep -E "^  $2 +[0-9.]+ +[0-9.]+" "$1" | head -1 | sed -E "s/^  $2 +([0-9.]+) +([0-9.]+).*/\1 \2/"
}

echo "| model | precision | ranks | strategy | weights MiB | gradients MiB | optimizer state MiB | model states MiB | formula (loom's layout) MiB | measured / formula | ZeRO paper, 16-bit column MiB |"
echo "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
log="$(mktemp)"
for model in gpt resnet; do
  for amp in off bf16; do
    for n in 2 4; do
      for stage in 0 1 2 3; do
        if [ "$model" = gpt ]; then cmd=("${gpt[@]}"); else cmd=("${resnet[@]}"); fi
        if ! "${cmd[@]}" --nproc "$n" --zero "$stage" --amp "$amp" --print-memory >"$log" 2>&1; then
          echo "| $model | $amp | $n | $stage | run failed: $(tail -1 "$log") |"
          continue
        fi
        read -r w wf < <(figures "$log" weights)
        read -r g gf < <(figures "$log" gradients)
        read -r s sf < <(figures "$log" "optimizer state")
        read -r t tf < <(figures "$log" "model states")
        params="$(grep -oE '\(([0-9]+) parameters\)' "$log" | head -1 | tr -dc 0-9)"
        # The paper's 16-bit column: (2 + 2 + 12) Psi split by stage, K = 12 (AdamW + master).
        paper="$(awk -v p="$params" -v n="$n" -v s="$stage" 'BEGIN {
          w = 2 * p; g = 2 * p; k = 12 * p;
          if (s >= 1) k /= n; if (s >= 2) g /= n; if (s >= 3) w /= n;
          printf "%.2f", (w + g + k) / 1048576 }')"
        ratio="$(awk -v a="$t" -v b="$tf" 'BEGIN { printf "%.3f", a / b }')"
        name=DDP
        [ "$stage" -gt 0 ] && name="ZeRO-$stage"
        precision=float32
        [ "$amp" = bf16 ] && precision="--amp bf16"
        echo "| $model ($params) | $precision | $n | $name | $w | $g | $s | $t | $tf | $ratio | $paper |"
      done
    done
  done
done
rm -f "$log"
