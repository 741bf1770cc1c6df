"""Tuned values of the paged-attention launch rule, per device class: data, not logic.

Each value was chosen by timing the alternatives on the device class it is listed for; the runs,
their commands and their figures are in `benchmarks/README.md` ("Routes tried") and
`benchmarks/results/`. A class without an entry takes `DEFAULT_TUNING`, which holds the values
measured on Hopper minus the choices that only Hopper was measured with. `configs.select_config`
and `plan.plan_split_kv` read these; `benchmarks/attn_offline_check.py` compiles every config the
rule yields per class and checks it against that class's shared-memory limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AttnTuning:
    """The measured knobs of `select_config` and `plan_split_kv` for one device class."""

    # -- split-KV plan (decode-shaped launches) --
    # A split below this many keys costs more in launch and merge than it buys.
    min_keys_per_split: int = 256
    # Programs per SM a split launch aims at (whole waves of the resident programs).
    programs_per_sm: int = 4
    # The same for query blocks of `block_query_len`+ tokens (64-row tiles: one wave).
    programs_per_sm_block: int = 2
    block_query_len: int = 8
    # Launches with this many (request, KV head) programs per SM already are not split.
    unsplit_programs_per_sm: int = 2
    # Single-token fp8 decode: programs resident per SM, and the share of its waves' program
    # slots a grid must fill before more splits stop paying.
    fp8_programs_per_sm: int = 3
    fp8_min_wave_fill: float = 0.85
    # -- tiles --
    # Split launches on 16-row tiles of up to this many splits merge in the kernel.
    merge_in_kernel_max_splits: int = 8
    # Decode tiles double-buffered by this many pipeline stages, on blocks with at least
    # `double_buffer_min_smem` bytes of shared memory.
    double_buffer_stages: int = 5
    double_buffer_min_smem: int = 200_000
    # Prefill of 2-byte caches on those blocks: 128-key tiles, 2 stages.
    prefill_wide_tile_n: int = 128
    prefill_wide_stages: int = 2
    # Prefill K/V tiles read by TMA from pages of whole tiles (three stages, page ids read
    # `prefill_tma_page_batch` pages at a time).
    prefill_tma: bool = False
    prefill_tma_stages: int = 3
    prefill_tma_page_batch: int = 64
    # Register cap of fp8 single-token decode programs (0: the compiler's choice), so that
    # `fp8_programs_per_sm` 4-warp programs fit an SM's 65,536 registers.
    fp8_decode_max_registers: int = 0
    # Warp-group MMA (Hopper) keeps the wide tiles below in registers with 4 warps; elsewhere
    # they spill and take 8 warps (64-row tiles; 32-row tiles of fp8 caches over 128+ heads),
    # and fp8 prefill over wide heads takes 32-row tiles.
    wide_tiles_in_four_warps: bool = False


DEFAULT_TUNING = AttnTuning()
_HOPPER = replace(
    DEFAULT_TUNING,
    prefill_tma=True,
    fp8_decode_max_registers=65_536 // (3 * 128) // 8 * 8,
    wide_tiles_in_four_warps=True,
)
TUNING: dict[str, AttnTuning] = {"sm90": _HOPPER}


def tuning_for(device_class: str) -> AttnTuning:
    """The tuned values of a device class (`DeviceInfo.device_class`)."""
    return TUNING.get(device_class, DEFAULT_TUNING)
