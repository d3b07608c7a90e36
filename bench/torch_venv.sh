#!/usr/bin/env bash
# Makes the virtual environment that the benchmarks' PyTorch peer runs in: the current PyTorch 2.x
# from PyPI (and transformers, for the GPT interop checks), in .bench-venv/ at the repository
# root. Debian's python3-torch 1.13 multiplies matrices with a reference BLAS here and is no fair
# peer for speed. Not used by CI: the wheel and its CUDA libraries are gigabytes.
#
#   bench/torch_venv.sh            # make it (once), print its python
#   bench/torch_venv.sh --python   # only print its python, or fail if it is missing
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LOOM_BENCH_VENV:-$root/.bench-venv}"
python="$venv/bin/python"
if [[ "${1:-}" == "--python" ]]; then
  [[ -x "$python" ]] || { echo "no bench venv at $venv: run bench/torch_venv.sh" >&2; exit 2; }
  echo "$python"
  exit 0
fi
if ! "$python" -c "import torch, transformers, tokenizers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip
  "$python" -m pip install --quiet torch transformers tokenizers numpy
fi
"$python" -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads())" >&2
echo "$python"
