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
# The other supported vLLM versions (CUDA wheels, no CPU build): their fast subset, on a full
# run only (no pytest arguments). BWX_VLLM_SERIES="" leaves them out. It runs beside pytest
# (its time is mostly downloads and unpacking wheels), its log printed after pytest's;
# BWX_SERIES_AFTER=1 runs it after pytest instead.
series=${BWX_VLLM_SERIES-0.33.0 0.34.0}
series_pid=
series_log=$(mktemp "${TMPDIR:-/tmp}/bwx-series-XXXXXX.log")
run_series() {
  echo "[test] vLLM $series: the fast subset, each in a throwaway environment"
  # shellcheck disable=SC2086
  "$root/scripts/test_vllm_series.sh" $series
}
if [[ $# -eq 0 && -n "$series" && -z "${BWX_SERIES_AFTER:-}" ]]; then
  run_series > "$series_log" 2>&1 &
  series_pid=$!
fi
# Every core (pytest-xdist). `--dist loadfile`: each test file runs whole in one worker, so a
# module-scoped fixture (a module's vLLM engines) is still made once. (`loadgroup` would spread
# finer, but pytest-xdist 3.8 cannot rename the node ids of pytest 9, so its groups are ignored.)
# Files go out longest first (tests/conftest.py orders them by tests/file_seconds.json), not
# xdist's own order by test count, which started the engine files last. One thread per worker
# (torch and OpenMP take every core by default; with a worker per core they wait on each
# other); the engines the tests start inherit it. BWX_PYTEST_WORKERS=1 runs in one process.
workers=${BWX_PYTEST_WORKERS:-$(nproc)}
xdist=()
if [[ "$workers" -gt 1 ]] && python -c "import xdist" 2>/dev/null; then
  xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
echo "[test] pytest ${xdist[*]}"
pytest_start=$(date +%s)
set +e
python -m pytest -q -p no:cacheprovider "${xdist[@]}" "$@"
status=$?
set -e
echo "[test] pytest took $(( $(date +%s) - pytest_start )) s"
case $status in
  0) echo "[test] pytest passed" ;;
  5) echo "[test] pytest collected no tests: treating as failure"; status=1 ;;
  *) echo "[test] pytest failed with exit status $status" ;;
esac
if [[ -n "$series_pid" ]]; then
  series_status=0
  wait "$series_pid" || series_status=$?
  cat "$series_log"
  [[ $series_status -eq 0 ]] || { echo "[test] vLLM $series: failed"; status=1; }
elif [[ $# -eq 0 && -n "$series" ]]; then
  run_series || { echo "[test] vLLM $series: failed"; status=1; }
fi
rm -f "$series_log"
[[ $status -eq 0 ]] && echo "[test] all tests passed"
exit $status
