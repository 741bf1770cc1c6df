#!/usr/bin/env bash
# One command, fresh machine: set up, lint, and run the whole test suite (CPU: kernels under
# TRITON_INTERPRET=1, real vLLM engines for the e2e tests). Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$root/scripts/setup_env.sh"
cd "$root"
echo "[test] ruff"
ruff check .
ruff format --check .
# Where this run happens (pytest -q hides the session header that says the same).
python -c 'from vllm_blackwell_ext.host_cpu import cpu_summary_line as h; print("[test] host CPU:", h())'
echo "[test] pytest"
set +e
python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
case $status in
  0) echo "[test] all tests passed" ;;
  5) echo "[test] pytest collected no tests: treating as failure"; status=1 ;;
  *) echo "[test] pytest failed with exit status $status" ;;
esac
exit $status
