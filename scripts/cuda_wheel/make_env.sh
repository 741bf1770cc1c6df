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
# for 0.33 and 0.34 together; each environment takes about 7 GB. Installs come from that folder
# only (`--no-index`); the registry is asked only for what it lacks. With `uv` on PATH (the `test`
# extra brings it) the environment is made and filled by uv: wheels unpacked in parallel into
# uv's cache once, then linked, so a second environment with the same torch costs seconds.
# BWX_NO_UV=1 keeps pip.
set -euo pipefail
# pip names every index folder this machine lacks a package in; keep the log to what matters.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
[[ $# -eq 2 ]] || { sed -n '2,17p' "$0"; exit 2; }
version=$1
dir=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
wheels=${BWX_WHEELHOUSE:-$HOME/.cache/vllm-bwx/wheelhouse}
export PIP_CONSTRAINT=  # the environment's own pins decide, not a machine-wide constraints file
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$wheels"
start=$(date +%s)
uv=$(command -v uv || true)
[[ -n "${BWX_NO_UV:-}" ]] && uv=
if [[ -n "$uv" ]]; then
  "$uv" venv -q --seed --python "${PYTHON:-python3}" "$dir"
  install=("$uv" pip install -q --python "$dir/bin/python")
else
  "${PYTHON:-python3}" -m venv "$dir"
  install=("$dir/bin/python" -m pip -q install)
fi
pip=("$dir/bin/python" -m pip -q)
wheel=$(ls "$wheels"/vllm-"$version"-*.whl 2>/dev/null | head -1 || true)
if [[ -z "$wheel" ]]; then
  "${pip[@]}" download --no-deps -d "$wheels" "vllm==$version"
  wheel=$(ls "$wheels"/vllm-"$version"-*.whl | head -1)
fi
"$dir/bin/python" "$here/requirements.py" --requirements "$wheel" > "$dir/vllm-requirements.txt"
torch_req=$("$dir/bin/python" "$here/requirements.py" --torch "$wheel")
# From the wheelhouse alone when it holds everything (a cache hit: no registry round trips);
# otherwise download what is missing first.
offline=("${install[@]}" --no-index --find-links "$wheels" "$torch_req" -r "$dir/vllm-requirements.txt")
if ! "${offline[@]}" 2>/dev/null; then
  "${pip[@]}" download -d "$wheels" "$torch_req" -r "$dir/vllm-requirements.txt"
  "${offline[@]}"
fi
"${install[@]}" --no-index --no-deps "$wheel"
"$here/cuda_stub.sh" "$dir" > /dev/null
echo "[cuda_wheel] vllm $version ($torch_req${uv:+, uv}) in $dir, $(( $(date +%s) - start )) s"
