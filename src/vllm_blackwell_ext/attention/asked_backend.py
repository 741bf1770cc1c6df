"""What the engine being built asked for, read from vLLM's config, and our refusal of an ask
our backends cannot serve.

`asked_backend_refusal` runs where vLLM resolves the configuration, in the process the user
started (our platform's `check_and_update_config`, `vllm_blackwell_ext.platforms`), so its
message is the exception the user gets rather than a line in a worker's trace.
`latent_attention_was_asked` serves the CPU engine's refusal inside the worker (vLLM's CPU
platform hands every model its own attention entry, whatever `--attention-backend` named).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import get_current_vllm_config_or_none

from vllm_blackwell_ext.components import BWX_ATTN, BWX_MLA, CPU_OVERRIDE_TARGETS
from vllm_blackwell_ext.kernels.device import MIN_CAPABILITY
from vllm_blackwell_ext.registration import CPU_OVERRIDE_ENV, parse_cpu_override
from vllm_blackwell_ext.switches import parse_flag

LATENT_ATTENTION_ASKED = (
    "attention_backend=BWX_MLA was asked for, but this model has no latent attention (MLA): "
    "choose BWX_ATTN"
)
WITH_LATENT_ATTENTION = (
    "this model has latent attention (MLA), which BWX_ATTN does not serve: choose "
    "--attention-backend BWX_MLA"
)
WHAT_TO_DO = "Change what the reason names, or leave --attention-backend unset for vLLM's choice."


def latent_attention_was_asked() -> bool:
    """Whether the engine being built asked for BWX_MLA (False outside an engine's build)."""
    config = get_current_vllm_config_or_none()
    backend = config.attention_config.backend if config is not None else None
    return backend is not None and backend.name == BWX_MLA.name


@dataclass(frozen=True)
class AskedAttention:
    """What the configuration asks an attention backend to serve, model-wide."""

    model: str
    use_mla: bool
    dtype: torch.dtype
    kv_cache_dtype: str
    head_size: int
    # MLA models: the latent's (kv_lora_rank, qk_rope_head_dim).
    latent: tuple[int, int] | None

    @classmethod
    def of(cls, vllm_config: Any) -> AskedAttention:
        model = vllm_config.model_config
        text = model.hf_text_config
        latent = None
        if model.use_mla:
            latent = (getattr(text, "kv_lora_rank", 0), getattr(text, "qk_rope_head_dim", 0))
        return cls(
            str(model.model), bool(model.use_mla), model.dtype,
            str(vllm_config.cache_config.cache_dtype), model.get_head_size(), latent,
        )  # fmt: skip

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        shape = (
            f"kv_lora_rank={self.latent[0]}, qk_rope_head_dim={self.latent[1]}"
            if self.latent is not None
            else f"head_size={self.head_size}"
        )
        return f"{shape}, dtype={dtype}, kv_cache_dtype={self.kv_cache_dtype!r}"


def asked_backend_refusal(
    vllm_config: Any, device_capability: Any, *, cpu_engine: bool = False
) -> str | None:
    """Our message where `vllm_config` names BWX_ATTN or BWX_MLA for a model or cache that
    backend cannot serve on a device of `device_capability` (None: no GPU), or, for a
    `cpu_engine`, where this engine would not run it; None otherwise.

    The message says what was asked, each reason with what the backend takes instead, and
    what to do. Model-wide values only: a refusal here is one every layer would meet.
    """
    backend = vllm_config.attention_config.backend
    if backend is None or vllm_config.model_config is None:
        return None
    asked = AskedAttention.of(vllm_config)
    if backend.name == BWX_ATTN.name:
        reasons = _bwx_attn_reasons(asked, device_capability)
    elif backend.name == BWX_MLA.name:
        reasons = _bwx_mla_reasons(asked, device_capability)
    else:
        return None
    if cpu_engine and not reasons:
        reasons = cpu_engine_reasons(backend.name)
    if not reasons:
        return None
    return (
        f"--attention-backend {backend.name} cannot serve {asked.model} "
        f"({asked.describe()}): {'; '.join(reasons)}. {WHAT_TO_DO}"
    )


def cpu_engine_reasons(backend_name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Why a vLLM CPU engine would not run `backend_name` (empty: it would): our backends run
    there, their Triton kernels interpreted, only where `BWX_CPU_BACKENDS` routes them."""
    env = os.environ if env is None else env
    target = next(t for t, b in CPU_OVERRIDE_TARGETS.items() if b.name == backend_name)
    if target not in parse_cpu_override(env.get(CPU_OVERRIDE_ENV)):
        return [
            f"a CPU engine runs {backend_name} only with {CPU_OVERRIDE_ENV}={target} and "
            "TRITON_INTERPRET=1 (its Triton kernels interpreted: tests and demos); without them "
            "vLLM's CPU platform would serve its own attention instead"
        ]
    if not parse_flag("TRITON_INTERPRET", env.get("TRITON_INTERPRET"), False):
        return [
            f"{CPU_OVERRIDE_ENV}={env.get(CPU_OVERRIDE_ENV)} without TRITON_INTERPRET=1: "
            f"{backend_name}'s Triton kernels have no CPU driver, only Triton's interpreter"
        ]
    return []


def _bwx_attn_reasons(asked: AskedAttention, capability: Any) -> list[str]:
    from vllm_blackwell_ext.attention.bwx_attn import BwxAttentionBackend, unsupported_reasons

    if asked.use_mla:
        return [WITH_LATENT_ATTENTION]
    reasons = unsupported_reasons(asked.head_size, asked.kv_cache_dtype, "decoder")
    return reasons + _common_reasons(BwxAttentionBackend, asked, capability)


def _bwx_mla_reasons(asked: AskedAttention, capability: Any) -> list[str]:
    from vllm_blackwell_ext.attention.bwx_mla import (
        NOT_LATENT_ATTENTION,
        BwxMLABackend,
        latent_reasons,
    )

    if not asked.use_mla:
        return [NOT_LATENT_ATTENTION]
    assert asked.latent is not None
    reasons = latent_reasons(*asked.latent, asked.kv_cache_dtype)
    return reasons + _common_reasons(BwxMLABackend, asked, capability)


def _common_reasons(backend: Any, asked: AskedAttention, capability: Any) -> list[str]:
    """The model dtype, and the device where there is one (vLLM's capability checks)."""
    reasons = []
    if asked.dtype not in backend.supported_dtypes:
        takes = [str(d).removeprefix("torch.") for d in backend.supported_dtypes]
        reasons.append(f"dtype not supported ({backend.get_name()} takes {takes})")
    if capability is None:
        return reasons
    if not backend.supports_compute_capability(capability):
        floor = ".".join(map(str, MIN_CAPABILITY))
        reasons.append(
            f"compute capability {capability.as_version_str()} not supported "
            f"({backend.get_name()} needs {floor} or newer)"
        )
        return reasons
    combination = backend.supports_combination(
        asked.head_size, asked.dtype, asked.kv_cache_dtype, None, asked.use_mla, False, False,
        False, capability,
    )  # fmt: skip
    if combination is not None:
        reasons.append(combination)
    return reasons
