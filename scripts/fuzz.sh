#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [NAMES...] — builds loom's libFuzzer targets (fuzz/, docs/fuzzing.md)
# with clang in $LOOM_FUZZ_BUILD_DIR (default build-fuzz) and runs each for SECONDS (default 30),
# up to $LOOM_FUZZ_JOBS (default: the cores) at a time. NAMES are fuzz/<name>_fuzzer.cpp's names
# (safetensors, idx, ...; default all). A fuzzer starts from its seeds, fuzz/corpus/<name>/, copied
# into <build>/corpus/<name>/, where what it adds stays for the next run (the committed corpus is
# never written); what it finds goes to <build>/crashes/<name>/, its output to <build>/logs/.
# Fails when any fuzzer finds something. Reproduce a finding with
#   <build>/fuzz/<name>_fuzzer <build>/crashes/<name>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
(($#)) && shift
scripts/setup.sh
build=${LOOM_FUZZ_BUILD_DIR:-build-fuzz}
names=("$@")
if ((!${#names[@]})); then
  for source in fuzz/*_fuzzer.cpp; do
    name=$(basename "$source" _fuzzer.cpp)
    names+=("$name")
  done
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1: quicker to build than -O2, and libFuzzer's own advice for coverage-guided runs.
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DLOOM_FUZZ=ON -DLOOM_SHARED=OFF -DLOOM_CUDA=OFF \
  -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_APPS=OFF -DLOOM_TORCH_PYTHON= \
  --no-warn-unused-cli "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${names[@]/%/_fuzzer}"

# One fuzzer: libFuzzer's exit status is non-zero when it finds a crash, a leak, a timeout
# (an input over 10 s) or memory over 2 GB (an RSS past -rss_limit_mb or one malloc past it).
run_one() {
  local name=$1 corpus=$build/corpus/$1 crashes=$build/crashes/$1
  mkdir -p "$corpus" "$crashes" "$build/logs"
  [[ -d fuzz/corpus/$name ]] && cp -n fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  local args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
              -artifact_prefix="$crashes/")
  [[ -f fuzz/$name.dict ]] && args+=(-dict="fuzz/$name.dict")
  local status=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/${name}_fuzzer" "${args[@]}" "$corpus" >"$build/logs/$name.log" 2>&1 || status=$?
  echo "$status" >"$build/logs/$name.status"
}

parallel=${LOOM_FUZZ_JOBS:-$(nproc)}
for name in "${names[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  echo "fuzz: $name for ${seconds}s"
  rm -f "$build/logs/$name.status"
  run_one "$name" &
done
wait

failed=()
for name in "${names[@]}"; do
  status=$(cat "$build/logs/$name.status" 2>/dev/null || echo "no status")
  log=$build/logs/$name.log
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  printf 'fuzz: %-16s %10s runs, corpus %5s files' "$name" "$runs" \
    "$(find "$build/corpus/$name" -type f | wc -l)"
  if [[ $status != 0 ]]; then
    failed+=("$name")
    printf '  FOUND SOMETHING (exit %s); see %s\n' "$status" "$log"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*property violated|.*uncaught)' "$log" | head -5 || true
    ls "$build/crashes/$name" | head -5
  else
    printf '\n'
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (inputs under $build/crashes/)" >&2
  exit 1
fi
