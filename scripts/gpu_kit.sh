#!/usr/bin/env bash
# Carries a CUDA vLLM (0.32 by default; BWX_KIT_VLLM=0.34.0 for 0.34) and the torch it is built
# for to a GPU machine that cannot reach a package registry and takes at most ~64 MiB of files
# per command, then runs commands there with the plugin installed on top.
#
#   scripts/gpu_kit.sh prepare     (here, with registry access) download the wheels, pack them
#                                  into one tar cut into .gpu_kit/part-NN pieces + MANIFEST
#   scripts/gpu_kit.sh receive     (there, once per piece) move the pieces that came along into
#                                  the stash; prints what is held and the piece to bring next
#   scripts/gpu_kit.sh install     (there) join the pieces, check them, install the wheels
#   scripts/gpu_kit.sh run CMD...  (there) install the plugin from this checkout and run CMD
#                                  with the kit's torch, vLLM and the plugin on PYTHONPATH
#   scripts/gpu_kit.sh bg NAME CMD...   (there) `run` CMD in its own session, so it outlives
#                                  the command that started it (a run longer than one call)
#   scripts/gpu_kit.sh wait NAME SECS   (there) wait up to SECS for it; print its log's tail
#
# The stash lives outside the checkout ($BWX_KIT_DIR, default /tmp/bwx-kit-VERSION), so pieces
# survive between commands for as long as the machine is held; `receive` resumes from what is
# there. Give every command of one kit the same BWX_KIT_VLLM.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kit_src="$root/.gpu_kit"
vllm_version=${BWX_KIT_VLLM:-0.32.0}
kit_dir=${BWX_KIT_DIR:-/tmp/bwx-kit-$vllm_version}
# A piece and the checkout travel together within the 64 MiB a command may carry.
piece_mib=${BWX_KIT_PIECE_MIB:-52}
# The wheels a CUDA vLLM engine needs on top of an image with torch 2.11, per vLLM version: the
# torch, Triton, NCCL and torchvision it pins (why each: the README's "On a GPU machine"
# section), and the requirements that version adds to scripts/gpu_kit_requirements.txt.
stub_packages=()
case "$vllm_version" in
  0.32.*) big_wheels=(torch==2.13.0 triton==3.7.1 nvidia-nccl-cu13==2.29.7 torchvision==0.28.0) ;;
  0.34.*) big_wheels=(torch==2.14.0 triton==3.8.0 nvidia-nccl-cu13==2.30.7 torchvision==0.29.0
                      orjson)
          # Its engine start imports the CuTe DSL and quack-kernels (MiniMax-M3 kernels only):
          # inert stand-ins instead of hundreds of MB (scripts/gpu_kit_stubs/cutlass says why).
          stub_packages=(cutlass quack) ;;
  *) echo "[gpu_kit] BWX_KIT_VLLM=$vllm_version: kits exist for 0.32.x and 0.34.x" >&2; exit 2 ;;
esac
big_wheels+=("vllm==$vllm_version")

die() { echo "[gpu_kit] $*" >&2; exit 1; }

prepare() {
  local wheels="$kit_src/wheels" plat=()
  for n in 5 17 18 24 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
  plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
  rm -rf "$wheels"
  mkdir -p "$wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d "$wheels" "${big_wheels[@]}" \
    -r "$root/scripts/gpu_kit_requirements.txt"
  rm -f "$kit_src"/part-* "$kit_src/MANIFEST"
  (cd "$wheels" && tar -cf - ./*.whl) | split -b "${piece_mib}M" -d -a 2 - "$kit_src/part-"
  (cd "$kit_src" && sha256sum part-* > MANIFEST)
  local n
  n=$(wc -l < "$kit_src/MANIFEST")
  echo "[gpu_kit] vLLM $vllm_version: $(du -sh "$wheels" | cut -f1) of wheels in $n pieces of ${piece_mib} MiB under .gpu_kit/"
  echo "[gpu_kit] next: one command per piece on the GPU machine, carrying .gpu_kit/MANIFEST"
  echo "          and .gpu_kit/part-NN, running: scripts/gpu_kit.sh receive"
}

receive() {
  [[ -f "$kit_src/MANIFEST" ]] || die "no .gpu_kit/MANIFEST in this checkout: carry it along"
  mkdir -p "$kit_dir/stash"
  cp -f "$kit_src/MANIFEST" "$kit_dir/stash/MANIFEST"
  # Pieces that came along this time are checked on arrival; held ones were checked then.
  local piece
  for piece in "$kit_src"/part-*; do
    [[ -f "$piece" ]] || continue
    if grep -q "^$(sha256sum < "$piece" | cut -d' ' -f1)  $(basename "$piece")\$" "$kit_src/MANIFEST"; then
      cp -f "$piece" "$kit_dir/stash/"
    else
      echo "[gpu_kit] $(basename "$piece") does not match MANIFEST: not kept" >&2
    fi
  done
  local held=0 missing=()
  while read -r _sum name; do
    if [[ -f "$kit_dir/stash/$name" ]]; then held=$((held + 1)); else missing+=("$name"); fi
  done < "$kit_dir/stash/MANIFEST"
  echo "[gpu_kit] holding $held of $(wc -l < "$kit_dir/stash/MANIFEST") pieces in $kit_dir/stash"
  if ((${#missing[@]})); then
    echo "[gpu_kit] next: carry .gpu_kit/${missing[0]} (missing: ${missing[*]})"
  else
    echo "[gpu_kit] next: scripts/gpu_kit.sh install"
  fi
}

install() {
  [[ -f "$kit_dir/site/.bwx-kit-complete" ]] && { echo "[gpu_kit] already installed in $kit_dir/site"; return; }
  (cd "$kit_dir/stash" && sha256sum --quiet -c MANIFEST) || die "pieces missing or damaged: run receive"
  rm -rf "$kit_dir/wheels" "$kit_dir/site"
  mkdir -p "$kit_dir/wheels" "$kit_dir/site"
  cat "$kit_dir/stash"/part-* | tar -xf - -C "$kit_dir/wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$kit_dir/site" "$kit_dir/wheels"/*.whl
  local stub
  for stub in ${stub_packages[@]+"${stub_packages[@]}"}; do
    cp -r "$root/scripts/gpu_kit_stubs/$stub" "$kit_dir/site/"
  done
  rm -rf "$kit_dir/wheels"
  touch "$kit_dir/site/.bwx-kit-complete"
  echo "[gpu_kit] installed into $kit_dir/site; next: scripts/gpu_kit.sh run CMD..."
}

install_plugin() {
  # The package and a dist-info holding pyproject's entry points (vLLM finds the plugin
  # through them); no build backend needed, so it works on any image with Python 3.11+.
  rm -rf "$kit_dir/plugin"
  mkdir -p "$kit_dir/plugin"
  cp -r "$root/src/vllm_blackwell_ext" "$kit_dir/plugin/"
  python3 - "$root/pyproject.toml" "$kit_dir/plugin" <<'PY'
import sys, tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
info = Path(sys.argv[2]) / f"vllm_blackwell_ext-{project['version']}.dist-info"
info.mkdir()
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
)
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
(info / "entry_points.txt").write_text(
    "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for g, eps in groups.items())
)
PY
}

run() {
  [[ -f "$kit_dir/site/.bwx-kit-complete" ]] || die "the kit is not installed: run install"
  install_plugin
  export PYTHONPATH="$kit_dir/plugin:$kit_dir/site:$root${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$kit_dir/site/bin:$PATH"
  # vLLM's default sampler path imports FlashInfer, which the kit does not carry.
  export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
  export PYTHONUNBUFFERED=1
  "$@"
}

bg() {
  local name=$1
  shift
  mkdir -p "$kit_dir/jobs"
  rm -f "$kit_dir/jobs/$name.rc"
  setsid nohup bash -c '"$0" run "${@:2}"; echo $? > "$1"' "${BASH_SOURCE[0]}" \
    "$kit_dir/jobs/$name.rc" "$@" > "$kit_dir/jobs/$name.log" 2>&1 < /dev/null &
  echo "[gpu_kit] $name started; log $kit_dir/jobs/$name.log"
}

wait_job() {
  local name=$1 deadline=$((SECONDS + $2))
  while [[ ! -f "$kit_dir/jobs/$name.rc" ]] && ((SECONDS < deadline)); do sleep 5; done
  tail -c 6000 "$kit_dir/jobs/$name.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -60
  if [[ -f "$kit_dir/jobs/$name.rc" ]]; then
    echo "[gpu_kit] $name finished with exit status $(cat "$kit_dir/jobs/$name.rc")"
  else
    echo "[gpu_kit] $name still running"
  fi
}

case "${1:-}" in
  prepare) prepare ;;
  receive) receive ;;
  install) install ;;
  run) shift; [[ $# -gt 0 ]] || die "run: give a command"; run "$@" ;;
  bg) shift; [[ $# -gt 1 ]] || die "bg: give a name and a command"; bg "$@" ;;
  wait) [[ $# -eq 3 ]] || die "wait: give a name and seconds"; wait_job "$2" "$3" ;;
  *) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
