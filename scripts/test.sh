#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what is needed, builds loom (Release,
# warnings as errors) and runs every test with ctest. Tests labelled cuda skip without a GPU.
# Extra arguments go to ctest (e.g. -LE slow to leave out the slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${LOOM_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON "${launcher[@]}" ${LOOM_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
