"""Which architecture names our DFlash draft answers to in vLLM's ModelRegistry (cheap import).

Installing the plugin must not change what users of upstream's DFlash get, so by default only
our own names are registered:

- `BwxDFlashDraftModel`: what a draft's `config.json` puts in `architectures` to opt in.
- `DFlashBwxDFlashDraftModel`: the same, as vLLM 0.32 sees it. `EAGLEConfig(method="dflash")`
  (vllm/transformers_utils/configs/eagle.py) prefixes "DFlash" to every architecture that
  neither starts nor ends with "DFlash", and the registry is asked for the rewritten name.

`BWX_DFLASH=1` (set for every vLLM process, e.g. exported before `vllm serve`) also routes
upstream's `DFlashDraftModel` to ours. It is the only way for speculators-format drafts, whose
architecture vLLM forces to `DFlashDraftModel` (transformers_utils/configs/speculators/algos.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_blackwell_ext.switches import DFLASH_TAKEOVER

BWX_DFLASH_ARCH = "BwxDFlashDraftModel"
BWX_DFLASH_ARCH_REWRITTEN = "DFlash" + BWX_DFLASH_ARCH
UPSTREAM_DFLASH_ARCHS = ("DFlashDraftModel",)
TAKEOVER_ENV = DFLASH_TAKEOVER.name
DFLASH_QUALNAME = "vllm_blackwell_ext.dflash.model:BwxDFlashDraftModel"

__all__ = [
    "BWX_DFLASH_ARCH",
    "BWX_DFLASH_ARCH_REWRITTEN",
    "TAKEOVER_ENV",
    "dflash_architectures",
    "register_dflash",
    "register_with_vllm",
]


def takeover_enabled(env: Mapping[str, str] | None = None) -> bool:
    return DFLASH_TAKEOVER.enabled(env)


def dflash_architectures(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Architecture name -> "module:Class" that `register_dflash` registers."""
    archs = {BWX_DFLASH_ARCH: DFLASH_QUALNAME, BWX_DFLASH_ARCH_REWRITTEN: DFLASH_QUALNAME}
    if takeover_enabled(env):
        archs |= {a: DFLASH_QUALNAME for a in UPSTREAM_DFLASH_ARCHS}
    return archs


def register_dflash(model_registry: Any, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Register our draft with a vLLM `ModelRegistry` (lazily, by qualified name: the model
    module is imported only when vLLM builds a draft)."""
    archs = dflash_architectures(env)
    for arch, qualname in archs.items():
        model_registry.register_model(arch, qualname)
    return archs


def register_with_vllm() -> dict[str, str]:
    """No-argument form for `register()` or an entry point."""
    from vllm import ModelRegistry

    return register_dflash(ModelRegistry)
