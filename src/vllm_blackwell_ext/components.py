"""The table of what this package offers vLLM, by qualified name (nothing imported here).

`register()` and `vllm-bwx doctor` both read this table; a component whose module is not
part of the installed package is skipped, so the table can list what later releases add.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendEntry:
    name: str
    class_path: str
    # vLLM CPU members this backend replaces under the BWX_CPU_BACKENDS opt-in.
    cpu_members: tuple[str, ...]
    summary: str


BWX_ATTN = BackendEntry(
    name="BWX_ATTN",
    class_path="vllm_blackwell_ext.attention.bwx_attn.BwxAttentionBackend",
    cpu_members=("CPU_ATTN",),
    summary="paged GQA/MHA attention (causal/non-causal, window, sinks, fp8 KV, split-KV)",
)
BWX_MLA = BackendEntry(
    name="BWX_MLA",
    class_path="vllm_blackwell_ext.attention.bwx_mla.BwxMLABackend",
    # vLLM picks AMX_MLA instead of CPU_MLA on x86 CPUs with AMX tiles.
    cpu_members=("CPU_MLA", "AMX_MLA"),
    summary="multi-head latent attention (split-KV decode, fp8 KV, DCP context gather)",
)
BACKENDS: tuple[BackendEntry, ...] = (BWX_ATTN, BWX_MLA)
CPU_OVERRIDE_TARGETS: dict[str, BackendEntry] = {"attn": BWX_ATTN, "mla": BWX_MLA}

# Draft models: `dflash/registration.py` (imports no vLLM) says which architecture names map
# to our DFlash draft; register() hands them to vLLM's ModelRegistry.
DFLASH_REGISTRATION_MODULE = "vllm_blackwell_ext.dflash.registration"
DFLASH_MODEL_MODULE = "vllm_blackwell_ext.dflash.model"
# vLLM 0.34+: the draft also answers to its own speculative method name.
DFLASH_METHOD = "bwx_dflash"
DFLASH_METHOD_CONFIG = "vllm_blackwell_ext.dflash.speculator_config.BwxDFlashSpeculatorConfig"

# torch.library ops, registered when `vllm_blackwell_ext.ops` is imported.
OPS_MODULE = "vllm_blackwell_ext.ops"
OPS: tuple[str, ...] = ("gather_and_maybe_dequant_cache", "cp_gather_cache")


def module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def available_backends() -> list[BackendEntry]:
    return [b for b in BACKENDS if module_exists(b.class_path.rsplit(".", 1)[0])]


def available_models() -> dict[str, str]:
    """Draft architecture name -> "module:Class" (empty when this build has no DFlash)."""
    if not module_exists(DFLASH_MODEL_MODULE):
        return {}
    from vllm_blackwell_ext.dflash.registration import dflash_architectures

    return dflash_architectures()
