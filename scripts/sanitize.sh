#!/usr/bin/env bash
# scripts/sanitize.sh — builds with AddressSanitizer and UndefinedBehaviorSanitizer and runs
# the tests that are not slow. Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${LOOM_BUILD_DIR:-build-sanitize}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=ON -DLOOM_CUDA=OFF \
  -DLOOM_BUILD_BENCH=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build "$build" -j "$(nproc)"
cd "$build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$(nproc)" -LE "slow|install" "$@"
