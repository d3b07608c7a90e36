#!/usr/bin/env bash
# tools/gpu_rerun.sh — a short GPU check for what a full tools/gpu_check.sh cannot fit in the
# minutes left: builds the library and the `cuda` test programs only (no benchmarks, no apps) and
# runs the `cuda` tests whose names match a regular expression (all by default). The log and the
# ctest output go to $OUT (else build-gpu-rerun/). As gpu_check.sh: run tools/gpu_deps.sh here
# first, and carry .gpu_deps.
#   device run:  tools/gpu_rerun.sh 'Zero|CudaReduce|CudaNorm'     (carry: [".gpu_deps"])
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOOM_GPU_BUILD:-$root/build-gpu-rerun}"
out="${OUT:-$build}"
pattern="${1:-.}"
mkdir -p "$build" "$out"
log="$out/gpu_rerun.log"
start=$SECONDS
say() { echo "[gpu_rerun $((SECONDS - start))s] $*" | tee -a "$log"; }

# The carried libraries and the CUDA wheels' (site-packages/nvidia/*/lib), as gpu_check.sh finds
# them.
deps="$root/.gpu_deps"
libdirs=("$deps/lib" "$deps/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)")
while IFS= read -r d; do [ -n "$d" ] && libdirs+=("$d"); done < <(python3 -c '
import glob, os, nvidia
for r in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))): print(os.path.realpath(d))' 2>/dev/null)
export LD_LIBRARY_PATH="$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

targets=()
for f in "$root"/tests/cuda/*_test.cpp "$root"/tests/dist/*nccl*_test.cpp \
  "$root"/tests/dist/*cuda*_test.cpp; do
  [ -e "$f" ] && targets+=("test_$(basename "$f" .cpp)")
done
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "configure and build ${#targets[@]} test programs"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps" -DLOOM_BUILD_BENCH=OFF \
  -DLOOM_BUILD_APPS=OFF -DLOOM_TORCH_PYTHON="$(command -v python3)" >>"$log" 2>&1 || {
  say "configure FAILED"
  tail -20 "$log"
  exit 1
}
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" -- -k >>"$log" 2>&1 ||
  { say "build FAILED or partial:"; grep -n -m 20 -E "error" "$log"; }
say "cuda tests matching '$pattern'"
(cd "$build" && ctest -L cuda -R "$pattern" -j 4 --timeout 120 --output-on-failure) \
  >"$out/gpu_rerun_tests.log" 2>&1
status=$?
grep -E "tests passed|tests failed|\((Failed|Timeout|SEGFAULT|Subprocess aborted)\)" \
  "$out/gpu_rerun_tests.log" | tee -a "$log"
say "done (ctest status $status)"
exit $status
