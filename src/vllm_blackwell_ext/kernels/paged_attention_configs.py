"""Launch configurations of the paged-attention kernel, chosen per device from its limits.

One place holds every tile-size decision so the adapter, the tests and the benchmark see the
same choice, and so a config for a device we do not have (sm120: 101,376 B of shared memory
per block) can be compiled and checked on the one we do (the H200's GPU test does exactly that).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .device import DeviceInfo
from .host_ints import next_power_of_2
from .launch_cache import triton_version

# Query lengths up to this take the decode-shaped config and may be split along the KV axis:
# decode (1), spec-verify and DFlash draft blocks (up to 16).
SPLIT_KV_MAX_QUERY_LEN = 16
# A split below this many keys costs more in launch and merge than it buys in parallelism.
MIN_KEYS_PER_SPLIT = 256
# Upper bound on splits; 64 splits x 8 KV heads already gives 4 programs per SM on 132 SMs.
MAX_SPLITS = 64
# Programs per SM a split launch aims at: two waves of the ~2 decode programs (~200 registers
# x 128 threads each) that fit on an SM at once; enough bytes in flight to saturate HBM.
TARGET_PROGRAMS_PER_SM = 4
# Query blocks of 8+ tokens (spec-verify, DFlash drafts) write and merge 8-16x more partial
# rows per split, and their 64-row tiles leave one program per SM: one wave is enough. H200,
# one request, 33 instead of 64 splits: q=16 128k 192 -> 186 us, q=8 128k 200 -> 196 us, a
# window-2048 draft layer 23.4 -> 20.6 us; q=4 kept 4 (64 splits 54.5 us, 32 splits 64.9 us).
BLOCK_QUERY_LEN = 8
TARGET_PROGRAMS_PER_SM_BLOCK = 2
# Launches with at least this many (request, KV head) programs per SM are not split (but for
# fp8 single-token decode, below).
MIN_PROGRAMS_PER_SM = 2
# Single-token decode of an fp8 cache: its programs (value tiles read as 16-bit pairs, ~160
# registers x 128 threads, 73 KB of shared memory on sm90) fit three per SM. Its splits make
# the grid use FP8_MIN_WAVE_FILL of the program slots of its waves, whatever the batch: a grid
# of 1.3 waves idles most of its second. H200, Qwen3-8B shapes, GB/s, against the plan of two
# programs per SM that never split grids of two or more per SM
# (`benchmarks/experiments/attn_fp8_split_plan.py`, `h200-attn-fp8-split-plan.txt`): B=8 32k
# 4 -> 6 splits 2955 -> 3592, B=32 32k 1 -> 3 splits 3253 -> 4163, B=64 32k 1 -> 2 splits
# 3259 -> 4200; B=128 16k (2.6 waves: 0.86) and B=256 8k stay unsplit.
FP8_PROGRAMS_PER_SM = 3
FP8_MIN_WAVE_FILL = 0.85
# Registers per thread under which those 4-warp programs fit three per SM (65,536 registers,
# allocated in steps of 8). Triton 3.6 compiles the variant that merges its splits in the
# kernel to ~200 without a cap (the same loop, 157 in the variant without the merge); capped,
# it keeps 168 with no spills (offline sm90 compile: `cuobjdump -res-usage`, no LDL/STL).
# H200, that variant uncapped -> capped (`h200-attn-merge-in-kernel.txt`): B=8 32k 198.8 ->
# 153.9 us, B=64 32k 1116.8 -> 1062.0 us; the variant beside the merge kernel is level.
FP8_DECODE_MAX_REGISTERS = 65_536 // (FP8_PROGRAMS_PER_SM * 128) // 8 * 8
# Split launches on 16-row tiles (single-token decode at GQA <= 16, verify blocks that fit) of up to
# this many splits merge in the kernel: the last split of each (request, KV head) to finish merges
# them all, which saves the merge kernel's launch, a third to a half of an eager call's host time.
# GPU time is level within the runs' spread: one program merges its splits serially, after the
# others. H200, Qwen3-8B shapes, merge kernel -> in kernel, over runs
# (`benchmarks/experiments/attn_merge_in_kernel.py`, `h200-attn-merge-in-kernel.txt`): fp8 B=64 32k
# (2 splits) 1039-1087 -> 1062-1071 us, host 32-50 -> 22-33 us; fp8 B=8 32k (6) 151.6-152.8 ->
# 152.5-153.9 us, host 35-70 -> 22-32; bf16 B=8 32k (8) 266.7-270.8 -> 267.9-273.2 us, host 50-59 ->
# 25-33. Many splits or wider tiles merge slower in one program: bf16 B=1 32k (64 splits) 52.8 ->
# 67.9 us, verify q=16 B=8 32k (4 splits of 64-row tiles) 299.0 -> 303.9 us.
MERGE_IN_KERNEL_MAX_SPLITS = 8
# Five pipeline stages double-buffer a decode launch's K/V tiles: Triton pipelines them one
# indirection (the block-table load) behind the loop, so 3 or 4 stages give them one buffer
# (Triton 3.6). Taken by fp8 single-token decode and by split launches over 2-byte caches,
# head <= 128, on devices whose blocks hold this much shared memory (sm90, sm100; the largest
# such config compiled to 115,200 B). H200, Qwen3-8B shapes, 3 -> 5 stages
# (`benchmarks/experiments/attn_fp8_decode_configs.py`, `pipeline_stages.py`): fp8 B=8 32k
# 242.8 -> 220.9 us, fp8 B=64 32k 1688 -> 1650 us, fp8 B=1 128k 133.5 -> 123.8 us; bf16 split
# B=8 32k 286.4 -> 266.5 us, B=1 128k 153.9 -> 145.5 us; verify q=16 B=8 32k 360.8 -> 297.1
# us. Unsplit bf16 B=64 kept 3 stages (1939.8 vs 1953.4 us).
DOUBLE_BUFFER_STAGES = 5
DOUBLE_BUFFER_MIN_SMEM = 200_000
# Prefill of a 2-byte cache, head <= 128, on those same devices: 128 x 128 tiles at 2 stages
# (163,840 B compiled), interior tiles unmasked. H200, Qwen3-8B shapes, TFLOP/s, against
# 128 x 64 tiles at 3 stages with every tile masked: causal 8k 280.5 -> 314.9, 4 x 4k
# 246.1 -> 300.6, a 2k chunk after 14k 263.9 -> 307.1
# (`benchmarks/experiments/attn_prefill_configs.py`, `h200-attn-prefill-configs.txt`).
PREFILL_WIDE_TILE_N = 128
PREFILL_WIDE_STAGES = 2
# Hopper, where a page holds whole 128-key tiles: each K/V tile is one TMA copy from the cache
# instead of a cp.async gather, three tiles in flight. H100, Qwen3-8B shapes, TFLOP/s, pages of
# 128, against the gathered 128 x 128 tiles at 2 stages on pages of 16 (and of 128)
# (`benchmarks/experiments/attn_chunk_prefill_tma.py`, `h100-attn-chunk-prefill-tma.txt`): a 2k
# chunk after 14k 370.8 (383.5) -> 450.8, 8k after 24k 400.1 (412.8) -> 490.9, 4 x 512 after
# 7.5k 354.3 (367.7) -> 436.2. Pages of 64 with 64-key tiles did not gain (362.5), nor did
# reading the block table one tile ahead (383.3 for the 2k chunk).
PREFILL_TMA_STAGES = 3
# Those tiles read the page ids of 64 pages in one vector load ahead of an inner loop over
# their tiles (`AttnConfig.tma_page_batch`). H200, vLLM 0.32's environment (Triton 3.7.1),
# TFLOP/s, page ids read per tile -> 16 -> 64 at a time (`attn_chunk_prefill_tma.py`,
# `h200-attn-chunk-prefill-tma.txt`): 2k chunk after 14k 432.1 -> 496.3 -> 514.5, 8k after 24k
# 467.9 -> 495.7 -> 500.1, 4 x 512 after 7.5k 409.8 -> 490.1 -> 498.4.
PREFILL_TMA_PAGE_BATCH = 64
PREFILL_TMA_CLASSES: tuple[str, ...] = ("sm90",)
# Triton 3.6's bundled ptxas crashes compiling these tiles (error -11, H100, 128-key tiles of
# head 64 and 128); 3.7.1 (vLLM 0.32's) compiles them without spills.
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
    # tile's iteration (0). Offline (sm90, Triton 3.7.1, head 128) that keeps three K/V stages
    # in shared memory where the per-tile read keeps two (230,400 vs 164,864 B; 209-214 vs 255
    # registers: `offline-attn-tma-page-batch.txt`); the Hopper prefill entry takes 64
    # (PREFILL_TMA_PAGE_BATCH, timed there).
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

    `split_kv`: the launch splits the KV range (`plan_split_kv` > 1). `tma_page_size`: the
    cache's page size where TMA can read its tiles (`paged_attention`'s `_tma_page_size`), else
    None.
    """
    head_max = max(head_k_pad, head_v_pad)
    gqa_pad = next_power_of_2(gqa)
    # Hopper's choices below were measured on H200/H100s. Elsewhere some of them spill registers
    # inside the loop, found by compiling each class's configs for its own architecture
    # (`benchmarks/attn_offline_check.py`, Triton 3.7.1) and changed there, unmeasured.
    hopper = info.device_class == "sm90"
    if max_seqlen_q <= SPLIT_KV_MAX_QUERY_LEN:
        # Decode/verify: one program holds every query token of the request for one KV head,
        # so each K/V byte is read once per KV head whatever the query length.
        block_m = max(16, next_power_of_2(max_seqlen_q * gqa))
        block_m = min(block_m, max(128 if head_max <= 128 else 64, gqa_pad))
    else:
        # Prefill: large query tiles for tensor-core efficiency; smaller for wide heads to
        # keep the fp32 accumulator in registers, and off Hopper smaller again for wide heads
        # over an fp8 cache (64 rows spill there; 32: 190 registers).
        block_m = 128 if head_max <= 128 else 32 if kv_elem == 1 and not hopper else 64
        block_m = max(block_m, gqa_pad)
    block_q = max(1, block_m // gqa)
    # Same bytes per step whatever the cache dtype: fp8 tiles cover twice the keys.
    tile_n = 64 if head_max <= 128 else 32
    if split_kv and block_m == 16 and kv_elem == 2 and head_max <= 128:
        # Split single-token decode of a 2-byte cache: 32-key tiles. H200, 32 q / 8 KV heads,
        # head 128 (`benchmarks/experiments/attn_decode_tiles.py`): B=1 32k 61.9 -> 53.0 us,
        # B=1 128k 192 -> 155 us, B=8 32k 345 -> 285 us. Unsplit launches (B=64: 1941 vs
        # 2039 us) and fp8 caches (128 keys: 2217 vs 1732 GB/s at B=8) keep the wider tile.
        tile_n = 32
    # Per-warp MMA keeps 64+ rows of fp8 tiles at the 2-byte width: 128 converted keys spill
    # there (sm120, head 64 with sinks: 24 B of stack in the loop; 64 keys: 154 registers).
    if kv_elem == 1 and not (info.warp_mma_only and block_m >= 64):
        tile_n *= 2
    prefill = max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN
    num_warps = 8 if block_m * head_max >= 128 * 128 or block_m >= 128 else 4
    # Off Hopper, 8 warps where 4 spill inside the loop: 64-row tiles (16-token verify blocks at
    # GQA 4 on sm80-sm120: 255 registers and 16-104 B of stack, 8 warps: 146-188 registers;
    # sm100, head 64 with sinks: 8 B, 8 warps: 118 registers) and 32-row tiles of an fp8 cache
    # over 128-256-wide heads (sm100: 40-112 B; 8 warps: 176-202 registers). Hopper's 64-row
    # fp8 query blocks also spill (32 B in DFlash draft layers with a window), but 8 warps or
    # 64-key tiles ran verify q=16 B=8 x 32k 1.75x / 1.08x slower on an H100
    # (`attn_kernel_ab.py`, `h100-attn-fp8-verify-tiles.txt`).
    if not hopper and (block_m >= 64 or (kv_elem == 1 and block_m == 32 and head_max >= 128)):
        num_warps = 8
    # The fp8 decode rules below key on the 16-row tile, as the kernel variant does: single
    # tokens at GQA <= 16 (where they were measured), and query blocks up to 16 rows (verify of
    # up to 16 / GQA tokens, MHA included), which share that variant.
    fp8_16_rows = kv_elem == 1 and block_m == 16 and not prefill
    # Interior tiles without masks: measured faster for prefill and fp8 single-token decode
    # (H200: fp8 B=8 32k 206.2 -> 191.2 us, B=64 32k 1519 -> 1471 us); slower for bf16
    # decode (B=64 32k 1899 -> 2447 us, the unsplit kernel went from 122 to 160 registers)
    # and short verify splits (q=16 B=1 8k 28.4 -> 31.0 us), which keep one masked loop.
    unmasked = prefill or fp8_16_rows
    big_smem = head_max <= 128 and info.smem_per_block >= DOUBLE_BUFFER_MIN_SMEM
    # Block-table reads one tile ahead: faster for prefill (H200, TFLOP/s: causal 8k 334.7 ->
    # 371.2, 4 x 4k 316.5 -> 349.4, 2k chunk after 14k 328.8 -> 367.8, fp8 8k 305.9 -> 315.8),
    # slower for decode and verify (B=64 32k 1.21x, fp8 B=8 32k 1.41x, q=16 B=1 8k 1.23x the
    # time): `benchmarks/experiments/attn_kernel_ab.py`, `h200-attn-prefetch-ab.txt`.
    prefetch = prefill
    # Value pairs for 16-row tiles only. H200, fp8, time with pairs / without
    # (`benchmarks/experiments/attn_kernel_ab.py`, `h200-attn-fp8-pairs-ab.txt`): decode B=8 32k
    # 0.968, B=64 32k 0.912, B=256 8k 0.676; verify q=16 B=8 32k 1.058, prefill 8k 1.047,
    # whose 64-128-row tiles Triton 3.6 already reads without byte loads (their sm90 SASS has
    # no LDS.U8); and on 128-row tiles with 32 pair columns (head 64) Triton 3.6 computed wrong
    # outputs (`attn_fp8_pairs_wide_tiles.py`, `h200-attn-fp8-pairs-wide-tiles.txt`).
    pairs = block_m == 16
    in_kernel = MERGE_IN_KERNEL_MAX_SPLITS if block_m == 16 else 0
    if (
        big_smem
        and prefill
        and kv_elem == 2
        and info.device_class in PREFILL_TMA_CLASSES
        and triton_version() >= PREFILL_TMA_MIN_TRITON
        and tma_page_size
        and tma_page_size % PREFILL_WIDE_TILE_N == 0
    ):
        return AttnConfig(
            block_m, block_q, PREFILL_WIDE_TILE_N, num_warps, PREFILL_TMA_STAGES, True,
            unmasked, False, pairs, tma_tiles=True, tma_page_batch=PREFILL_TMA_PAGE_BATCH,
        )  # fmt: skip
    if big_smem and prefill and kv_elem == 2:
        return AttnConfig(
            block_m, block_q, PREFILL_WIDE_TILE_N, num_warps, PREFILL_WIDE_STAGES, True, unmasked,
            prefetch, pairs,
        )  # fmt: skip
    # The fp8 decode register cap was measured on Hopper; on sm100 it spills the loop (40-48 B,
    # Triton 3.7.1) where the uncapped kernel takes 162-195 registers.
    if big_smem and not prefill and (fp8_16_rows or (kv_elem == 2 and split_kv)):
        return AttnConfig(
            block_m, block_q, tile_n, num_warps, DOUBLE_BUFFER_STAGES, True, unmasked, prefetch,
            pairs, in_kernel, FP8_DECODE_MAX_REGISTERS if fp8_16_rows and hopper else 0,
        )  # fmt: skip
    limit = int(info.smem_per_block * 0.9)  # margin for Triton's own layout scratch
    # Bytes in flight per program are stages x tile: keep 2-3 stages and shrink the tile
    # before falling back to a single (unpipelined) stage.
    candidates = [(st, tile_n >> k) for k in range(4) for st in (3, 2) if tile_n >> k >= 16]
    candidates.append((1, 16))
    for stages, tile in candidates:
        cfg = AttnConfig(
            block_m, block_q, tile, num_warps, stages, True, unmasked, prefetch, pairs, in_kernel
        )
        if cfg.smem_estimate(head_k_pad, head_v_pad, kv_elem, q_elem) <= limit:
            return cfg
    return cfg


def preferred_block_size(device_class: str | None, default_block_size: int) -> int:
    """The page size BWX_ATTN asks vLLM for on a device class (None: not a CUDA GPU) when the
    user gives none: whole TMA prefill tiles where those are taken, else vLLM's default."""
    if device_class in PREFILL_TMA_CLASSES:
        return max(default_block_size, PREFILL_WIDE_TILE_N)
    return default_block_size


def plan_split_kv(
    num_query_tokens: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_kv_heads: int,
    device_info: DeviceInfo,
    *,
    max_splits: int = MAX_SPLITS,
    kv_elem: int = 2,
) -> int:
    """How many KV segments a launch uses (1 = no split). Pure host arithmetic on ints.

    Split only decode-shaped launches (query length <= 16) whose (request, KV head) grid would
    leave SMs idle. The number of requests is at least ceil(tokens / max_seqlen_q), so the grid
    has at least that many programs per KV head; splits bring it to at most
    TARGET_PROGRAMS_PER_SM per SM (TARGET_PROGRAMS_PER_SM_BLOCK for query blocks of
    BLOCK_QUERY_LEN or more; whole waves), never below MIN_KEYS_PER_SPLIT keys per split.
    Single tokens over a 1-byte cache (`kv_elem`) follow `_fp8_decode_splits`.
    """
    if max_seqlen_q < 1 or max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN or num_query_tokens < 1:
        return 1
    min_requests = -(-num_query_tokens // max_seqlen_q)
    base_programs = min_requests * num_kv_heads
    max_useful = max(1, min(max_seqlen_k // MIN_KEYS_PER_SPLIT, max_splits))
    if kv_elem == 1 and max_seqlen_q == 1:
        return _fp8_decode_splits(base_programs, device_info.num_sms, max_useful)
    if base_programs >= device_info.num_sms * MIN_PROGRAMS_PER_SM:
        return 1  # enough programs already: a split only adds the merge (H200: B=64 lost 10%)
    # Round DOWN to whole waves: with ~2 programs resident per SM, 9 splits x 64 programs
    # (2.2 waves) ran at 2441 GB/s on the H200 where 4 (1 wave) ran at 3029 and 18 at 2981.
    if max_seqlen_q >= BLOCK_QUERY_LEN:
        per_sm = TARGET_PROGRAMS_PER_SM_BLOCK
    else:
        per_sm = TARGET_PROGRAMS_PER_SM
    splits = device_info.num_sms * per_sm // base_programs
    return max(1, min(splits, max_useful))


@functools.lru_cache(maxsize=1024)  # a loop of up to MAX_SPLITS steps, on the launch path
def _fp8_decode_splits(base_programs: int, num_sms: int, max_useful: int) -> int:
    """The fewest splits (up to `max_useful`) whose grid uses at least FP8_MIN_WAVE_FILL of
    the program slots of its waves (FP8_PROGRAMS_PER_SM per SM); `max_useful` if none does."""
    wave = num_sms * FP8_PROGRAMS_PER_SM
    for splits in range(1, max_useful + 1):
        programs = base_programs * splits
        waves = -(-programs // wave)
        if programs >= FP8_MIN_WAVE_FILL * waves * wave:
            return splits
    return max_useful


def split_kv_max_tokens(num_kv_heads: int, device_info: DeviceInfo) -> int:
    """The most query tokens for which `plan_split_kv` can answer more than one split.

    Size `SplitKVWorkspace.max_num_tokens` with this: larger launches never split.
    """
    max_requests = -(-device_info.num_sms * MIN_PROGRAMS_PER_SM // num_kv_heads)
    # fp8 single tokens: a grid past 1 / (1 - FP8_MIN_WAVE_FILL) waves fills them unsplit.
    fp8_waves = math.ceil(1 / (1 - FP8_MIN_WAVE_FILL))
    fp8_requests = -(-fp8_waves * device_info.num_sms * FP8_PROGRAMS_PER_SM // num_kv_heads)
    return max(max_requests * SPLIT_KV_MAX_QUERY_LEN, fp8_requests)


def split_kv_max_rows(num_kv_heads: int, device_info: DeviceInfo) -> int:
    """The most (query token x split) rows `plan_split_kv` can ask for, over all launches.

    Many splits come only with few tokens, so this is far below
    split_kv_max_tokens * MAX_SPLITS: it is what `SplitKVWorkspace.for_device` allocates.
    """
    best = 0
    for tokens in range(1, split_kv_max_tokens(num_kv_heads, device_info) + 1):
        for q_len in range(1, SPLIT_KV_MAX_QUERY_LEN + 1):
            for kv_elem in (1, 2):
                splits = plan_split_kv(
                    tokens, q_len, 1 << 30, num_kv_heads, device_info, kv_elem=kv_elem
                )
                if splits > 1:
                    best = max(best, tokens * splits)
    return best
