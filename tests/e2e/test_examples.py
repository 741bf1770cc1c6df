"""Every example in `examples/` that can run on the CPU runs here, as a user runs it (its own
process, from the repository root), and prints what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


MAX_LINES_SHOWN = 25


def _run(script: str, *args: str, tmp_path: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}  # tiny checkpoints written here
    done = subprocess.run(
        [sys.executable, f"examples/{script}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # What a user reads: the example's own lines; vLLM's log goes to a file (--verbose shows it).
    shown = (done.stdout + done.stderr).splitlines()
    assert len(shown) <= MAX_LINES_SHOWN, "\n".join(shown)
    return done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_offline_generate_serves_every_layer_with_bwx_attn(kv_cache_dtype, tmp_path):
    out = _run("offline_generate.py", "--kv-cache-dtype", kv_cache_dtype, tmp_path=tmp_path)
    assert out.count("' -> ' w") == 2, out
    assert "attention served by: [['BWX_ATTN']]" in out


@pytest.mark.e2e
def test_mla_generate_serves_every_layer_with_bwx_mla(tmp_path):
    out = _run("mla_generate.py", "--kv-cache-dtype", "fp8", tmp_path=tmp_path)
    assert "' -> ' w" in out and "attention served by: [['BWX_MLA']]" in out


@pytest.mark.e2e
def test_serve_and_request_gets_a_completion(tmp_path):
    out = _run("serve_and_request.py", tmp_path=tmp_path)
    assert "completion of 'w5 w6 w7 w8': ' w" in out


@pytest.mark.e2e
def test_dflash_speculate_reports_acceptance_from_vllm_counters(tmp_path, session_cache):
    # Its tiny pair is the one tests/dflash/test_acceptance_bench.py trains: one training per
    # session (the trainer locks, so whichever comes second reuses the first's pair).
    out = _run("dflash_speculate.py", tmp_path=session_cache)
    tau = float(out.split("mean acceptance length ")[1].split()[0])
    assert 1.0 < tau <= 4.0, out  # block 4: at most 3 drafts accepted per step, some were
    assert "speculative output equals the target's own greedy output: True" in out


def test_gather_op_example_reads_the_pages_back_exactly(tmp_path):
    out = _run("gather_op.py", tmp_path=tmp_path)
    assert "from an fp8 cache into torch.bfloat16: exact" in out
