"""Where fresh prefill runs and with which tiles: a plan made once per layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_blackwell_ext.kernels.device import DeviceInfo

# Requests this long or longer, without cached context, take this kernel: one key tile. Shorter
# ones are a few microseconds in the paged kernel, where this launch's host cost would dominate.
FRESH_PREFILL_MIN_QUERY_LEN = 128
# Where it runs: Hopper (measured there). TMA exists on sm100/sm120 too, but this kernel is
# neither measured nor sized for them (sm120's 101 KB would not hold three 128 x 128 stages).
FRESH_PREFILL_CAPABILITIES: tuple[tuple[int, int], ...] = ((9, 0),)
FRESH_PREFILL_HEAD_SIZES: tuple[int, ...] = (64, 128)
FRESH_PREFILL_MAX_GQA = 16


@dataclass(frozen=True)
class FreshPrefillConfig:
    block_m: int  # query rows per program: block_q tokens x GQA heads of one KV head
    tile_n: int  # keys per TMA tile
    num_warps: int
    num_stages: int
    # Ask for the scores of the next key tile before this tile's softmax, so the softmax's
    # exponentials overlap the previous tile's P @ V on the tensor cores (FlashAttention 3's
    # intra-warpgroup overlap; the sm90 SASS then waits for the scores after the softmax).
    skew_scores: bool = False

    def block_q(self, gqa: int) -> int:
        return self.block_m // gqa


# Tuned per device class (the fastest of the tiles, stage counts and warp-specialised variants
# timed on Hopper; see benchmarks/README.md, "Routes tried"); the CPU interpreter takes small
# tiles that keep the tests quick.
TUNED_CONFIGS: dict[str, FreshPrefillConfig] = {
    "sm90": FreshPrefillConfig(block_m=128, tile_n=128, num_warps=8, num_stages=3),
    "cpu": FreshPrefillConfig(block_m=32, tile_n=32, num_warps=4, num_stages=2),
}


def fresh_prefill_config(info: DeviceInfo) -> FreshPrefillConfig:
    """The tuned config of the device's class (Hopper's for other GPUs: only compile checks)."""
    return TUNED_CONFIGS.get(info.device_class, TUNED_CONFIGS["sm90"])


@dataclass(frozen=True)
class FreshPrefillPlan:
    """One layer's fresh-prefill launch: tiles and constexprs (`plan_fresh_prefill`)."""

    config: FreshPrefillConfig
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    dot_fp32: bool  # the CPU interpreter multiplies bf16 dot operands as raw bits
    min_query_len: int = FRESH_PREFILL_MIN_QUERY_LEN

    @property
    def gqa(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def block_q(self) -> int:
        return self.config.block_q(self.gqa)


def plan_fresh_prefill(
    info: DeviceInfo,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    config: FreshPrefillConfig | None = None,
) -> FreshPrefillPlan:
    """The launch plan of a layer's fresh prefills on `info`'s device (`config` overrides)."""
    return FreshPrefillPlan(
        config or fresh_prefill_config(info),
        num_q_heads,
        num_kv_heads,
        head_size,
        dot_fp32=info.device_class == "cpu",
    )


def fresh_prefill_supported(
    info: DeviceInfo,
    *,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    causal: bool,
    sliding_window: int | None,
    has_sinks: bool,
    softcap: float,
) -> bool:
    """Whether a layer's fresh prefills can take this kernel with the paged kernel's result."""
    gqa, rem = divmod(num_q_heads, num_kv_heads)
    return (
        (info.device_class == "cpu" or info.capability in FRESH_PREFILL_CAPABILITIES)
        # the cache holds the very values of key/value only in their own dtype
        and kv_dtype == q_dtype
        and q_dtype in (torch.bfloat16, torch.float16)
        and head_size == head_size_v
        and head_size in FRESH_PREFILL_HEAD_SIZES
        and rem == 0
        and gqa <= FRESH_PREFILL_MAX_GQA
        and gqa & (gqa - 1) == 0
        and causal
        and sliding_window is None
        and not has_sinks
        and not softcap
    )


def fresh_prefill_requests(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Which requests of a batch this kernel takes (bool per request), from host copies of its
    `cu_seqlens_q` ([requests + 1]) and `seq_lens` (at least [requests]; an upper bound is
    enough: a request it calls fresh has seq_len == query_len, the least it can have)."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    return (q_lens >= FRESH_PREFILL_MIN_QUERY_LEN) & (seq_lens[: q_lens.shape[0]] == q_lens)


def has_fresh_prefill(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> bool:
    """Whether a batch holds a request this kernel takes (`fresh_prefill_requests`)."""
    return bool(fresh_prefill_requests(query_start_loc, seq_lens).any())
