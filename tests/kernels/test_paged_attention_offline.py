"""The paged-attention launches of every device class, compiled offline for each class's own
architecture (Triton's bundled ptxas, no GPU). A file of its own: these compiles are CPU-bound
minutes, which pytest-xdist's `--dist loadfile` runs beside the interpreter tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("device_class", ["sm80", "sm89", "sm90", "sm100", "sm120"])
def test_configs_compile_for_each_device_class_without_loop_spills_or_traps(device_class):
    """The launches `paged_attention` makes on each device class, compiled offline for that
    architecture (Triton's bundled ptxas, no GPU; `benchmarks/attn_offline_check.py --quick`):
    each must fit the class's shared memory, keep its loops free of register spills and be a
    real kernel (Triton lowers programs it cannot build for sm100 to a trap). In a subprocess:
    under TRITON_INTERPRET the kernels are interpreter objects, not compilable."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), str(repo), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "benchmarks/attn_offline_check.py", "--check", device_class, "--quick"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    assert f"{device_class}: " in run.stdout and " distinct compiles, 0 failed" in run.stdout
