#!/usr/bin/env bash
# bench/collective_checks_cost.sh — what Note [Collective checks] costs a training step: the same
# resnet18_cifar job on 2 ranks with the checks on (the default) and off
# (LOOM_CHECK_COLLECTIVES=0), alternating, ROUNDS times each, with and without --sync-bn (which
# adds two collectives per batch norm and step). Prints each run's images/s (the epoch line's)
# and the medians; the ratio below 1 is what the checks cost.
#   bench/collective_checks_cost.sh [BUILD_DIR (build)] [ROUNDS (3)]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
app="$build/apps/resnet18_cifar"
[[ -x "$app" ]] || { echo "collective_checks_cost: $app is not built" >&2; exit 2; }
job=(--dataset synthetic --synthetic-size 2560 --batch-size 32 --width 32 --epochs 1 --nproc 2
     --workers 1)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "job: resnet18_cifar ${job[*]} (80 steps per rank)"
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
images_per_second() {  # args: checks (0|1), extra flags
  local checks=$1
  shift
  LOOM_CHECK_COLLECTIVES=$checks "$app" "${job[@]}" "$@" 2>&1 |
    sed -n 's/.* \([0-9.]*\) img\/s .*/\1/p' | head -1
}
for extra in "" "--sync-bn"; do
  on=() off=()
  for ((r = 1; r <= rounds; ++r)); do
    on+=("$(images_per_second 1 $extra)")
    off+=("$(images_per_second 0 $extra)")
    printf '  %-10s round %d: checks on %6s img/s, off %6s img/s\n' "${extra:-plain}" "$r" \
      "${on[-1]}" "${off[-1]}"
  done
  m_on=$(printf '%s\n' "${on[@]}" | median)
  m_off=$(printf '%s\n' "${off[@]}" | median)
  printf '%-10s median: on %s img/s, off %s img/s, on/off %.3f\n' "${extra:-plain}" "$m_on" \
    "$m_off" "$(awk -v a="$m_on" -v b="$m_off" 'BEGIN {print a / b}')"
done
