"""The launch plan of paged attention: a frozen value made once per batch, carried to the launch.

`AttnShape` holds what a group of layers shares for the life of its cache (device, dtypes,
heads, page size, whether TMA can read the cache's tiles); `plan_paged_attention` adds one
batch's lengths and returns an `AttnPlan`: the kernel variant, its config, the split count
and the kernel's constexprs. An attention backend's metadata builder makes the plan once per
batch and every layer launches it (`launch.launch_paged_attention`); log lines read it too.
Nothing else derives a config.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from vllm_blackwell_ext.kernels.device import DeviceInfo
from vllm_blackwell_ext.kernels.fp8_pairs import pair_mode
from vllm_blackwell_ext.kernels.host_ints import next_power_of_2
from vllm_blackwell_ext.kernels.paged_attention.configs import (
    SPLIT_KV_MAX_QUERY_LEN,
    AttnConfig,
    select_config,
)
from vllm_blackwell_ext.kernels.paged_attention.layout import tma_readable_heads
from vllm_blackwell_ext.kernels.paged_attention.tuned import tuning_for

if TYPE_CHECKING:
    from vllm_blackwell_ext.kernels.paged_attention.layout import PagedCacheLayout

# Upper bound on splits; a workspace sized with it fits every plan.
MAX_SPLITS = 64
# The kernel variants, by name: K/V tiles gathered through the block table (every device),
# or read whole from pages of whole tiles by TMA (Hopper prefill, `AttnConfig.tma_tiles`).
VARIANT_GATHER = "triton_gather"
VARIANT_TMA = "triton_tma"
VARIANTS: tuple[str, ...] = (VARIANT_GATHER, VARIANT_TMA)


@dataclass(frozen=True)
class AttnShape:
    """What the launches over one cache share: fixed for the cache's life."""

    info: DeviceInfo
    q_dtype: torch.dtype
    kv_dtype: torch.dtype  # as the kernel reads it: fp8, never uint8
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    block_size: int
    # The cache's page size where TMA can read its tiles (`layout.tma_page_size`), else None.
    tma_page_size: int | None

    @classmethod
    def for_cache(
        cls, info: DeviceInfo, *, q_dtype: torch.dtype, kv_dtype: torch.dtype,
        num_q_heads: int, num_kv_heads: int, head_size: int, head_size_v: int,
        block_size: int, tma_readable: bool,
    ) -> AttnShape:  # fmt: skip
        """The shape of a cache laid out as vLLM lays it out; `tma_readable`: whether that
        layout lets TMA read it (vLLM's does for the heads `tma_readable_heads` names)."""
        readable = tma_readable and tma_readable_heads(kv_dtype.itemsize, head_size, head_size_v)
        return cls(
            info, q_dtype, kv_dtype, num_q_heads, num_kv_heads, head_size, head_size_v,
            block_size, block_size if readable else None,
        )  # fmt: skip

    @classmethod
    def of_layout(cls, info: DeviceInfo, q: torch.Tensor, layout: PagedCacheLayout) -> AttnShape:
        """The shape of the launches of `q` over the caches of `layout`."""
        _, block_size, num_kv_heads, head_size = layout.key_cache.shape
        return cls(
            info, q.dtype, layout.key_cache.dtype, q.shape[1], num_kv_heads, head_size,
            layout.value_cache.shape[3], block_size, layout.tma_page_size,
        )  # fmt: skip

    @property
    def gqa(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True)
class AttnPlan:
    """One batch's launch of paged attention: made by `plan_paged_attention`, read by
    `launch_paged_attention`, the log lines and `vllm-bwx doctor`."""

    shape: AttnShape
    variant: str
    config: AttnConfig
    num_splits: int  # 1: no split
    num_tokens: int  # the query tokens the plan was made for
    max_seqlen_q: int
    # The kernel's constexprs that the plan fixes, by name (the launch adds per-layer flags).
    constexprs: MappingProxyType = field(repr=False, compare=False)
    # The caller's overrides, which `unsplit` keeps.
    requested_variant: str | None = field(default=None, repr=False, compare=False)
    requested_config: AttnConfig | None = field(default=None, repr=False, compare=False)

    @property
    def split_kv(self) -> bool:
        return self.num_splits > 1

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The values of the attention kernel's arguments `PLAN_ARG_NAMES` (made once per
        plan), as the launch's binder takes them."""
        args = {**self.constexprs, "num_splits": self.num_splits, "SPLIT_KV": self.split_kv}
        return tuple(args[name] for name in PLAN_ARG_NAMES)

    @functools.cached_property
    def merge_kernel_args(self) -> tuple:
        """The values of the split merge kernel's arguments `MERGE_PLAN_ARG_NAMES` (made once
        per plan)."""
        splits_pad = next_power_of_2(max(self.num_splits, MAX_SPLITS))
        return self.num_splits, self.shape.head_size_v, self.constexprs["HEAD_V_PAD"], splits_pad

    @property
    def merge_num_warps(self) -> int:
        """The split merge kernel's warps: one row of `HEAD_V_PAD` values per program."""
        return 4 if self.constexprs["HEAD_V_PAD"] <= 128 else 8

    @functools.cached_property
    def unsplit(self) -> AttnPlan:
        """The same batch without splits (for a call whose padding leaves the workspace too
        few rows for any split)."""
        return _plan(
            self.shape, self.num_tokens, self.max_seqlen_q, 1, self.requested_variant,
            self.requested_config,
        )  # fmt: skip

    def describe(self) -> str:
        """One line for logs: variant, splits and tiles."""
        c = self.config
        return (
            f"{self.variant}: {self.num_splits} split(s), {c.block_m}x{c.tile_n} tiles, "
            f"{c.num_warps} warps, {c.num_stages} stages"
        )


def plan_paged_attention(
    shape: AttnShape,
    *,
    num_tokens: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_splits: int | None = None,
    max_splits: int | None = None,
    max_rows: int | None = None,
    variant: str | None = None,
    config: AttnConfig | None = None,
) -> AttnPlan:
    """The plan of one batch: `num_tokens` query tokens (padding included), the longest query
    and KV lengths. Host arithmetic only (capture-safe).

    `num_splits` overrides the split rule (`plan_split_kv`); `max_splits` and `max_rows`
    (tokens x splits) cap it to a workspace's capacity. Prefill never splits. `variant` (one
    of VARIANTS) and `config` override the device rule's choice, for tuning and tests.
    """
    if num_splits is None:
        num_splits = plan_split_kv(
            num_tokens, max_seqlen_q, max_seqlen_k, shape.num_kv_heads, shape.info,
            kv_elem=shape.kv_dtype.itemsize,
        )  # fmt: skip
    if num_splits > 1 and max_splits is not None:
        num_splits = min(num_splits, max_splits)
    if num_splits > 1 and max_rows is not None:
        num_splits = min(num_splits, max_rows // max(num_tokens, 1))
    if max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN:
        num_splits = 1  # prefill: its query blocks already fill the grid
    return _plan(shape, num_tokens, max_seqlen_q, max(num_splits, 1), variant, config)


@functools.lru_cache(maxsize=4096)
def _plan(
    shape: AttnShape,
    num_tokens: int,
    max_seqlen_q: int,
    num_splits: int,
    variant: str | None,
    config: AttnConfig | None,
) -> AttnPlan:
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    requested = config
    if config is None:
        # Only prefill takes TMA tiles; the gather variant never does.
        tma_page = shape.tma_page_size if variant != VARIANT_GATHER else None
        config = select_config(
            shape.info,
            head_k_pad=next_power_of_2(shape.head_size),
            head_v_pad=next_power_of_2(shape.head_size_v),
            gqa=shape.gqa,
            max_seqlen_q=max_seqlen_q,
            kv_elem=shape.kv_dtype.itemsize,
            q_elem=shape.q_dtype.itemsize,
            split_kv=num_splits > 1,
            tma_page_size=tma_page if max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN else None,
        )
    _check_config(config, variant, shape)
    chosen = VARIANT_TMA if config.tma_tiles else VARIANT_GATHER
    constexprs = MappingProxyType(_constexprs(shape, config))
    return AttnPlan(
        shape, chosen, config, num_splits, num_tokens, max_seqlen_q, constexprs,
        requested_variant=variant, requested_config=requested,
    )  # fmt: skip


def _check_config(config: AttnConfig, variant: str | None, shape: AttnShape) -> None:
    batch_pages = config.tma_page_batch
    if batch_pages and (not config.tma_tiles or batch_pages & (batch_pages - 1)):
        raise ValueError(
            "config: expected tma_page_batch 0, or a power of two with tma_tiles=True, got "
            f"tma_page_batch={batch_pages} with tma_tiles={config.tma_tiles}"
        )
    if variant == VARIANT_TMA and not config.tma_tiles:
        raise ValueError(
            f"variant: {VARIANT_TMA!r} needs a prefill over a TMA-readable cache of pages of "
            f"whole tiles on a device that takes them; got a {shape.kv_dtype} cache, head "
            f"{shape.head_size}, pages of {shape.block_size} on {shape.info.device_class}"
        )


# The attention kernel's arguments a plan fixes: its constexprs (`_constexprs`) and the split.
PLAN_ARG_NAMES = (
    "GQA", "HEAD_K", "HEAD_V", "HEAD_K_PAD", "HEAD_V_PAD", "BLOCK_SIZE", "BLOCK_M", "BLOCK_Q",
    "TILE_N", "DOT_MODE", "UNMASKED_INTERIOR", "PREFETCH_PAGES", "V_PAIRS", "TMA_TILES",
    "TMA_PAGE_BATCH", "num_splits", "SPLIT_KV",
)  # fmt: skip
# The split merge kernel's arguments a plan fixes, as `AttnPlan.merge_kernel_args` holds them.
MERGE_PLAN_ARG_NAMES = ("num_splits", "HEAD_V", "HEAD_V_PAD", "SPLITS_PAD")


def _constexprs(shape: AttnShape, config: AttnConfig) -> dict[str, int | bool]:
    """The kernel's constexprs that a plan fixes (`_paged_attn_kernel`'s names)."""
    on_cpu = shape.info.device_class == "cpu"
    fp8_cache = shape.kv_dtype.itemsize == 1
    if fp8_cache and config.fp8_dot_fp16:
        dot_mode = 2  # fp16 dots over fp8 tiles
    else:
        dot_mode = 1 if on_cpu and shape.q_dtype == torch.bfloat16 else 0
    pairs = fp8_cache and dot_mode == 2 and config.fp8_value_pairs
    return {
        "GQA": shape.gqa,
        "HEAD_K": shape.head_size,
        "HEAD_V": shape.head_size_v,
        "HEAD_K_PAD": next_power_of_2(shape.head_size),
        "HEAD_V_PAD": next_power_of_2(shape.head_size_v),
        "BLOCK_SIZE": shape.block_size,
        "BLOCK_M": config.block_m,
        "BLOCK_Q": config.block_q,
        "TILE_N": config.tile_n,
        "DOT_MODE": dot_mode,
        "UNMASKED_INTERIOR": config.unmasked_interior,
        "PREFETCH_PAGES": config.prefetch_pages,
        "V_PAIRS": pair_mode(shape.kv_dtype, on_gpu=not on_cpu) if pairs else 0,
        "TMA_TILES": config.tma_tiles,
        "TMA_PAGE_BATCH": config.tma_page_batch,
    }


def fit_to_workspace(plan: AttnPlan, num_tokens: int, rows: int) -> AttnPlan:
    """`plan` for a call of `num_tokens` tokens whose workspace holds `rows` partial rows:
    itself where its splits fit, else fewer splits (the same config), else unsplit."""
    if not plan.split_kv or num_tokens * plan.num_splits <= rows:
        return plan
    splits = rows // max(num_tokens, 1)
    if splits > 1:
        return replace(plan, num_splits=splits)
    return plan.unsplit


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
    has at least that many programs per KV head; splits bring it to the tuned programs per SM
    (whole waves), never below the tuned keys per split. Single tokens over a 1-byte cache
    (`kv_elem`) follow `_fp8_decode_splits`.
    """
    if max_seqlen_q < 1 or max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN or num_query_tokens < 1:
        return 1
    tuning = tuning_for(device_info.device_class)
    min_requests = -(-num_query_tokens // max_seqlen_q)
    base_programs = min_requests * num_kv_heads
    max_useful = max(1, min(max_seqlen_k // tuning.min_keys_per_split, max_splits))
    if kv_elem == 1 and max_seqlen_q == 1:
        return _fp8_decode_splits(
            base_programs, device_info.num_sms, max_useful, tuning.fp8_programs_per_sm,
            tuning.fp8_min_wave_fill,
        )  # fmt: skip
    if base_programs >= device_info.num_sms * tuning.unsplit_programs_per_sm:
        return 1  # enough programs already: a split only adds the merge
    # Round DOWN to whole waves: a partial last wave costs more than it brings.
    if max_seqlen_q >= tuning.block_query_len:
        per_sm = tuning.programs_per_sm_block
    else:
        per_sm = tuning.programs_per_sm
    splits = device_info.num_sms * per_sm // base_programs
    return max(1, min(splits, max_useful))


@functools.lru_cache(maxsize=1024)  # a loop of up to MAX_SPLITS steps, on the launch path
def _fp8_decode_splits(
    base_programs: int, num_sms: int, max_useful: int, per_sm: int, min_fill: float
) -> int:
    """The fewest splits (up to `max_useful`) whose grid uses at least `min_fill` of the
    program slots of its waves (`per_sm` per SM); `max_useful` if none does."""
    wave = num_sms * per_sm
    for splits in range(1, max_useful + 1):
        programs = base_programs * splits
        waves = -(-programs // wave)
        if programs >= min_fill * waves * wave:
            return splits
    return max_useful


def split_kv_max_tokens(num_kv_heads: int, device_info: DeviceInfo) -> int:
    """The most query tokens for which `plan_split_kv` can answer more than one split.

    Size `SplitKVWorkspace.max_num_tokens` with this: larger launches never split.
    """
    tuning = tuning_for(device_info.device_class)
    max_requests = -(-device_info.num_sms * tuning.unsplit_programs_per_sm // num_kv_heads)
    # fp8 single tokens: a grid past 1 / (1 - fill) waves fills them unsplit.
    fp8_waves = math.ceil(1 / (1 - tuning.fp8_min_wave_fill))
    fp8_per_sm = tuning.fp8_programs_per_sm
    fp8_requests = -(-fp8_waves * device_info.num_sms * fp8_per_sm // num_kv_heads)
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
