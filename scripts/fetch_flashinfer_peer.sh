#!/usr/bin/env bash
# Downloads FlashInfer (the `flashinfer` / `flashinfer-mla` benchmark peers) for a GPU machine
# without a registry, in a form that fits one command's carry beside the checkout: the
# flashinfer-python wheel (62 MiB) unpacked and re-packed as flashinfer-site.tar.xz (~18 MiB),
# plus the apache-tvm-ffi wheel. The benchmarks unpack / install both into DEST/site on first
# use (benchmarks/flashinfer_peer.py).
#   scripts/fetch_flashinfer_peer.sh [DEST] [VERSION]      defaults: .peer_flashinfer 0.7.2.post1
set -euo pipefail
dest=${1:-.peer_flashinfer}
version=${2:-0.7.2.post1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform any -d "$tmp" "flashinfer-python==$version" "apache-tvm-ffi>=0.1.11,<0.2"
mkdir -p "$dest" "$tmp/site"
rm -f "$dest"/*.whl "$dest/flashinfer-site.tar.xz"
python3 -m zipfile -e "$tmp"/flashinfer_python-*.whl "$tmp/site"
tar -C "$tmp/site" -cf - . | xz -6 -T2 > "$dest/flashinfer-site.tar.xz"
cp "$tmp"/apache_tvm_ffi-*.whl "$dest/"
ls -l "$dest"
