#!/usr/bin/env bash
# scripts/build.sh — installs what is needed (scripts/setup.sh), configures a Release build in
# $LOOM_BUILD_DIR (default build/) and builds the given targets (all when none).
# $LOOM_CMAKE_ARGS adds configure options, e.g. LOOM_CMAKE_ARGS=-DLOOM_CUDA=OFF;
# $LOOM_SETUP_ARGS is passed to scripts/setup.sh (--torch for the PyTorch interop tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh ${LOOM_SETUP_ARGS:-}
build=${LOOM_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" ${LOOM_CMAKE_ARGS:-}
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
