#!/usr/bin/env bash
# One command, fresh machine: set up, lint, and run the whole test suite (CPU: kernels under
# TRITON_INTERPRET=1, real vLLM engines for the e2e tests), then the fast subset against the
# other supported vLLM versions. Extra arguments go to pytest (and skip the other versions).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$root/scripts/setup_env.sh"
cd "$root"
echo "[test] ruff"
ruff check .
ruff format --check .
echo "[test] lint-imports"
# Import contracts ([tool.importlinter] in pyproject.toml): which layer may import which.
lint-imports
# Where this run happens (pytest -q hides the session header that says the same).
python -c 'from vllm_blackwell_ext.host_cpu import cpu_summary_line as h; print("[test] host CPU:", h())'
# Whether vLLM's own CPU attention kernel runs here (the serve test skips that path if not).
python -c 'from tests.e2e.vllm_cpu_attention_probe import probe; print("[test]", probe().line)'
echo "[test] pytest"
set +e
python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
case $status in
  0) echo "[test] pytest passed" ;;
  5) echo "[test] pytest collected no tests: treating as failure"; status=1 ;;
  *) echo "[test] pytest failed with exit status $status" ;;
esac
# The other supported vLLM versions (CUDA wheels, no CPU build): their fast subset, on a full
# run only (no pytest arguments). BWX_VLLM_SERIES="" leaves them out.
series=${BWX_VLLM_SERIES-0.33.0 0.34.0}
if [[ $# -eq 0 && -n "$series" ]]; then
  echo "[test] vLLM $series: the fast subset, each in a throwaway environment"
  # shellcheck disable=SC2086
  "$root/scripts/test_vllm_series.sh" $series || { echo "[test] vLLM $series: failed"; status=1; }
fi
[[ $status -eq 0 ]] && echo "[test] all tests passed"
exit $status
