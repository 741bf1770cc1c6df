#!/usr/bin/env bash
# Copies vLLM's own Triton attention kernels out of the vLLM wheel into an ignored folder, so
# the kernel benchmarks run them beside ours (on a GPU machine without vLLM, carry the folder).
# The files are vLLM's code: never commit them (.peer/ is in .gitignore).
#   scripts/fetch_vllm_peer.sh [VERSION] [DEST]      defaults: 0.32.0 .peer
set -euo pipefail
version=${1:-0.32.0}
dest=${2:-.peer}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps "vllm==$version" -d "$tmp"
wheel=$(ls "$tmp"/vllm-"$version"-*.whl)
mkdir -p "$dest"
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile
wanted = [
    "vllm/v1/attention/ops/triton_decode_attention.py",
    "vllm/v1/attention/ops/triton_unified_attention.py",
    "vllm/v1/attention/ops/triton_attention_helpers.py",
    "vllm/v1/attention/ops/triton_merge_attn_states.py",
]
with zipfile.ZipFile(sys.argv[1]) as whl:
    names = set(whl.namelist())
    for name in wanted:
        if name in names:
            whl.extract(name, sys.argv[2])
        else:
            print(f"not in this wheel: {name}")
PY
find "$dest/vllm" -type d -exec touch {}/__init__.py \;
echo "vLLM $version kernels under $dest/vllm; the benchmarks' --peer-dir $dest reads them"
