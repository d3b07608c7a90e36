#!/usr/bin/env bash
# tools/gpu_check.sh — loom's whole GPU check in one go, for the few minutes a GPU is lent:
# builds loom with CUDA, runs the `cuda` tests, then the GPU benchmarks, and prints a short
# table last (also written to $OUT/gpu_check.md when OUT is set, else build-gpu/gpu_check.md):
# op parity failures, ResNet-18 CIFAR training images/s at batch 256 and 512 (loom and PyTorch
# in the same run), and allreduce bus bandwidth. Meant to finish within 8 minutes on one H200.
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

gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "GPU: ${gpu:-none found}; nvcc: $(nvcc --version 2>/dev/null | tail -1)"

# ---------------------------------------------------------------- build
prefix=()
[ -d "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$deps")
say "configure and build ($jobs jobs)"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 ${python:+-DLOOM_TORCH_PYTHON="$python"} "${prefix[@]}" \
    >>"$log" 2>&1 ||
  ! cmake --build "$build" -j "$jobs" >>"$log" 2>&1; then
  say "BUILD FAILED; the end of the log:"
  tail -40 "$log"
  exit 1
fi
say "built"

# ---------------------------------------------------------------- tests
say "cuda tests"
# The `cuda` label, then the training app end to end on the GPU (a unit-labelled test that
# skips without one).
(cd "$build" && timeout 240 ctest -L cuda -j 4 --timeout 120 --output-on-failure;
  timeout 120 ctest -R TrainsOnAGpu --timeout 100 --output-on-failure) >"$out/cuda_tests.log" 2>&1
tests_status=$?
summary="$(grep -E "tests passed|tests failed" "$out/cuda_tests.log" | tr '\n' ' ')"
failed="$(grep -cE "\((Failed|Timeout|SEGFAULT|Subprocess aborted)\)" "$out/cuda_tests.log")"
skipped="$(grep -c "(Skipped)" "$out/cuda_tests.log")"
say "tests: ${summary:-no summary (status $tests_status)}; $skipped skipped"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess aborted)\)" "$out/cuda_tests.log" | head -20 |
  tee -a "$log"

# ---------------------------------------------------------------- benchmarks
# One training step of full-width ResNet-18 (CIFAR stem), SGD, float32, NCHW; loom and PyTorch
# alternate step by step in the same run (bench/train_step_bench.cpp).
declare -A loom_ips torch_ips
for batch in 256 512; do
  say "train step, batch $batch"
  timeout 150 "$build/bench/train_step_bench" --device cuda --batch "$batch" --repeats 20 \
    ${python:+--python "$python"} >"$out/train_step_$batch.log" 2>&1
  loom_ips[$batch]="$(awk -F'|' '/^\| loom /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  torch_ips[$batch]="$(awk -F'|' '/^\| PyTorch /{gsub(/ /,"",$4); print $4}' "$out/train_step_$batch.log")"
  cat "$out/train_step_$batch.log" >>"$log"
done

# Mixed precision (issue 6): the same step with --amp fp16 (autocast, GradScaler) alternating with
# float32, for loom and PyTorch; the ratio is fp16 images/s over float32 images/s.
say "train step, batch 256, --amp fp16"
timeout 150 "$build/bench/train_step_bench" --device cuda --batch 256 --repeats 20 --amp fp16 \
  ${python:+--python "$python"} >"$out/train_step_fp16.log" 2>&1
amp_row() { awk -F'|' -v who="$1" 'NF == 6 && $2 ~ who {gsub(/ /,"",$5); print $5}' "$out/train_step_fp16.log"; }
loom_fp16="$(amp_row loom)"
torch_fp16="$(amp_row PyTorch)"
cat "$out/train_step_fp16.log" >>"$log"

ngpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
busbw="n/a (one GPU: NCCL needs a GPU per rank)"
if [ "$ngpus" -ge 2 ]; then
  say "allreduce over nccl, $ngpus ranks"
  timeout 120 "$build/bench/allreduce_bench" --backend nccl --ranks "$ngpus" --max-size 256M \
    >"$out/allreduce.log" 2>&1
  busbw="$(awk -F'|' '/256 MiB/{gsub(/ /,"",$5); print $5 " GB/s at 256 MiB"}' "$out/allreduce.log")"
fi

# ---------------------------------------------------------------- the table
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
{
  echo "## gpu_check $(date -u +%Y-%m-%d) — ${gpu:-no GPU}"
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| cuda tests | ${summary:-none ran}; failures $failed, skipped $skipped |"
  for batch in 256 512; do
    echo "| ResNet-18 CIFAR train step, batch $batch, float32: loom img/s | ${loom_ips[$batch]:-n/a} |"
    echo "| same, PyTorch img/s | ${torch_ips[$batch]:-n/a} |"
    echo "| same, loom / PyTorch | $(ratio "${loom_ips[$batch]:-0}" "${torch_ips[$batch]:-0}") |"
  done
  echo "| train step, batch 256, --amp fp16 / float32 img/s: loom | ${loom_fp16:-n/a} |"
  echo "| same, PyTorch (autocast + GradScaler) | ${torch_fp16:-n/a} |"
  echo "| fp16 training step | not yet: mixed precision is issue 6 |"
  echo "| allreduce busbw | $busbw |"
  echo
  echo "($((SECONDS - start)) s in all)"
} | tee "$out/gpu_check.md"
