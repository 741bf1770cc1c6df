#!/usr/bin/env bash
# The tests that need vLLM's Python code but no platform, against vLLM versions that have no
# CPU build (the CUDA wheel, installed without a GPU): registration in a fresh process, backend
# pickling, backend selection through CudaPlatform with the device capability stubbed, the JIT
# warm-up registration, the DFlash config and (0.34) its speculative method. Each version gets
# a throwaway environment (scripts/cuda_wheel/make_env.sh), removed afterwards.
#
#   scripts/test_vllm_series.sh 0.33.0 0.34.0
set -euo pipefail
# pip names every index folder this machine lacks a package in; keep the log to what matters.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
[[ $# -ge 1 ]] || { sed -n '2,8p' "$0"; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
subset=(
  tests/plugin
  tests/attention/test_bwx_attn_selection.py
  tests/attention/test_bwx_mla_selection.py
  tests/attention/test_jit_warmup.py
  tests/dflash/test_config.py
  tests/dflash/test_speculative_method.py
)
status=0
for version in "$@"; do
  env_dir=$(mktemp -d "${TMPDIR:-/tmp}/bwx-vllm-$version-XXXXXX")
  trap 'rm -rf "$env_dir"' EXIT
  "$root/scripts/cuda_wheel/make_env.sh" "$version" "$env_dir/venv"
  py="$env_dir/venv/bin/python"
  PIP_CONSTRAINT= "$py" -m pip install -q --disable-pip-version-check --no-deps "$root"
  PIP_CONSTRAINT= "$py" -m pip install -q --disable-pip-version-check pytest hypothesis
  echo "[test_vllm_series] vLLM $version: python -m pytest ${subset[*]}"
  (cd "$root" && "$py" -m pytest -q -p no:cacheprovider "${subset[@]}") || status=1
  rm -rf "$env_dir"
  trap - EXIT
done
exit $status
