#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what is needed, builds loom (Release,
# warnings as errors) and runs every test with ctest. Tests labelled cuda skip without a GPU.
# PyTorch and the safetensors package are installed too (setup.sh --torch), so that the tests
# that check files against them run instead of skipping. Extra arguments go to ctest (e.g.
# -LE slow to leave out the slow tests). Then the fuzzers and the ThreadSanitizer suite run
# (docs/fuzzing.md; LOOM_SKIP_FUZZ=1 and LOOM_SKIP_TSAN=1 skip them).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM_SETUP_ARGS=--torch LOOM_CMAKE_ARGS="-DLOOM_WERROR=ON ${LOOM_CMAKE_ARGS:-}" scripts/build.sh
(cd "${LOOM_BUILD_DIR:-build}" && ctest --output-on-failure -j "$(nproc)" "$@")

# Hardening (docs/fuzzing.md): a short run of each fuzzer on its seeds, then the
# ThreadSanitizer suite; together about 8 minutes more on a fresh 2-core machine. Either can be
# left out for a local run: LOOM_SKIP_FUZZ=1, LOOM_SKIP_TSAN=1.
if [[ -z "${LOOM_SKIP_FUZZ:-}" ]]; then
  scripts/fuzz.sh "${LOOM_FUZZ_SECONDS:-15}"
fi
if [[ -z "${LOOM_SKIP_TSAN:-}" ]]; then
  env -u LOOM_BUILD_DIR scripts/sanitize.sh thread  # its own build-tsan, never the build above
fi
