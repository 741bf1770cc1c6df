#!/usr/bin/env bash
# Packs FlashMLA's sm90 dense-decode sources and CUTLASS's headers (the `flashmla` peer of
# benchmarks/bench_mla_decode.py) from a FlashMLA checkout into one ~1 MiB archive, to carry to
# a GPU machine without network access; benchmarks/flashmla_peer.py builds them there.
#   git clone --recursive https://github.com/deepseek-ai/FlashMLA
#   scripts/fetch_flashmla_peer.sh FLASHMLA_CHECKOUT [DEST]       default DEST: .peer_flashmla
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,6p' "$0"; exit 2; }
src=$(cd "$1" && pwd)
dest=${2:-.peer_flashmla}
[[ -f "$src/csrc/cutlass/include/cute/tensor.hpp" ]] ||
  { echo "no CUTLASS under $src/csrc/cutlass: clone with --recursive" >&2; exit 1; }
mkdir -p "$dest"
(cd "$src" && tar -cf - LICENSE csrc/api csrc/*.h csrc/kerutils csrc/sm90/*.h \
  csrc/sm90/decode/dense csrc/smxx csrc/cutlass/LICENSE.txt csrc/cutlass/include \
  csrc/cutlass/tools/util/include) | xz -6 > "$dest/flashmla-src.tar.xz"
echo "FlashMLA $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?'): $(du -h "$dest/flashmla-src.tar.xz" | cut -f1) in $dest/flashmla-src.tar.xz"
