"""The gather's launch plan: made once from host values, carried to every launch.

`plan_kv_gather` reads only host facts (the cache's kv_cache_dtype and storage dtype, its entry
width, whether seq_starts come, the device) and returns a frozen `GatherPlan`: the config (from
`configs.py`, or the caller's `config=` when tuning or benchmarking), the entry's column pieces,
the kernel's constexprs and the views the launch takes of the tensors. Plans are cached per
argument set, so planning on every call costs a dictionary lookup.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from ...kv_cache_dtypes import FP8_KV_CACHE_DTYPES
from ..device import DeviceInfo
from ..host_ints import cdiv, next_power_of_2
from ..launch_cache import DEFAULT_NUM_STAGES
from .configs import GatherConfig, gather_config


@dataclass(frozen=True)
class GatherPlan:
    """Everything a gather launch needs besides the tensors and the row/sequence counts.

    `entry` columns are read as `main` columns in `piece`-wide chunks, then a masked `tail`
    tile. `src_view`/`dst_view`: dtypes the launch views `src_cache`/`dst` as (None: as they
    come): an fp8 cache's bytes as the fp8 type its kv_cache_dtype names, or the raw copy of a
    1-byte float cache as bytes. `constexprs` holds the kernel's constexpr arguments by name.
    """

    config: GatherConfig
    entry: int
    piece: int
    main: int
    tail: int
    has_token_to_seq: bool
    has_seq_starts: bool
    dequant: bool
    src_view: torch.dtype | None = None
    dst_view: torch.dtype | None = None
    num_stages: int = DEFAULT_NUM_STAGES
    # Read-only by convention: a plain dict, since launches unpack it on every call.
    constexprs: dict[str, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        constexprs = {
            "E": self.entry,
            "PIECE": self.piece,
            "E_MAIN": self.main,
            "TAIL": self.tail,
            "BLOCK_T": self.config.block_t,
            "HAS_TOKEN_TO_SEQ": self.has_token_to_seq,
            "HAS_SEQ_STARTS": self.has_seq_starts,
            "DEQUANT": self.dequant,
            "EVICT": "evict_first" if self.config.evict_first else "",
        }
        object.__setattr__(self, "constexprs", constexprs)

    @property
    def num_warps(self) -> int:
        return self.config.num_warps

    def grid(self, num_rows: int) -> tuple[int, int, int]:
        """One program per `block_t` rows."""
        return (cdiv(num_rows, self.config.block_t), 1, 1)


def entry_width(t: torch.Tensor, first_entry_dim: int = 2) -> int:
    """Elements of one entry: the product of `t`'s dims from `first_entry_dim` on."""
    width = 1
    for s in t.shape[first_entry_dim:]:
        width *= s
    return width


def entry_pieces(entry: int, max_piece: int) -> tuple[int, int, int]:
    """(piece, main, tail): `main` columns in `piece`-wide chunks, then a masked `tail` tile."""
    piece = min(1 << (entry.bit_length() - 1), max_piece)
    main = entry // piece * piece
    rest = entry - main
    tail = next_power_of_2(rest) if rest else 0
    return piece, main, tail


def _views(
    kv_cache_dtype: str | None, cache_dtype: torch.dtype
) -> tuple[torch.dtype | None, torch.dtype | None]:
    if kv_cache_dtype is None:
        if cache_dtype.is_floating_point and cache_dtype.itemsize == 1:
            # fp8 bytes are copied as bytes: no conversion may touch them (NaN patterns too).
            return torch.uint8, torch.uint8
        return None, None
    # uint8 storage (or any 1-byte view) -> the fp8 type kv_cache_dtype names; free.
    return FP8_KV_CACHE_DTYPES.get(kv_cache_dtype), None


@functools.lru_cache(maxsize=512)
def plan_kv_gather(
    kv_cache_dtype: str | None,
    cache_dtype: torch.dtype,
    entry: int,
    has_seq_starts: bool,
    device: DeviceInfo,
    *,
    config: GatherConfig | None = None,
) -> GatherPlan:
    """The plan of a gather over a cache of `cache_dtype` with `entry`-wide tokens.

    `kv_cache_dtype`: vLLM's name of what the cache holds ("auto", "bfloat16", "float16",
    "fp8", "fp8_e4m3", "fp8_e5m2": `gather_and_maybe_dequant_cache`, rows mapped by
    token_to_seq, fp8 dequantized), or None for `cp_gather_cache` (a raw copy, rows mapped to
    sequences by bisection of cu_seq_lens). `device`: `device_info(src_cache.device)`.
    `config` overrides the device's table entry (tuning, benchmarks). Values are not checked
    here: `checks.py` validates a call's tensors.
    """
    cfg = config if config is not None else gather_config(device.device_class)
    piece, main, tail = entry_pieces(entry, cfg.max_piece)
    src_view, dst_view = _views(kv_cache_dtype, cache_dtype)
    return GatherPlan(
        config=cfg,
        entry=entry,
        piece=piece,
        main=main,
        tail=tail,
        has_token_to_seq=kv_cache_dtype is not None,
        has_seq_starts=has_seq_starts,
        dequant=kv_cache_dtype in FP8_KV_CACHE_DTYPES,
        src_view=src_view,
        dst_view=dst_view,
    )
