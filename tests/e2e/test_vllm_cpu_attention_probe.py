"""The probe that decides whether vLLM's own CPU attention can serve on this host: it must run
vLLM's kernel, check its output, and turn a crash or an error into one line naming the kernel."""

from __future__ import annotations

import re

import pytest
import torch

from tests.e2e.vllm_cpu_attention_probe import crash_site, host_isa, probe

HAS_AMX_TILES = torch.cpu._is_amx_tile_supported()


@pytest.mark.e2e
def test_probe_runs_vllms_own_kernel_and_checks_it():
    if HAS_AMX_TILES:
        pytest.skip(
            "this host has AMX tiles, where vLLM's AMX kernel may not run: the serve test asks "
            "the probe, and scripts/test.sh prints its verdict"
        )
    result = probe()
    assert result.ok, result.line
    assert f"ISA {host_isa()}," in result.line and "matched torch attention" in result.line


@pytest.mark.e2e
def test_probe_reports_a_kernel_that_kills_its_process():
    # vLLM's AMX kernel on a CPU without AMX dies by SIGILL, as a worker would mid-request.
    if HAS_AMX_TILES:
        pytest.skip("this host runs AMX instructions: the forced crash needs a CPU without them")
    result = probe("amx")
    assert not result.ok
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
        pytest.skip("this host runs AMX instructions: the forced crash needs a CPU without them")
    result = probe("amx", retry_with_amx_permission=True)
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
