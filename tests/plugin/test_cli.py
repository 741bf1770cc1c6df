"""`vllm-bwx doctor`: what it reports here, and its exit status, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="the doctor's registration report needs vLLM")


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_blackwell_ext.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_doctor_json_lists_every_registered_component():
    done = _doctor("--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["entry_point_found"] is True
    assert set(report["registered"]["backends"]) == {"BWX_ATTN", "BWX_MLA"}
    assert "BwxDFlashDraftModel" in report["registered"]["models"]
    assert sorted(report["ops"]["available"]) == [
        "torch.ops.vllm_blackwell_ext.cp_gather_cache",
        "torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache",
    ]
    for backend in report["backends"].values():
        assert backend["runs_here"]  # always says whether, and if not why


def test_doctor_fails_and_says_why_when_the_plugin_cannot_register():
    env = {**os.environ, "BWX_CPU_BACKENDS": "bogus"}
    done = _doctor(env=env)
    assert done.returncode == 1
    assert "BWX_CPU_BACKENDS" in done.stdout and "cannot register" in done.stdout
