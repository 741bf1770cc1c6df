"""`vllm-bwx demo` (the README's main job) runs ours and vLLM's own attention on the tiny model
and prints them side by side, with vLLM's log in files."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.e2e
def test_demo_prints_text_backends_and_the_comparison(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vllm_blackwell_ext.cli", "demo", "--model-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    assert "BWX_ATTN: served by BWX_ATTN (4 layers)" in out
    assert "vllm-default: served by CPU_ATTN (4 layers)" in out
    assert out.count("prompt 'w") == 3
    assert out.count("same tokens") + out.count("differs from token") == 3
    assert "Triton's interpreter" in out
    assert " INFO " not in out  # vLLM's log went to the files named above
