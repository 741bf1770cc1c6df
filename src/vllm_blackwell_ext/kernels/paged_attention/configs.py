"""Launch configurations of the paged-attention kernel: tile sizes chosen per device from its
limits and the tuned values of its class (`tuned.py`).

One rule makes every tile-size decision, so a config for a device we do not have (sm120:
101,376 B of shared memory per block) can be compiled and checked on the one we do
(`benchmarks/attn_offline_check.py`). Only `plan.plan_paged_attention` calls it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vllm_blackwell_ext.kernels.device import DeviceInfo
from vllm_blackwell_ext.kernels.host_ints import next_power_of_2
from vllm_blackwell_ext.kernels.launch_cache import triton_version
from vllm_blackwell_ext.kernels.paged_attention.tuned import AttnTuning, tuning_for

# Query lengths up to this take the decode-shaped config and may be split along the KV axis:
# decode (1), spec-verify and DFlash draft blocks (up to 16).
SPLIT_KV_MAX_QUERY_LEN = 16
# Triton 3.6's bundled ptxas crashes compiling TMA prefill tiles; 3.7.1 (vLLM 0.32's) compiles
# them without spills.
PREFILL_TMA_MIN_TRITON = (3, 7)


@dataclass(frozen=True)
class AttnConfig:
    """Tile sizes and launch knobs of one `_paged_attn_kernel` specialisation."""

    block_m: int  # query rows per program: BLOCK_Q tokens x GQA heads of one KV head
    block_q: int  # query tokens per program
    tile_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int
    # fp8 caches: convert tiles to fp16 for the dots (one native cvt per pair of values)
    # instead of to the query dtype (bf16: several instructions per value).
    fp8_dot_fp16: bool = True
    # Tiles every query row sees whole run in their own loop without masks (between the
    # masked window-start and diagonal tiles).
    unmasked_interior: bool = False
    # Read each tile's block-table entries one iteration ahead of its K/V loads.
    prefetch_pages: bool = False
    # fp8 caches with fp16 dots: value tiles read as 16-bit pairs of columns (`fp8_pairs`).
    fp8_value_pairs: bool = False
    # Split launches of up to this many splits merge in the kernel (the last split of each
    # query block and KV head to finish); more splits launch the merge kernel.
    merge_in_kernel_max_splits: int = 0
    # Registers per thread the compiler may use (Triton's maxnreg); 0: its own choice.
    max_registers: int = 0
    # Each K/V tile is one TMA copy of TILE_N slots of one page (pages a multiple of TILE_N).
    tma_tiles: bool = False
    # With TMA tiles: > 0 reads the page ids of this many pages (a power of two) in one vector
    # load ahead of an inner loop over their tiles, instead of one block-table read in each
    # tile's iteration (0): that keeps Triton's pipeliner a K/V stage deeper.
    tma_page_batch: int = 0

    def smem_estimate(self, head_k_pad: int, head_v_pad: int, kv_elem: int, q_elem: int) -> int:
        """Bytes of shared memory the pipelined loop needs (what Triton allocates, roughly).

        K and V tiles for each stage, plus Q and the converted tiles when the cache is fp8
        (they are staged again in the query dtype for the tensor-core dot).
        """
        kv = self.num_stages * self.tile_n * (head_k_pad + head_v_pad) * kv_elem
        q = self.block_m * head_k_pad * q_elem
        convert = self.tile_n * (head_k_pad + head_v_pad) * q_elem if kv_elem == 1 else 0
        p = self.block_m * self.tile_n * q_elem
        return kv + q + convert + p


@dataclass(frozen=True)
class _Tiles:
    """The tile shape `select_config` starts from, before the per-path choices."""

    block_m: int
    block_q: int
    tile_n: int
    num_warps: int


def _tiles(
    info: DeviceInfo, tuning: AttnTuning, head_max: int, gqa: int, max_seqlen_q: int,
    kv_elem: int, split_kv: bool,
) -> _Tiles:  # fmt: skip
    gqa_pad = next_power_of_2(gqa)
    four_warp_wide = tuning.wide_tiles_in_four_warps
    if max_seqlen_q <= SPLIT_KV_MAX_QUERY_LEN:
        # Decode/verify: one program holds every query token of the request for one KV head,
        # so each K/V byte is read once per KV head whatever the query length.
        block_m = max(16, next_power_of_2(max_seqlen_q * gqa))
        block_m = min(block_m, max(128 if head_max <= 128 else 64, gqa_pad))
    else:
        # Prefill: large query tiles for tensor-core efficiency; smaller for wide heads to
        # keep the fp32 accumulator in registers, smaller again for wide heads over an fp8
        # cache where 64 rows spill.
        block_m = 128 if head_max <= 128 else 32 if kv_elem == 1 and not four_warp_wide else 64
        block_m = max(block_m, gqa_pad)
    # Same bytes per step whatever the cache dtype: fp8 tiles cover twice the keys.
    tile_n = 64 if head_max <= 128 else 32
    if split_kv and block_m == 16 and kv_elem == 2 and head_max <= 128:
        tile_n = 32  # split single-token decode of a 2-byte cache: measured faster
    # Per-warp MMA keeps 64+ rows of fp8 tiles at the 2-byte width: 128 converted keys spill.
    if kv_elem == 1 and not (info.warp_mma_only and block_m >= 64):
        tile_n *= 2
    num_warps = 8 if block_m * head_max >= 128 * 128 or block_m >= 128 else 4
    # Where wide tiles do not fit 4 warps' registers (`AttnTuning.wide_tiles_in_four_warps`).
    if not four_warp_wide and (
        block_m >= 64 or (kv_elem == 1 and block_m == 32 and head_max >= 128)
    ):
        num_warps = 8
    return _Tiles(block_m, max(1, block_m // gqa), tile_n, num_warps)


@functools.lru_cache(maxsize=1024)
def select_config(
    info: DeviceInfo,
    *,
    head_k_pad: int,
    head_v_pad: int,
    gqa: int,
    max_seqlen_q: int,
    kv_elem: int,
    q_elem: int = 2,
    split_kv: bool = False,
    tma_page_size: int | None = None,
) -> AttnConfig:
    """Pick the kernel config for a launch; depends only on host-side ints (capture-safe).

    `split_kv`: the launch splits the KV range. `tma_page_size`: the cache's page size where
    TMA can read its tiles (`layout.tma_page_size`), else None.
    """
    tuning = tuning_for(info.device_class)
    head_max = max(head_k_pad, head_v_pad)
    t = _tiles(info, tuning, head_max, gqa, max_seqlen_q, kv_elem, split_kv)
    prefill = max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN
    # The fp8 decode rules key on the 16-row tile, as the kernel variant does.
    fp8_16_rows = kv_elem == 1 and t.block_m == 16 and not prefill
    # Interior tiles without masks: faster for prefill and fp8 single-token decode, slower
    # for bf16 decode and short verify splits, which keep one masked loop.
    unmasked = prefill or fp8_16_rows
    big_smem = head_max <= 128 and info.smem_per_block >= tuning.double_buffer_min_smem
    # Block-table reads one tile ahead: faster for prefill, slower for decode and verify.
    prefetch = prefill
    # Value pairs for 16-row tiles only: wider tiles already read fp8 without byte loads.
    pairs = t.block_m == 16
    in_kernel = tuning.merge_in_kernel_max_splits if t.block_m == 16 else 0
    base = AttnConfig(
        t.block_m, t.block_q, t.tile_n, t.num_warps, 3, True, unmasked, prefetch, pairs
    )
    if big_smem and prefill and kv_elem == 2:
        wide = AttnConfig(
            t.block_m, t.block_q, tuning.prefill_wide_tile_n, t.num_warps,
            tuning.prefill_wide_stages, True, unmasked, prefetch, pairs,
        )  # fmt: skip
        if _takes_tma_tiles(tuning, tma_page_size):
            return AttnConfig(
                t.block_m, t.block_q, tuning.prefill_wide_tile_n, t.num_warps,
                tuning.prefill_tma_stages, True, unmasked, False, pairs, tma_tiles=True,
                tma_page_batch=tuning.prefill_tma_page_batch,
            )  # fmt: skip
        return wide
    if big_smem and not prefill and (fp8_16_rows or (kv_elem == 2 and split_kv)):
        return AttnConfig(
            t.block_m, t.block_q, t.tile_n, t.num_warps, tuning.double_buffer_stages, True,
            unmasked, prefetch, pairs, in_kernel,
            tuning.fp8_decode_max_registers if fp8_16_rows else 0,
        )  # fmt: skip
    return _fitting_stages(info, base, in_kernel, head_k_pad, head_v_pad, kv_elem, q_elem)


def _takes_tma_tiles(tuning: AttnTuning, tma_page_size: int | None) -> bool:
    """Whether a prefill of a 2-byte cache on a big-smem device reads its tiles by TMA."""
    return bool(
        tuning.prefill_tma
        and triton_version() >= PREFILL_TMA_MIN_TRITON
        and tma_page_size
        and tma_page_size % tuning.prefill_wide_tile_n == 0
    )


def _fitting_stages(
    info: DeviceInfo, base: AttnConfig, in_kernel: int, head_k_pad: int, head_v_pad: int,
    kv_elem: int, q_elem: int,
) -> AttnConfig:  # fmt: skip
    """`base` with the deepest pipeline (2-3 stages) and widest tile that fit shared memory,
    shrinking the tile before falling back to a single, unpipelined stage."""
    limit = int(info.smem_per_block * 0.9)  # margin for Triton's own layout scratch
    candidates = [
        (stages, base.tile_n >> k) for k in range(4) for stages in (3, 2) if base.tile_n >> k >= 16
    ]
    candidates.append((1, 16))
    for stages, tile in candidates:
        cfg = AttnConfig(
            base.block_m, base.block_q, tile, base.num_warps, stages, True,
            base.unmasked_interior, base.prefetch_pages, base.fp8_value_pairs, in_kernel,
        )  # fmt: skip
        if cfg.smem_estimate(head_k_pad, head_v_pad, kv_elem, q_elem) <= limit:
            return cfg
    return cfg


def preferred_block_size(device_class: str | None, default_block_size: int) -> int:
    """The page size BWX_ATTN asks vLLM for on a device class (None: not a CUDA GPU) when the
    user gives none: whole TMA prefill tiles where those are taken, else vLLM's default."""
    if device_class is None:
        return default_block_size
    tuning = tuning_for(device_class)
    if tuning.prefill_tma:
        return max(default_block_size, tuning.prefill_wide_tile_n)
    return default_block_size
