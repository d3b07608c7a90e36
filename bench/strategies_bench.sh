#!/usr/bin/env bash
# bench/strategies_bench.sh — every way loom averages gradients, side by side (issue 24): for
# ResNet-18 (width 16, synthetic 32 x 32 images, a global batch of 64) and a GPT (2 layers x 64,
# Debian's fortunes as bytes, a global batch of 16 windows of 64 tokens), on 2 and 4 CPU ranks,
# each of --strategy dp, horovod, ddp, zero1, zero2, zero3, and DDP with PowerSGD (and, for
# ResNet, the bfloat16 hook), the same number of steps from the same seed. Per run: ms per step, images or tokens
# per second, the share of the gradients' communication hidden behind backward, bytes per step
# (each rank's collectives' bus bytes, Note [Bytes moved]; under dp what went through device 0,
# Note [DataParallel]), rank 0's peak memory (dp: the one process, every replica), and the
# loss after the last step (ResNet: the test loss; GPT: the validation loss). The global batch is
# the same in every row: each of N ranks takes 1/N of it; dp takes all of it and cuts it in N.
# Where the mathematics says the steps are those of one process on the whole batch (dp,
# horovod, ddp, and the ZeRO stages), the losses agree to rounding. So that they can, ResNet
# trains with --freeze-bn (batch norm normalises with its running statistics, not each rank's
# or replica's share's: with batch statistics the strategies are different computations) at
# lr 0.05. The GPT's validation loss is taken over batches of the per-rank size: dp's and the
# one process's agree with each other, the ranks' rows with each other. Ranks beyond the cores
# share them: times at 4 ranks on 2 cores compare the strategies, not the scaling.
# The machines are shared and noisy: the whole set of runs is repeated ROUNDS times, the
# strategies alternating within each round, and each row shows the median step time and speed
# (its other columns do not depend on the timing).
#
#   bench/strategies_bench.sh [STEPS (default 20)] [WORLD SIZES (default "2 4")] [ROUNDS (default 3)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
steps="${1:-20}"
worlds="${2:-2 4}"
rounds="${3:-3}"
scripts/build.sh resnet18_cifar gpt_train >/dev/null
build="${LOOM_BUILD_DIR:-build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "$steps steps each, median of $rounds rounds; loom $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# One run; one JSON line of its figures appended to $work/results.
run() {  # model world strategy label extra-flags...
  local model=$1 world=$2 strategy=$3 label=$4
  shift 4
  local log="$work/run.log" json="$work/run.json"
  rm -f "$json"
  if [[ $model == resnet ]]; then
    local batch=$((64 / world))
    [[ $strategy == dp ]] && batch=64
    "$build/apps/resnet18_cifar" --dataset synthetic --synthetic-size $((64 * steps)) --width 16 \
      --batch-size "$batch" --epochs 1 --max-steps "$steps" --workers 1 --seed 3 --lr 0.05 \
      --freeze-bn --strategy "$strategy" --nproc "$world" --log-json "$json" "$@" >"$log" 2>&1 ||
      { echo "$model $world $label failed: $(tail -1 "$log")" >&2; return; }
  else
    local batch=$((16 / world))
    [[ $strategy == dp ]] && batch=16
    "$build/apps/gpt_train" --layers 2 --heads 2 --embd 64 --block 64 --iters "$steps" \
      --eval-every "$steps" --log-every "$steps" --eval-iters 10 --warmup 2 --lr 3e-3 \
      --batch-size "$batch" --no-sample --seed 3 --strategy "$strategy" --nproc "$world" \
      --log-json "$json" "$@" >"$log" 2>&1 ||
      { echo "$model $world $label failed: $(tail -1 "$log")" >&2; return; }
  fi
  python3 "$root/bench/strategies_row.py" "$json" "$log" "$model" "$world" "$label" \
    >>"$work/results"
}

# Every configuration once, in a fixed order.
round() {
  for model in resnet gpt; do
    for world in $worlds; do
      run $model 1 ddp "1 process, whole batch"
      run $model "$world" dp "dp (DataParallel)"
      run $model "$world" horovod "horovod (after backward)"
      run $model "$world" ddp "ddp"
      if [[ $model == resnet ]]; then run $model "$world" ddp "ddp, bf16 hook" --comm-dtype bf16; fi
      run $model "$world" ddp "ddp, PowerSGD rank 2" --powersgd 2 --powersgd-start 5
      run $model "$world" zero1 "zero1"
      run $model "$world" zero2 "zero2"
      run $model "$world" zero3 "zero3 (FSDP)"
    done
  done
}
for ((r = 1; r <= rounds; ++r)); do round; done
python3 "$root/bench/strategies_row.py" --table "$work/results"
