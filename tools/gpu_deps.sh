#!/usr/bin/env bash
# tools/gpu_deps.sh — run HERE (a Debian machine with the project's packages), before a GPU
# check: gathers what loom builds against and the GPU machine lacks (it has nvcc, CMake and
# PyTorch's CUDA wheels, but none of Debian's -dev packages and no network) into .gpu_deps/, a
# copy of the needed parts of /usr with the same layout, so CMake's package files there stay
# valid. tools/gpu_check.sh points CMake (CMAKE_PREFIX_PATH) and the loader at it. The folder
# is ignored by git: name it in the device tool's `carry`.
#   tools/gpu_deps.sh            # then: carry [".gpu_deps"]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.gpu_deps"
"$root/scripts/setup.sh" >/dev/null  # the Debian packages themselves
rm -rf "$dest"
mkdir -p "$dest"
arch="$(gcc -print-multiarch)"
cd /usr
paths=(
  include/eigen3 share/eigen3/cmake                              # Eigen
  include/gloo lib/libgloo.so*                                   # Gloo and what it loads
  "lib/$arch"/libhiredis.so* "lib/$arch"/libibverbs.so* "lib/$arch"/libnl-3.so*
  "lib/$arch"/libnl-route-3.so*
  include/gtest include/gmock "lib/$arch"/libgtest*.a "lib/$arch"/libgmock*.a
  "lib/$arch/cmake/GTest"                                        # GoogleTest
  include/nlohmann share/cmake/nlohmann_json                     # nlohmann-json
  include/CLI share/cmake/CLI11                                  # CLI11
  include/stb                                                    # stb_image
  include/zlib.h include/zconf.h "lib/$arch"/libz.so*            # zlib
  include/google/protobuf bin/protoc "lib/$arch"/libprotobuf.so* # protobuf (TensorBoard files)
  "lib/$arch"/libprotoc.so*
  include/isa-l include/isa-l.h "lib/$arch"/libisal.so*           # ISA-L (CRC-32C)
)
for p in "${paths[@]}"; do
  # shellcheck disable=SC2086  # globs expand on purpose
  for match in $p; do cp -a --parents "$match" "$dest/"; done
done
# The dynamic libraries' link targets live in /lib/$arch on merged-/usr systems: copy what the
# symbolic links above point to.
find "$dest" -type l | while read -r link; do
  target="$(readlink -f "/usr${link#"$dest"}")"
  case "$target" in
    /usr/*) copy="$dest${target#/usr}" ;;
    *) copy="$(dirname "$link")/$(basename "$target")" ;;
  esac
  [ -e "$copy" ] || cp -a "$target" "$copy"
  case "$(readlink "$link")" in  # an absolute link would dangle on the GPU machine
    /*) ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$copy")" "$link" ;;
  esac
done
if find "$dest" -type l -lname '/*' | grep -q .; then
  echo "gpu_deps: absolute symbolic links left in $dest:" >&2
  find "$dest" -type l -lname '/*' >&2
  exit 1
fi
echo "$(du -sh "$dest" | cut -f1) in $dest"
