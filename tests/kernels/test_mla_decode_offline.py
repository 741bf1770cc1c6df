"""MLA decode's tuned configs, compiled offline for each class's own
architecture (Triton's bundled ptxas, no GPU). A file of its own: these compiles are CPU-bound
minutes, which pytest-xdist's `--dist loadfile` runs beside the interpreter tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("device_class", ["sm80", "sm89", "sm90", "sm100", "sm120"])
def test_table_entries_compile_clean_for_their_class(device_class):
    """Each entry compiled offline for its architecture (Triton's bundled ptxas, no GPU): one
    over the class's per-block shared memory would fail at its first launch on that part, one
    that compiles to a trap would fault there, and spills in its loop cost every tile.
    In a subprocess: under TRITON_INTERPRET the kernels are interpreter objects, not compilable.
    """
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), str(repo), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "benchmarks/tune_mla_decode.py", "--check", device_class],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{device_class} fp8" in run.stdout or device_class == "sm80", run.stdout
