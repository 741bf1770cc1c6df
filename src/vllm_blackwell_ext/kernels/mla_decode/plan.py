"""The plan of one MLA decode step: kernel variant, launch config, split count, constants.

`plan_mla_decode` is host arithmetic only (no tensor, no GPU call), so an attention backend's
metadata builder makes the plan once per batch and every layer launches it
(`launch.launch_mla_decode`). What the plan holds is everything a launch derives from host
ints; what a launch reads from its tensors is only their addresses and strides.

The one device rule: the device class's table entry (`configs`) for the KV dtype, the row tile
and the batch picks the config (a TMA entry where the cache's page size allows it, a
few-program entry for few programs); the config and the dtypes pick the variant
(`choose_variant`):

- `triton`: the 16-bit split kernel (`split_kernel`), key tiles gathered per thread;
- `triton_fp8`: the fp8 pair kernel (`split_fp8_kernel`), an e4m3 cache read as 16-bit column
  pairs and widened in registers;
- `triton_tma`: the 16-bit split kernel with key tiles read by TMA copies (bf16 or fp8 cache,
  an fp8 tile widened to q's dtype);
- `gluon`: the Gluon kernel (`gluon_kernel`) of a TMA entry marked `gluon`, where its facts
  hold (`gluon_supported`).

Splits are added until the grid holds about `num_sms * ctas_per_sm` programs (so one request
at a long context and hundreds at short ones both fill the GPU), but never so many that a split
holds fewer than `min_split_keys` keys (the merge would cost more than the parallelism gains).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton.language as tl

from vllm_blackwell_ext.kernels.device import DeviceInfo
from vllm_blackwell_ext.kernels.host_ints import cdiv
from vllm_blackwell_ext.kernels.mla_decode import checks
from vllm_blackwell_ext.kernels.mla_decode.configs import (
    FEW_PROGRAMS,
    MLA_DECODE_CONFIGS,
    MLA_DECODE_FEW_PROGRAM_CONFIGS,
    MLA_DECODE_TMA_CONFIGS,
    ROW_TILES,
    MlaDecodeConfig,
)
from vllm_blackwell_ext.kernels.mla_decode.gluon_kernel import GLUON_AVAILABLE
from vllm_blackwell_ext.kernels.mla_decode.layout import GLUON_KV_LORA_RANK
from vllm_blackwell_ext.kernels.mla_decode.limits import (
    MAX_SPLITS,
    SUPPORTED_LATENT,
    WIDE_MERGE_SPLITS,
)

_LOG2E = 1.4426950408889634
_FP8 = torch.float8_e4m3fn


def merge_config(num_splits: int, device_class: str, kv_lora_rank: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_S, num_warps) of the merge for `num_splits` splits.

    On a GPU the merge is bound by load latency: narrow column chunks make many small
    programs. With many splits (one long request) 16-column chunks reading 64 splits at a time
    serve best; with a few, 32-column chunks reading 16 (see benchmarks/README.md, routes
    tried). Triton's CPU interpreter ("cpu") pays per program and per jit call far more than
    per element: one program per (token, head) and column chunk as wide as the latent's
    largest power-of-two divisor.
    """
    if device_class == "cpu":
        return (kv_lora_rank & -kv_lora_rank, 64, 2)
    return (16, 64, 2) if num_splits >= WIDE_MERGE_SPLITS else (32, 16, 2)


def kv_tag(kv_dtype: torch.dtype) -> str:
    """The config tables' key of a cache dtype."""
    return "fp8" if kv_dtype == _FP8 else "bf16"


def row_tile_bucket(rows: int) -> int:
    """The tables' row tile for `rows` query rows per request (heads x tokens)."""
    for tile in ROW_TILES:
        if rows <= tile:
            return tile
    return ROW_TILES[-1]


def table_config(
    device_class: str, tag: str, rows: int, batch: int, tma_page_size: int | None
) -> MlaDecodeConfig:
    """The tables' entry for a device class, KV dtype tag, query rows per request and number
    of requests. `tma_page_size`: the page size of a cache TMA can read, which lets the
    class's TMA entry apply where its key tile divides the page."""
    table = MLA_DECODE_CONFIGS.get(device_class, MLA_DECODE_CONFIGS["default"])
    tile = row_tile_bucket(rows)
    cfg = table.get(tag, table["bf16"])[tile]
    if tma_page_size is not None:
        tma = MLA_DECODE_TMA_CONFIGS.get(device_class, {}).get(tag, {}).get(tile)
        if tma is not None and tma_page_size % tma.block_n == 0:
            cfg = tma
    if batch * cdiv(rows, cfg.block_m) <= FEW_PROGRAMS:
        few = MLA_DECODE_FEW_PROGRAM_CONFIGS.get(device_class, {}).get(tag, {})
        cfg = few.get(tile, cfg)
    return cfg


def gluon_supported(
    q_dtype: torch.dtype, kv_dtype: torch.dtype, kv_lora_rank: int, query_tma_readable: bool
) -> bool:
    """Whether the Gluon kernel can run a launch: Gluon's Hopper API, a bf16 query (the dtype
    it is tested with; the kernel itself takes q's dtype) over a bf16 or fp8 e4m3 cache,
    latent 512 + rope 64, and a query whose rows TMA can read (contiguous, 16-byte aligned)."""
    return (
        GLUON_AVAILABLE
        and kv_lora_rank == GLUON_KV_LORA_RANK
        and q_dtype == torch.bfloat16
        and kv_dtype in (torch.bfloat16, _FP8)
        and query_tma_readable
    )


def choose_variant(config: MlaDecodeConfig, kv_dtype: torch.dtype, gluon_ok: bool) -> str:
    """The variant that runs `config` over a `kv_dtype` cache (`gluon_ok`: `gluon_supported`)."""
    if config.tma:
        return "gluon" if config.gluon and gluon_ok else "triton_tma"
    return "triton_fp8" if kv_dtype == _FP8 else "triton"


def dot_dtype(
    device_class: str, q_dtype: torch.dtype, kv_dtype: torch.dtype, tma: bool
) -> tl.dtype:
    """The Triton kernels' tensor-core operand type."""
    # Triton's interpreter computes bf16 `tl.dot` on the raw 16-bit patterns (garbage; fp16
    # and fp32 are right), so CPU runs widen the operands to fp32.
    if device_class == "cpu":
        return tl.float32
    # The pair kernel widens e4m3 to fp16 in one instruction per pair (to bf16 it takes
    # several), and e4m3 values and probabilities are exact / well inside fp16; q is
    # pre-scaled (see the fp8 kernel). TMA tiles of an fp8 cache widen to q's dtype.
    if kv_dtype == _FP8 and not tma:
        return tl.float16
    return tl.bfloat16 if q_dtype == torch.bfloat16 else tl.float16


def planned_splits(
    config: MlaDecodeConfig, batch: int, rows: int, max_seq_len: int, info: DeviceInfo
) -> int:
    """The split count that fills `info`'s SMs with `config`'s programs (module docstring)."""
    programs = max(1, batch * cdiv(rows, config.block_m))
    target = info.num_sms * config.ctas_per_sm
    # Rounded down: a grid already within one wave of the target gains less from another
    # split than the merge costs.
    wanted = target // programs
    useful = max(1, cdiv(max(max_seq_len, 1), config.min_split_keys))
    return max(1, min(wanted, useful, MAX_SPLITS))


@dataclass(frozen=True)
class MlaDecodePlan:
    """One decode step's launch, decided on the host: made by `plan_mla_decode`, launched by
    `launch_mla_decode` (any number of layers, any tensors of the planned shapes)."""

    variant: str  # one of VARIANTS
    config: MlaDecodeConfig
    num_splits: int
    batch: int  # requests
    num_heads: int
    query_len: int  # query tokens per request (causal within them)
    kv_lora_rank: int
    causal: bool
    # The page size of a cache TMA can read that the plan was made for (None: a gathered
    # cache): every cache a launch of this plan reads must be such a cache.
    tma_page_size: int | None
    device_class: str
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    @property
    def rope_dim(self) -> int:
        return SUPPORTED_LATENT[self.kv_lora_rank]

    @property
    def num_tokens(self) -> int:
        return self.batch * self.query_len

    @property
    def rows(self) -> int:
        """Query rows per request: heads x query tokens."""
        return self.query_len * self.num_heads

    @property
    def num_row_groups(self) -> int:
        return cdiv(self.rows, self.config.block_m)

    @property
    def single_split(self) -> bool:
        """One split writes the output itself; several write partials the merge combines."""
        return self.num_splits == 1

    @property
    def reads_tma(self) -> bool:
        return self.config.tma

    @functools.cached_property
    def grid(self) -> tuple[int, int, int]:
        return (self.num_row_groups * self.num_splits * self.batch, 1, 1)

    @functools.cached_property
    def merge(self) -> tuple[int, int, int]:
        """The merge's (BLOCK_R, BLOCK_S, num_warps): `merge_config` of this plan."""
        return merge_config(self.num_splits, self.device_class, self.kv_lora_rank)

    @functools.cached_property
    def merge_grid(self) -> tuple[int, int, int]:
        return (self.num_tokens, self.num_heads, self.kv_lora_rank // self.merge[0])

    @property
    def workspace_rows(self) -> int:
        """Scratch rows the launch needs (`MlaDecodeWorkspace.capacity_rows`); 0 for one split."""
        return 0 if self.single_split else self.num_tokens * self.num_heads * self.num_splits

    @property
    def partial_strides(self) -> dict[str, int]:
        """Strides of the partials, contiguous [T, H, S, R] and [T, H, S] (0: one split)."""
        if self.single_split:
            return dict(stride_pt=0, stride_ph=0, stride_ps=0, stride_lt=0, stride_lh=0)
        r, s, h = self.kv_lora_rank, self.num_splits, self.num_heads
        return dict(stride_pt=h * s * r, stride_ph=s * r, stride_ps=r, stride_lt=h * s, stride_lh=s)

    @functools.cached_property
    def split_constants(self) -> dict[str, Any]:
        """The split kernel's arguments that follow from the plan alone, by name."""
        cfg = self.config
        args: dict[str, Any] = dict(
            **self.partial_strides, num_heads=self.num_heads, query_len=self.query_len,
            num_splits=self.num_splits, num_row_groups=self.num_row_groups,
            R=self.kv_lora_rank, P=self.rope_dim, CAUSAL=self.causal,
            SINGLE_SPLIT=self.single_split,
        )  # fmt: skip
        if self.variant == "gluon":
            return args
        args |= dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_DTYPE=self.dot_dtype)
        if self.variant == "triton_fp8":
            args["INT_WIDEN"] = cfg.int_widen
        else:
            args["TMA"] = cfg.tma
        return args

    @functools.cached_property
    def merge_constants(self) -> dict[str, Any]:
        """The merge kernel's arguments that follow from the plan alone, by name."""
        block_r, block_s, _ = self.merge
        return dict(
            **self.partial_strides, num_splits=self.num_splits, query_len=self.query_len,
            BLOCK_N=self.config.block_n, BLOCK_R=block_r, BLOCK_S=block_s,
        )  # fmt: skip

    @property
    def dot_dtype(self) -> tl.dtype:
        return dot_dtype(self.device_class, self.q_dtype, self.kv_dtype, self.config.tma)

    def describe(self) -> str:
        """One line for logs and `vllm-bwx doctor`."""
        c = self.config
        reads = "TMA" if c.tma else "gathered"
        return (
            f"{self.variant}: {c.block_m}-row x {c.block_n}-key tiles ({reads}) on "
            f"{c.num_warps} warps, {self.num_splits} split(s) for {self.batch} request(s) of "
            f"{self.rows} rows"
        )


def scale_log2(softmax_scale: float) -> float:
    """The kernels' score scale: softmax_scale * log2(e) (scores in log2 units)."""
    return float(softmax_scale) * _LOG2E


def plan_mla_decode(
    batch: int,
    num_heads: int,
    max_seq_len: int | None,
    query_len: int,
    device_info: DeviceInfo,
    *,
    kv_dtype: torch.dtype = torch.bfloat16,
    q_dtype: torch.dtype = torch.bfloat16,
    kv_lora_rank: int = 512,
    tma_page_size: int | None = None,
    query_tma_readable: bool = True,
    causal: bool = True,
    num_splits: int | None = None,
    variant: str | None = None,
    config: MlaDecodeConfig | None = None,
) -> MlaDecodePlan:
    """The plan of a decode step of `batch` requests x `query_len` tokens x `num_heads` heads
    over contexts up to `max_seq_len` on `device_info`'s device; host arithmetic only.

    `tma_page_size`: the page size of a cache TMA can read (`cache_tma_page_size`; vLLM's
    block size for its contiguous cache), which lets TMA entries apply. `query_tma_readable`:
    the query will be contiguous at a 16-byte address (the Gluon variant reads it by TMA).
    `num_splits` fixes the split count (else planned from `max_seq_len`). `variant` and
    `config` override the rule and the table (tuning, benchmarks, tests); both are checked
    against the facts given.
    """
    checks.check_plan_request(kv_lora_rank, query_len, num_splits, max_seq_len, variant)
    rows = query_len * num_heads
    cls = device_info.device_class
    if config is None:
        config = table_config(cls, kv_tag(kv_dtype), rows, batch, tma_page_size)
    else:
        checks.check_config_fits_cache(config, tma_page_size, cls)
    gluon_ok = gluon_supported(q_dtype, kv_dtype, kv_lora_rank, query_tma_readable)
    if variant is None:
        variant = choose_variant(config, kv_dtype, gluon_ok)
    else:
        checks.check_variant(variant, config, kv_dtype, gluon_ok)
    if num_splits is None:
        num_splits = planned_splits(config, batch, rows, max_seq_len, device_info)
    return MlaDecodePlan(
        variant=variant, config=config, num_splits=num_splits, batch=batch,
        num_heads=num_heads, query_len=query_len, kv_lora_rank=kv_lora_rank, causal=causal,
        tma_page_size=tma_page_size, device_class=cls, q_dtype=q_dtype, kv_dtype=kv_dtype,
    )  # fmt: skip
