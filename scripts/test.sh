#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what is needed, builds loom (Release,
# warnings as errors) and runs every test with ctest. Tests labelled cuda skip without a GPU.
# PyTorch and the safetensors package are installed too (setup.sh --torch), so that the tests
# that check files against them run instead of skipping. Extra arguments go to ctest (e.g.
# -LE slow to leave out the slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM_SETUP_ARGS=--torch LOOM_CMAKE_ARGS="-DLOOM_WERROR=ON ${LOOM_CMAKE_ARGS:-}" scripts/build.sh
cd "${LOOM_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
