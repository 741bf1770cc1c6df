"""Paged-KV gather with optional fp8 dequantization, in Triton.

The semantics of vLLM's CUDA ops ``gather_and_maybe_dequant_cache`` and ``cp_gather_cache``
(see `kernel`). One call: `checks` (validation, in `vllm_blackwell_ext.ops`) -> `plan_kv_gather`
(a frozen `GatherPlan` from host values and the device's entry of `configs`) ->
`launch_kv_gather(plan, tensors...)`. The two entry points below plan and launch without
validating. ``BWX_DEBUG_BOUNDS=1`` makes every launch check the index values on the host first
(a synchronisation) and raise ``ValueError`` naming the argument; otherwise the kernel skips
rows whose indices point outside the tensors.
"""

from .checks import (
    DEBUG_BOUNDS_ENV,
    DST_DTYPES,
    FP8_STORAGE_DTYPES,
    INTERPRETED,
    KV_CACHE_DTYPES,
    PLAIN_KV_CACHE_DTYPES,
    check_bounds_on_host,
    check_cp_gather,
    check_gather,
    debug_bounds_enabled,
)
from .configs import (
    DEFAULT_GATHER_CONFIG,
    GATHER_CONFIGS,
    GatherConfig,
    format_entry,
    gather_config,
)
from .launch import cp_gather_cache, gather_and_maybe_dequant_cache, launch_kv_gather
from .plan import GatherPlan, entry_pieces, entry_width, plan_kv_gather

__all__ = [
    "DEBUG_BOUNDS_ENV",
    "DEFAULT_GATHER_CONFIG",
    "DST_DTYPES",
    "FP8_STORAGE_DTYPES",
    "GATHER_CONFIGS",
    "INTERPRETED",
    "KV_CACHE_DTYPES",
    "PLAIN_KV_CACHE_DTYPES",
    "GatherConfig",
    "GatherPlan",
    "check_bounds_on_host",
    "check_cp_gather",
    "check_gather",
    "cp_gather_cache",
    "debug_bounds_enabled",
    "entry_pieces",
    "entry_width",
    "format_entry",
    "gather_and_maybe_dequant_cache",
    "gather_config",
    "launch_kv_gather",
    "plan_kv_gather",
]
