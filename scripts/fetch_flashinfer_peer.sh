#!/usr/bin/env bash
# Downloads FlashInfer (the `flashinfer` / `flashinfer-mla` benchmark peers) as wheels into an
# ignored folder, to carry to a GPU machine without a registry (one command's ~62 MiB; the
# benchmarks install them there with pip --no-deps --target DEST/site on first use).
#   scripts/fetch_flashinfer_peer.sh [DEST] [VERSION]      defaults: .peer_flashinfer 0.7.2.post1
set -euo pipefail
dest=${1:-.peer_flashinfer}
version=${2:-0.7.2.post1}
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform any -d "$dest" "flashinfer-python==$version" "apache-tvm-ffi>=0.1.11,<0.2"
ls -l "$dest"/*.whl
