#!/usr/bin/env bash
# A virtual environment holding the CUDA wheel of a vLLM version, on a machine without a GPU:
# enough to import vLLM's Python code (registries, CudaPlatform, attention and MLA classes) and
# test the plugin against it. vLLM 0.33 and 0.34 have no CPU build; this is how the CPU tests
# reach them.
#
#   scripts/cuda_wheel/make_env.sh VERSION DIR
#
# The torch version the wheel pins is installed with its CUDA libraries (no CPU build of it is
# published); vLLM with --no-deps, plus its requirements less the GPU-only kernel packages
# (requirements.py); a stub libcuda.so.1 (cuda_stub.sh) lets vLLM's compiled extensions load.
# Downloads are kept in $BWX_WHEELHOUSE (default ~/.cache/vllm-bwx/wheelhouse): about 3.6 GB
# for 0.33 and 0.34 together; each environment takes about 7 GB.
set -euo pipefail
# pip names every index folder this machine lacks a package in; keep the log to what matters.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
[[ $# -eq 2 ]] || { sed -n '2,13p' "$0"; exit 2; }
version=$1
dir=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
wheels=${BWX_WHEELHOUSE:-$HOME/.cache/vllm-bwx/wheelhouse}
export PIP_CONSTRAINT=  # the environment's own pins decide, not a machine-wide constraints file
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$wheels"
start=$(date +%s)
"${PYTHON:-python3}" -m venv "$dir"
pip=("$dir/bin/python" -m pip -q)
"${pip[@]}" download --no-deps -d "$wheels" "vllm==$version"
wheel=$(ls "$wheels"/vllm-"$version"-*.whl | head -1)
"$dir/bin/python" "$here/requirements.py" --requirements "$wheel" > "$dir/vllm-requirements.txt"
torch_req=$("$dir/bin/python" "$here/requirements.py" --torch "$wheel")
"${pip[@]}" download -d "$wheels" "$torch_req" -r "$dir/vllm-requirements.txt"
"${pip[@]}" install --no-index --find-links "$wheels" "$torch_req" -r "$dir/vllm-requirements.txt"
"${pip[@]}" install --no-index --no-deps "$wheel"
"$here/cuda_stub.sh" "$dir" > /dev/null
echo "[cuda_wheel] vllm $version ($torch_req) in $dir, $(( $(date +%s) - start )) s"
