#!/usr/bin/env bash
# tools/gpu_check.sh — loom's whole GPU check in one go, for the few minutes a GPU is lent:
# builds loom with CUDA, runs the `cuda` tests, then the GPU benchmarks, and prints a short
# table last (also written to $OUT/gpu_check.md when OUT is set, else build-gpu/gpu_check.md):
# op parity failures, ResNet-18 CIFAR training images/s at batch 256 and 512 (loom and PyTorch
# in the same run), GPT-2 small training tokens/s (loom and PyTorch), and allreduce bus
# bandwidth. Meant to finish within 8 minutes on one H200.
#
# The GPU machine has nvcc, CMake and PyTorch with its CUDA libraries as pip wheels
# (site-packages/nvidia/...), but none of Debian's -dev packages and no network: first run
# tools/gpu_deps.sh HERE, then carry .gpu_deps along. cuDNN, cuBLAS and NCCL are found in the
# wheels by cmake/LoomCudaLibraries.cmake (it asks python3 where they are).
#   device run:  tools/gpu_check.sh          (carry: [".gpu_deps"])
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOOM_GPU_BUILD:-$root/build-gpu}"
out="${OUT:-$build}"
deps="$root/.gpu_deps"
python="$(command -v python3 || true)"
jobs="$(nproc)"
start=$SECONDS
mkdir -p "$build" "$out"
log="$out/gpu_check.log"
: >"$log"
say() { echo "[gpu_check $((SECONDS - start))s] $*" | tee -a "$log"; }

# The loader must find the carried libraries (gloo and what it needs) and the wheels' CUDA ones.
libdirs=()
[ -d "$deps" ] && libdirs+=("$deps/lib" "$deps/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)")
if [ -n "$python" ]; then
  while IFS= read -r d; do [ -n "$d" ] && libdirs+=("$d"); done < <("$python" - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    for root in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            print(os.path.realpath(d))
except ImportError:
    pass
PY
)
fi
LD_LIBRARY_PATH="$(IFS=:; echo "${libdirs[*]:-}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

# compute_mode: the two-rank tests share one GPU between two processes, which an
# Exclusive_Process GPU refuses (they would all fail at once).
gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>/dev/null | head -1)"
say "GPU: ${gpu:-none found}; nvcc: $(nvcc --version 2>/dev/null | tail -1)"

# Every step gets at most what is left of the budget, 8 minutes (the device tool stops a command
# at 600 s,
# and a killed script prints nothing), and the table is printed however the script ends.
budget="${LOOM_GPU_BUDGET:-480}"
cap() {  # cap N: N seconds, or what is left of the budget less 20 s for the table
  local left=$((budget - (SECONDS - start) - 20))
  if ((left < $1)); then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}
build_status="not started" summary="" failed="" skipped=""
declare -A loom_ips torch_ips any_ips ops_ips
loom_fp16="" torch_fp16="" loom_fp16_ips="" torch_fp16_ips="" any_fp16_ips="" ops_fp16_ips=""
busbw="" zero_rows=""
gpt_loom_tps="" gpt_torch_tps="" gpt_loom_mfu=""

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
print_table() {
  {
    echo "## gpu_check $(date -u +%Y-%m-%d) — ${gpu:-no GPU}"
    echo
    echo "| check | result |"
    echo "|---|---|"
    echo "| build | $build_status |"
    echo "| cuda tests | ${summary:-none ran}; failures ${failed:-n/a}, skipped ${skipped:-n/a} |"
    for batch in 256 512; do
      echo "| ResNet-18 CIFAR train step, batch $batch, float32: loom img/s | ${loom_ips[$batch]:-n/a} |"
      echo "| same, PyTorch img/s | ${torch_ips[$batch]:-n/a} |"
      echo "| same, loom / PyTorch | $(ratio "${loom_ips[$batch]:-0}" "${torch_ips[$batch]:-0}") |"
      echo "| same, loom with any cuDNN algorithm (PyTorch's default) / PyTorch | $(ratio "${any_ips[$batch]:-0}" "${torch_ips[$batch]:-0}") |"
      echo "| same, loom fused / loom ops one by one (batch norm, add, ReLU) | $(ratio "${loom_ips[$batch]:-0}" "${ops_ips[$batch]:-0}") |"
    done
    echo "| ResNet-18 CIFAR train step, batch 256, --amp fp16, channels-last: loom img/s | ${loom_fp16_ips:-n/a} |"
    echo "| same, PyTorch (autocast + GradScaler, channels_last model) img/s | ${torch_fp16_ips:-n/a} |"
    echo "| same, loom / PyTorch | $(ratio "${loom_fp16_ips:-0}" "${torch_fp16_ips:-0}") |"
    echo "| same, loom with any cuDNN algorithm (PyTorch's default) / PyTorch | $(ratio "${any_fp16_ips:-0}" "${torch_fp16_ips:-0}") |"
    echo "| same, loom fused / loom ops one by one (batch norm, add, ReLU) | $(ratio "${loom_fp16_ips:-0}" "${ops_fp16_ips:-0}") |"
    echo "| fp16 / float32 img/s, both channels-last: loom, PyTorch | ${loom_fp16:-n/a}, ${torch_fp16:-n/a} |"
    echo "| GPT-2 small train step, block 1024, batch 8, float32: loom tokens/s (MFU) | ${gpt_loom_tps:-n/a} (${gpt_loom_mfu:-n/a}) |"
    echo "| same, PyTorch (F.scaled_dot_product_attention) tokens/s | ${gpt_torch_tps:-n/a} |"
    echo "| same, loom / PyTorch | $(ratio "${gpt_loom_tps:-0}" "${gpt_torch_tps:-0}") |"
    echo "| allreduce busbw | ${busbw:-n/a} |"
    echo "| ZeRO-1/2/3 end with DDP's weights on the GPU (tests/dist/zero_cuda_test.cpp) | ${zero_rows:-n/a} |"
    echo
    echo "($((SECONDS - start)) s in all)"
  } | tee "$out/gpu_check.md"
}
trap print_table EXIT

# ---------------------------------------------------------------- build
# Only what the steps below run: the library, the benchmarks, the app and its test, and the
# test programs with the `cuda` label. -k: one target's failure leaves the others built.
prefix=()
[ -d "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$deps")
targets=(loom train_step_bench gpt_step_bench allreduce_bench resnet18_cifar test_resnet18_cifar_test)
for f in "$root"/tests/cuda/*_test.cpp "$root"/tests/dist/*nccl*_test.cpp \
  "$root"/tests/dist/*cuda*_test.cpp; do
  [ -e "$f" ] && targets+=("test_$(basename "$f" .cpp)")
done
say "configure and build ${#targets[@]} targets ($jobs jobs)"
if ! timeout "$(cap 60)" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 ${python:+-DLOOM_TORCH_PYTHON="$python"} "${prefix[@]}" \
  >>"$log" 2>&1; then
  build_status="configure FAILED (gpu_check.log)"
  say "$build_status; the end of the log:"
  tail -30 "$log"
  exit 1
fi
if timeout "$(cap 330)" cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k \
  >>"$log" 2>&1; then
  build_status="built"
else
  build_status="FAILED or cut short (grep -n error gpu_check.log); the steps run what was built"
  grep -n -m 20 -E "error|Error [0-9]" "$log" | tail -20
fi
say "build: $build_status"

# ---------------------------------------------------------------- tests
# The `cuda` label, then the training app end to end on the GPU (a unit-labelled test that
# skips without one). Each ctest run echoes its status: 124 is a timeout.
say "cuda tests"
{
  (cd "$build" && timeout "$(cap 200)" ctest -L cuda -j 4 --timeout 120 --output-on-failure)
  echo "status_cuda_tests=$?"
  (cd "$build" && timeout "$(cap 100)" ctest -R TrainsOnAGpu --timeout 90 --output-on-failure)
  echo "status_app_test=$?"
} >"$out/cuda_tests.log" 2>&1
summary="$(grep -E "tests passed|tests failed" "$out/cuda_tests.log" | tr '\n' ' ')"
grep -q "^status_cuda_tests=124" "$out/cuda_tests.log" && summary="cuda tests TIMED OUT; $summary"
bad='\((Failed|Timeout|SEGFAULT|Subprocess aborted|Subprocess killed|ILLEGAL|BUS_ERROR|OTHER_FAULT|INTERRUPT|NUMERICAL|Not Run)\)'
failed="$(grep -cE "$bad" "$out/cuda_tests.log")"
skipped="$(grep -c "(Skipped)" "$out/cuda_tests.log")"
# The ZeRO row: each ZeroOnGpus test and how it ended ("gloo ...: Passed; nccl ...: ***Skipped").
zero_rows="$(grep -E "Test +#[0-9]+: ZeroOnGpus\." "$out/cuda_tests.log" |
  sed -E 's/.*ZeroOnGpus\.([A-Za-z]+)[ .]*/\1: /; s/ +[0-9.]+ sec.*//' | tr '\n' ';' | sed 's/;$//')"
say "tests: ${summary:-no summary}; $failed failed, $skipped skipped"
grep -E "$bad" "$out/cuda_tests.log" | head -20 | tee -a "$log"

# ---------------------------------------------------------------- benchmarks
# One training step of full-width ResNet-18 (CIFAR stem), SGD, float32; loom and PyTorch
# alternate step by step in the same run (bench/train_step_bench.cpp).
bench="$build/bench/train_step_bench"
for batch in 256 512; do
  if [ ! -x "$bench" ] || (($(cap 120) < 60)); then say "train step, batch $batch: skipped"; continue; fi
  say "train step, batch $batch"
  timeout "$(cap 120)" "$bench" --device cuda --batch "$batch" --repeats 20 \
    ${python:+--python "$python"} >"$out/train_step_$batch.log" 2>&1
  loom_ips[$batch]="$(awk -F'|' '/^\| loom /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  torch_ips[$batch]="$(awk -F'|' '/^\| PyTorch /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  any_ips[$batch]="$(awk -F'|' '/^\| loom, any cuDNN algorithm /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  ops_ips[$batch]="$(awk -F'|' '/^\| loom, ops one by one /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  cat "$out/train_step_$batch.log" >>"$log"
done

# Mixed precision, the issue's target: the same step with --amp fp16 (autocast, GradScaler)
# alternating with float32, both peers channels-last (NHWC convolutions on the tensor cores);
# fp16 images/s from the fp16 step's median ms, and the fp16 / float32 ratio of each.
if [ -x "$bench" ] && (($(cap 120) >= 60)); then
  say "train step, batch 256, --amp fp16, channels-last"
  timeout "$(cap 120)" "$bench" --device cuda --batch 256 --repeats 20 --amp fp16 --channels-last \
    ${python:+--python "$python"} >"$out/train_step_fp16.log" 2>&1
  # A row by its whole first cell: "loom", "loom, any cuDNN algorithm" or "PyTorch".
  amp_row() { awk -F'|' -v who=" $1 " -v col="$2" 'NF == 6 && $2 == who {gsub(/ /,"",$col); print $col}' "$out/train_step_fp16.log"; }
  ips_of() { awk -v ms="$1" 'BEGIN { if (ms > 0) printf "%.1f", 256 * 1000 / ms }'; }
  loom_fp16="$(amp_row loom 5)"
  torch_fp16="$(amp_row PyTorch 5)"
  loom_fp16_ips="$(ips_of "$(amp_row loom 4)")"
  torch_fp16_ips="$(ips_of "$(amp_row PyTorch 4)")"
  any_fp16_ips="$(ips_of "$(amp_row "loom, any cuDNN algorithm" 4)")"
  ops_fp16_ips="$(ips_of "$(amp_row "loom, ops one by one" 4)")"
  cat "$out/train_step_fp16.log" >>"$log"
fi

# GPT-2 small (124M) training steps, AdamW, float32; loom and PyTorch (bench/gpt_step_torch.py,
# F.scaled_dot_product_attention) alternate step by step (bench/gpt_step_bench.cpp).
gpt_bench="$build/bench/gpt_step_bench"
if [ -x "$gpt_bench" ] && (($(cap 90) >= 45)); then
  say "GPT-2 small train step, block 1024, batch 8"
  timeout "$(cap 90)" "$gpt_bench" --device cuda --model gpt2 --block 1024 --batch 8 --repeats 10 \
    ${python:+--python "$python"} >"$out/gpt_step.log" 2>&1
  gpt_loom_tps="$(awk -F'|' '/^\| loom /{gsub(/ /,"",$4); print $4}' "$out/gpt_step.log")"
  gpt_loom_mfu="$(awk -F'|' '/^\| loom /{gsub(/ /,"",$5); print $5}' "$out/gpt_step.log")"
  gpt_torch_tps="$(awk -F'|' '/^\| PyTorch /{gsub(/ /,"",$4); print $4}' "$out/gpt_step.log")"
  cat "$out/gpt_step.log" >>"$log"
fi

# Allreduce: nccl with a GPU per rank; on one GPU, two gloo ranks share it (CUDA tensors staged
# through host memory), which is loom's path there.
ngpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
if [ "$ngpus" -ge 2 ]; then
  ar=(--backend nccl --ranks "$ngpus") ar_what="nccl, $ngpus ranks"
else
  ar=(--backend gloo --ranks 2) ar_what="gloo, 2 ranks sharing the GPU (no nccl on one GPU)"
fi
if [ -x "$build/bench/allreduce_bench" ] && (($(cap 90) >= 30)); then
  say "allreduce: $ar_what"
  timeout "$(cap 90)" "$build/bench/allreduce_bench" "${ar[@]}" --device cuda --max-size 256M \
    >"$out/allreduce.log" 2>&1
  at256="$(awk -F'|' '/^\| 256 MiB/{gsub(/ /,"",$6); print $6}' "$out/allreduce.log")"
  busbw="${at256:+$at256 GB/s at 256 MiB, $ar_what}"
  cat "$out/allreduce.log" >>"$log"
fi
