#!/usr/bin/env bash
# One command, fresh machine: set up, then run the main job (a tiny local model served by vLLM
# with the plugin's BWX_ATTN backend). Extra arguments go to `vllm-bwx demo`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$root/scripts/setup_env.sh"
vllm-bwx doctor || true
exec vllm-bwx demo "$@"
