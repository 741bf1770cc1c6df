"""Launch configurations of MLA decode as data, per device class.

Keyed by device class (`DeviceInfo.device_class`: 'sm90', 'sm100', 'sm120', ...), then by KV
dtype tag ('bf16' | 'fp8'), then by the row tile (query rows of one request handled by one
program: heads x query tokens, 16 / 32 / 64). `benchmarks/tune_mla_decode.py` sweeps candidates
on the GPU it runs on and prints (or, with --write, rewrites) its device class's block of
`MLA_DECODE_CONFIGS` here; the few-program and TMA tables are kept by hand. Which entry a
launch takes is decided in one place: `plan.plan_mla_decode`.

Shared memory per block: sm86/89/120 have 101,376 B, sm80 166,912 B, sm90/sm100 232,448 B.
Every entry must compile within its class's limit (`tune_mla_decode.py --check CLASS`, run by
the kernel tests): the pipelined KV tiles cost about `num_stages * block_n * 576 * elem_bytes`
bytes, plus the query tile and layout scratch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MlaDecodeConfig:
    """One launch configuration of the split-KV stage."""

    block_m: int  # query rows (heads x tokens of one request) per program: the tl.dot M
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    # Split planner: how many programs one SM runs at once (occupancy), and the fewest keys
    # one split should hold before splitting more stops paying for the merge.
    ctas_per_sm: int = 2
    min_split_keys: int = 128
    # Read each key tile with tensor-memory-access copies (TMA, sm90+): five copies of a
    # page-aligned [block_n, *] tile instead of a per-thread gather, through the 16-bit kernel
    # (an fp8 cache's tiles widened to q's dtype). Only for a contiguous cache whose page size
    # is a multiple of block_n (`MLA_DECODE_TMA_CONFIGS`).
    tma: bool = False
    # Run that TMA tile through the Gluon kernel (`gluon_kernel`: sm90, 64 x 64 tiles of a
    # bf16 or fp8 cache under a bf16 query, latent 512) where the plan's facts allow it
    # (`plan.gluon_supported`); the Triton kernel of the same config otherwise.
    gluon: bool = False
    # fp8 caches read as column pairs (`split_fp8_kernel`, not `tma`): how many of the two
    # tensor-core operands are widened in integer ops (`fp8_pairs`' scaled mode) rather than
    # with the convert instruction: 0 neither, INT_WIDEN_VALUES the P @ V operand (the
    # widening shared between the conversion and integer pipes), INT_WIDEN_BOTH the score
    # operand too (no convert left).
    int_widen: int = 0


INT_WIDEN_VALUES = 1
INT_WIDEN_BOTH = 2

C = MlaDecodeConfig

# Row-tile buckets the tables are keyed by.
ROW_TILES: tuple[int, ...] = (16, 32, 64)

# fmt: off
# Register pressure decides most entries: a tensor-core operand is held whole per warp. The fp8
# kernel's tiles are pipelined five stages deep (Triton spends one on the block-table read, so
# fewer leave the tile a single buffer); 32 keys on 4 warps beat 64 or 128 keys on 8, and two
# 32-row tiles beat one 64-row tile on Hopper (see benchmarks/README.md, routes tried). Every
# entry compiles for its class's own architecture within its shared memory, without spills and
# to a real kernel (`tune_mla_decode.py --check`, run by the kernel tests).
MLA_DECODE_CONFIGS: dict[str, dict[str, dict[int, MlaDecodeConfig]]] = {
    # Hopper: 227 KiB shared memory. Tuned on an H200 (tune_mla_decode.py --write).
    "sm90": {
        "bf16": {
            16: C(16, 64, 4, 3, 2, 128),
            32: C(16, 64, 4, 3, 2, 128),
            64: C(64, 32, 8, 2, 1, 128),
        },
        "fp8": {
            16: C(16, 32, 4, 5, 2, 128),
            32: C(32, 32, 4, 5, 2, 128),
            64: C(32, 32, 4, 5, 2, 128),
        },
    },
    # Datacenter Blackwell: same shared-memory budget as Hopper; untuned, Hopper's choice where
    # it compiles clean for sm100. Not its 64-row tiles: Triton gives 64-row dots sm100's
    # tensor-memory MMA, and the four [64, 128] fp32 accumulator chunks plus the score tile
    # exceed its 512 columns: the kernel compiles to a trap. 32-row tiles (mma.sync) on 64 keys
    # instead, Hopper's fastest 32-row tile. fp8 tiles of 32 rows spill on sm100: two 16-row
    # programs instead.
    "sm100": {
        "bf16": {16: C(16, 64, 4, 3, 2, 128), 32: C(16, 64, 4, 3, 2, 128),
                 64: C(32, 64, 8, 3, 1, 128)},
        "fp8":  {16: C(16, 32, 4, 5, 2, 128), 32: C(16, 32, 4, 5, 2, 128),
                 64: C(16, 32, 4, 5, 2, 128)},
    },
    # Consumer Blackwell (and sm86/sm89): 101,376 B per block. fp8 entries untuned: Hopper's
    # 16-row tile, which fits (its 32-row tile spills on sm120).
    "sm120": {
        "bf16": {16: C(16, 32, 4, 2, 2, 128), 32: C(32, 32, 8, 2, 1, 128),
                 64: C(32, 32, 8, 2, 1, 128)},
        "fp8":  {16: C(16, 32, 4, 5, 2, 128), 32: C(16, 32, 4, 5, 2, 128),
                 64: C(16, 32, 4, 5, 2, 128)},
    },
    # A100: 163 KiB; untuned. fp8 caches need sm89 (`device.MIN_FP8_CAPABILITY`): its fp8 row
    # only keeps the table whole.
    "sm80": {
        "bf16": {16: C(16, 32, 4, 3, 2, 128), 32: C(32, 32, 8, 3, 1, 128),
                 64: C(32, 32, 8, 3, 1, 128)},
        "fp8":  {16: C(16, 32, 4, 5, 2, 128), 32: C(32, 32, 4, 5, 2, 128),
                 64: C(32, 32, 4, 5, 2, 128)},
    },
}
# fmt: on
# Classes that share another's table (same shared-memory budget and MMA kind).
CONFIG_ALIASES: dict[str, str] = {
    "sm86": "sm120",
    "sm89": "sm120",
    "sm103": "sm100",
    "sm121": "sm120",
    # Unknown devices (and the CPU interpreter) take the smallest-memory table.
    "default": "sm120",
}
for _alias, _target in CONFIG_ALIASES.items():
    MLA_DECODE_CONFIGS[_alias] = MLA_DECODE_CONFIGS[_target]


# Launches whose unsplit grid (requests x row tiles) holds at most this many programs take a
# class's few-program entry where it has one: there the split planner, not the batch, fills the
# GPU, and the large-batch entry's plan of two programs per SM doubles the splits and the merge.
# From a few dozen requests on the large-batch entry wins again (see benchmarks/README.md,
# routes tried).
FEW_PROGRAMS = 8
# fmt: off
MLA_DECODE_FEW_PROGRAM_CONFIGS: dict[str, dict[str, dict[int, MlaDecodeConfig]]] = {
    "sm90": {"fp8": {16: C(16, 64, 8, 5, 1, 128)}},
    "sm100": {"fp8": {16: C(16, 64, 8, 5, 1, 128)}},
}
# fmt: on
MLA_DECODE_FEW_PROGRAM_CONFIGS["sm103"] = MLA_DECODE_FEW_PROGRAM_CONFIGS["sm100"]

# The page size BWX_MLA asks vLLM for: a multiple of every TMA entry's key tile (FlashMLA's
# page size too). Any multiple of 16 still works, through the gathered entries.
PREFERRED_BLOCK_SIZE = 64

# Entries that replace a class's entry when the cache allows TMA tiles (`tma=True`). A
# gathered 64-key tile of 64 rows spills; through TMA it does not (no per-thread addresses),
# and the wider tile halves the tiles per key. An fp8 cache's tiles are widened to bf16 in the
# 16-bit kernel (exact for e4m3). Split plans take these entries too: the metadata builder
# knows vLLM's page size (`plan_mla_decode`'s `tma_page_size`). Both entries run through the
# Gluon kernel, which computes each score tile once rather than in both warp groups (see
# benchmarks/README.md, routes tried).
# fmt: off
MLA_DECODE_TMA_CONFIGS: dict[str, dict[str, dict[int, MlaDecodeConfig]]] = {
    "sm90": {
        "bf16": {64: C(64, 64, 8, 2, 1, 128, tma=True, gluon=True)},
        "fp8": {64: C(64, 64, 8, 2, 1, 128, tma=True, gluon=True)},
    },
}
# fmt: on
