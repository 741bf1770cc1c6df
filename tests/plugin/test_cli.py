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


def test_doctor_says_the_plugin_is_off_when_vllm_plugins_leaves_it_out():
    done = _doctor(env={**os.environ, "VLLM_PLUGINS": ""})
    assert done.returncode == 1
    assert "problem: VLLM_PLUGINS=''" in done.stdout and "blackwell_ext" in done.stdout


@pytest.mark.parametrize(
    "env, problem, warning",
    [
        ({"VLLM_PLUGINS": ""}, "VLLM_PLUGINS", None),
        ({"VLLM_PLUGINS": "other,blackwell_ext"}, None, None),
        ({"BWX_DFLASH": "maybe"}, "BWX_DFLASH", None),
        ({"BWX_ATTN_FRESH_PREFILL": "false"}, None, None),
        ({"BWX_ATTN_FRESH_PREFILL": "nein"}, "BWX_ATTN_FRESH_PREFILL", None),
        ({"BWX_DEBUG_BOUNDS": "maybe"}, "BWX_DEBUG_BOUNDS", None),
        ({"BWX_CPU_BACKENDS": "attn,bogus"}, "BWX_CPU_BACKENDS", None),
        ({"BWX_CPU_BACKENDS": "attn"}, None, "TRITON_INTERPRET=1"),
        ({"BWX_CPU_BACKENDS": "attn", "TRITON_INTERPRET": "1"}, None, None),
    ],
)
def test_environment_problems_are_report_lines_naming_the_variable(env, problem, warning):
    from vllm_blackwell_ext.cli import environment_report

    problems, warnings = environment_report(env)
    assert [problem in line for line in problems] == ([True] if problem else [])
    assert [warning in line for line in warnings] == ([True] if warning else [])


def test_doctor_shows_each_switch_in_force_and_refuses_a_bad_value():
    # One run (each costs a vLLM import): a switch set, one bad, one at its default.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BWX_")}
    done = _doctor(env={**env, "BWX_ATTN_FRESH_PREFILL": "off", "BWX_DEBUG_BOUNDS": "maybe"})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "BWX_ATTN_FRESH_PREFILL   off (BWX_ATTN_FRESH_PREFILL='off')" in done.stdout
    assert "BWX_DFLASH               off (default)" in done.stdout
    assert "BWX_DEBUG_BOUNDS         not valid" in done.stdout
    assert "problem: BWX_DEBUG_BOUNDS: expected one of" in done.stdout


def test_version_flag_prints_the_package_version():
    from vllm_blackwell_ext import __version__

    done = subprocess.run(
        [sys.executable, "-m", "vllm_blackwell_ext.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"vllm-bwx {__version__}"


def test_the_commands_are_doctor_and_demo():
    """The benchmarks are scripts under benchmarks/, not part of the installed CLI."""
    from vllm_blackwell_ext.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "kv-gather"])
    assert exit_info.value.code == 2


def test_doctor_shows_the_plans_each_backend_makes_on_the_device():
    """`vllm-bwx doctor` reads the plans the backends launch (variant, splits, tiles), for a
    Hopper here: prefill over whole-tile pages takes TMA tiles where this Triton compiles
    them, decode gathers; fp8 rows only where the device has fp8."""
    from vllm_blackwell_ext.cli import mla_decode_plans, paged_attention_plans
    from vllm_blackwell_ext.kernels.device import DeviceInfo
    from vllm_blackwell_ext.kernels.launch_cache import triton_version
    from vllm_blackwell_ext.kernels.paged_attention import PREFILL_TMA_MIN_TRITON

    hopper = DeviceInfo("H100", (9, 0), num_sms=132, smem_per_block=232_448)
    attn = paged_attention_plans(hopper)
    prefill = attn["bf16 cache, prefill 8k, pages of 128"]
    tma = triton_version() >= PREFILL_TMA_MIN_TRITON
    assert prefill.startswith("triton_tma: " if tma else "triton_gather: ")
    assert attn["fp8 cache, decode B=64 x 32k, pages of 128"].startswith("triton_gather: ")
    assert set(mla_decode_plans(hopper)) == {
        "bf16 cache, 128 heads, B=64 x 32k",
        "fp8 cache, 128 heads, B=64 x 32k",
    }
    ampere = DeviceInfo("A100", (8, 0), num_sms=108, smem_per_block=166_912)
    assert all(k.startswith("bf16") for k in paged_attention_plans(ampere))
