#!/usr/bin/env bash
# scripts/sanitize.sh [address|thread] [CTEST ARGS...] — a sanitizer build and its tests; any
# report fails the run (docs/fuzzing.md).
#   address (the default): AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer in
#     build-sanitize; every test that is not slow.
#   thread: ThreadSanitizer in build-tsan (-O1 -g); the tests of threads and processes:
#     tests/dist/ (DDP and its hooks, DataParallel's replica threads, the Horovod-style
#     optimizer, ZeRO, the gloo process group, the TCPStore, loomrun, TensorBoard,
#     gpt_train on several ranks) but those that train ResNet-18 or measure memory for minutes,
#     and the data loader. Only those tests and the programs they run are built. OpenMP
#     runs one thread (OMP_NUM_THREADS=1): Debian's libgomp is not built for TSan, so TSan cannot
#     see its barriers; scripts/tsan.supp lists what is left out and why.
# $LOOM_BUILD_DIR replaces the build folder; further arguments go to ctest (e.g. -R Store).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=address
if [[ "${1:-}" == address || "${1:-}" == thread ]]; then
  mode=$1
  shift
fi
scripts/setup.sh
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

if [[ $mode == address ]]; then
  build=${LOOM_BUILD_DIR:-build-sanitize}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address -DLOOM_CUDA=OFF \
    -DLOOM_BUILD_BENCH=OFF "${launcher[@]}"
  cmake --build "$build" -j "$(nproc)"
  cd "$build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j "$(nproc)" -LE "slow|install" "$@"
  exit
fi

# ThreadSanitizer. The tests, as test programs (tests/CMakeLists.txt names them test_<file>);
# gpt_train_app runs gpt_train on 1 to 4 ranks (its build comes with it). Left out, for time
# only (docs/fuzzing.md): resnet18_cifar_app, memory_cap, loomplan_app and store_stranger, which
# train ResNet-18 in child processes (minutes under TSan), and memory_plan.
tsan_tests=(ddp_amp_test ddp_test gloo_stuck_worker_test launch_test process_group_test store_test
            tensorboard_test zero_test gpt_train_app_test loader_test comm_hooks_test horovod_test
            data_parallel_test shm_collectives_test)
build=${LOOM_BUILD_DIR:-build-tsan}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DLOOM_SANITIZE=thread -DLOOM_CUDA=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_TORCH_PYTHON= \
  "${launcher[@]}"
targets=()
names=()
for t in "${tsan_tests[@]}"; do
  [[ -n $(find tests -name "$t.cpp") ]] || continue  # a test not (or no longer) in the tree
  targets+=(--target "test_$t")
  names+=("$t")
done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
cd "$build"
# ctest runs the listed programs' tests: their labels are by folder, so select by the name of
# the program each test was discovered from (tests/CMakeLists.txt adds no such label), through
# ctest's -R over the test names of those programs.
regex=$(for n in "${names[@]}"; do "tests/test_$n" --gtest_list_tests | awk '
  /^[^ ]/ { suite = $1 } /^  / { print "^" suite $1 "$" }'; done | paste -sd'|')
# halt_on_error: the first report fails the test; second_deadlock_stack: both stacks of a lock
# order inversion; the suppressions are only for libraries TSan cannot see into.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp" \
  OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" -R "$regex" "$@"
