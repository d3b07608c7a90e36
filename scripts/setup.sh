#!/usr/bin/env bash
# scripts/setup.sh — installs what loom needs to build, test and run its main job, from
# Debian's packages (run as root). Quick when everything is already there.
#   scripts/setup.sh           build and test dependencies, the Fashion-MNIST data, and Debian's
#                              fortunes (English text for the GPT)
#   scripts/setup.sh --torch   also python3-torch (golden fixtures, PyTorch benchmarks, the
#                              interop tests) and the `safetensors` Python package from PyPI,
#                              `tensorboard` (its event-file reader, for the tests) and
#                              `transformers` (the GPT's interop test), in .pydeps/ (Debian 12
#                              packages none of them)
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libeigen3-dev libgtest-dev googletest nlohmann-json3-dev libcli11-dev zlib1g-dev libstb-dev
  libgloo-dev libprotobuf-dev protobuf-compiler libisal-dev
  dataset-fashion-mnist fortunes
  clang libclang-rt-dev libomp-dev llvm  # the fuzzers (scripts/fuzz.sh): libFuzzer, symbolizer
)
if [[ "${1:-}" == "--torch" ]]; then
  packages+=(python3-torch python3-numpy python3-pip)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ "${1:-}" == "--torch" ]]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  if ! PYTHONPATH="$root/.pydeps" /usr/bin/python3 -c "import safetensors" 2>/dev/null; then
    echo "setup: installing the safetensors Python package into $root/.pydeps"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target "$root/.pydeps" safetensors
  fi
  # numpy < 2: the numpy that tensorboard brings lands in .pydeps too and shadows Debian's for
  # Debian's torch 1.13, which is built against numpy 1.x.
  if ! PYTHONPATH="$root/.pydeps" /usr/bin/python3 -c "import tensorboard, numpy, sys; \
      sys.exit(int(numpy.__version__.split('.')[0]) >= 2)" 2>/dev/null; then
    echo "setup: installing the tensorboard Python package into $root/.pydeps"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --upgrade --target "$root/.pydeps" tensorboard "numpy<2"
  fi
  # transformers pinned to a release that runs on Debian's torch 1.13 (4.44.2 to 4.48.3 were
  # seen to), so that a later one, which may want torch 2, never breaks the interop test;
  # numpy < 2 again, or the numpy it brings would shadow Debian's as above.
  if ! PYTHONPATH="$root/.pydeps" /usr/bin/python3 -c "from transformers import GPT2LMHeadModel" \
      2>/dev/null; then
    echo "setup: installing the transformers Python package into $root/.pydeps"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --upgrade --target "$root/.pydeps" "transformers==4.46.3" "numpy<2"
  fi
fi
