"""The probe that decides whether vLLM's own CPU attention can serve on this host: it must run
vLLM's kernel, check its output, and turn a crash or an error into one line naming the kernel."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.vllm_cpu_attention_probe import host_isa, probe

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
    assert result.line == (
        "vLLM's own CPU attention (ISA amx, bf16, block 128): the process was killed by SIGILL"
    )


@pytest.mark.e2e
def test_probe_reports_a_kernel_that_raises():
    result = probe("no-such-isa")
    assert not result.ok
    assert result.line.startswith("vLLM's own CPU attention (ISA no-such-isa, bf16, block 128): ")
    assert "failed:" in result.line
