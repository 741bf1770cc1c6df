"""Our Triton kernels compiled in vLLM's JIT warm-up, before the engine takes requests.

vLLM's warm-up runs tiny batches through the model (2-token prompts, CUDA-graph capture of
decode shapes), so without this a kernel variant only those batches miss (the prefill tiles,
the one-split MLA decode of short eager batches, the context gather of chunked MLA prefill)
compiles at the first request that needs it: about a second of an H200 in the middle of
serving, which vLLM's JIT monitor then reports.

The metadata builders register these warm-ups with vLLM 0.32's `JitWarmupRegistry` (active
while the runner builds them); the registry expands each registration to compile keys and
compiles every key once, here by launching the kernel on a few pages of scratch with what
the real launch specialises on: dtypes, constexprs and 16-divisible strides (vLLM's caches
and activations have them for every head size we declare).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

from vllm_blackwell_ext.attention.layer_overrides import LAYER_CAUSAL_ATTR, LAYER_WINDOW_ATTR
from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.fresh_prefill import (
    FRESH_PREFILL_MIN_QUERY_LEN,
    fresh_prefill,
    fresh_prefill_supported,
)
from vllm_blackwell_ext.kernels.kv_gather import gather_and_maybe_dequant_cache
from vllm_blackwell_ext.kernels.mla_decode import (
    FEW_PROGRAMS,
    SUPPORTED_LATENT,
    WIDE_MERGE_SPLITS,
    device_reads_tma,
    mla_decode,
    plan_mla_decode,
)
from vllm_blackwell_ext.kernels.paged_attention import (
    SPLIT_KV_MAX_QUERY_LEN,
    AttnConfig,
    AttnShape,
    KernelLaunch,
    LayerOptions,
    paged_cache_layout,
    plan_paged_attention,
    plan_split_kv,
    planned_launches,
    split_kv_max_tokens,
)
from vllm_blackwell_ext.switches import FRESH_PREFILL


@dataclass(frozen=True)
class AttentionLayerKind:
    """What one BWX_ATTN layer's launches specialise on, besides the query length."""

    q_dtype: torch.dtype
    kv_dtype: torch.dtype  # the cache's element type as the kernel reads it (fp8, not uint8)
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    causal: bool
    sliding_window: int | None
    has_sinks: bool
    softcap: float
    head_size_v: int | None = None  # None: the key head size

    @property
    def value_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    def shape(self, info: DeviceInfo) -> AttnShape:
        """The `AttnShape` of this layer's cache as vLLM lays it out on `info`'s device."""
        return AttnShape.for_cache(
            info,
            q_dtype=self.q_dtype,
            kv_dtype=self.kv_dtype,
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            head_size_v=self.value_head_size,
            block_size=self.block_size,
            tma_readable=True,
        )

    def fresh_prefill_facts(self) -> dict[str, Any]:
        """The layer's side of `fresh_prefill_supported`."""
        return {
            "q_dtype": self.q_dtype,
            "kv_dtype": self.kv_dtype,
            "num_q_heads": self.num_q_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "head_size_v": self.value_head_size,
            "causal": self.causal,
            "sliding_window": self.sliding_window,
            "has_sinks": self.has_sinks,
            "softcap": self.softcap,
        }


def attention_layer_kinds(
    layers: list[Any], model_dtype: torch.dtype, head_size_v: int, block_size: int
) -> set[AttentionLayerKind]:
    """The distinct launch specialisations of BWX_ATTN layers (vLLM attention layers whose
    `impl` is a `BwxAttentionImpl`), for JIT warm-up."""
    kinds = set()
    for layer in layers:
        impl = layer.impl
        kinds.add(
            AttentionLayerKind(
                q_dtype=model_dtype,
                kv_dtype=impl.fp8_dtype or model_dtype,
                num_q_heads=impl.num_heads,
                num_kv_heads=impl.num_kv_heads,
                head_size=impl.head_size,
                head_size_v=head_size_v,
                block_size=block_size,
                causal=getattr(layer, LAYER_CAUSAL_ATTR, None) is not False,
                sliding_window=getattr(layer, LAYER_WINDOW_ATTR, impl.sliding_window),
                has_sinks=impl.sinks is not None,
                softcap=impl.logits_soft_cap,
            )
        )
    return kinds


@dataclass(frozen=True)
class PagedAttentionKey:
    layer: AttentionLayerKind
    max_seqlen_q: int  # one query length of each distinct tile config
    # 1: unsplit; up to the config's merge_in_kernel_max_splits: the split kernel that merges
    # itself; more: the split kernel and the merge kernel
    num_splits: int = 1


@dataclass(frozen=True)
class FreshPrefillKey:
    layer: AttentionLayerKind


def paged_attention_warmup_keys(
    layer: AttentionLayerKind, max_model_len: int, info: DeviceInfo
) -> list[PagedAttentionKey | FreshPrefillKey]:
    """One key per kernel variant the layer can launch: each tile config (decode and verify
    lengths 1..16, prefill beyond), unsplit, and split with each merge the plan can reach; and
    the fresh-prefill kernel where the layer takes it."""
    keys, configs = [], set()
    kv_elem = layer.kv_dtype.itemsize
    shape = layer.shape(info)

    def config(q_len: int, split_kv: bool = False) -> AttnConfig:
        plan = plan_paged_attention(
            shape, num_tokens=q_len, max_seqlen_q=q_len, max_seqlen_k=max_model_len,
            num_splits=2 if split_kv else 1,
        )  # fmt: skip
        return plan.config

    for q_len in range(1, SPLIT_KV_MAX_QUERY_LEN + 2):
        cfg = config(q_len)
        if cfg not in configs:
            configs.add(cfg)
            keys.append(PagedAttentionKey(layer, q_len))
    # Split variants, per split config: the most splits any batch of a decode length taking
    # it plans (shorter contexts plan fewer, down to 2). Prefill never splits.
    most_splits: dict[AttnConfig, tuple[int, int]] = {}
    max_tokens = split_kv_max_tokens(layer.num_kv_heads, info)
    for q_len in range(1, SPLIT_KV_MAX_QUERY_LEN + 1):
        most = max(
            plan_split_kv(tokens, q_len, max_model_len, layer.num_kv_heads, info, kv_elem=kv_elem)
            for tokens in range(q_len, max_tokens + 1, q_len)
        )
        split_cfg = config(q_len, split_kv=True)
        if most > most_splits.get(split_cfg, (0, 1))[1]:
            most_splits[split_cfg] = (q_len, most)
    for split_cfg, (q_len, most) in most_splits.items():
        in_kernel = split_cfg.merge_in_kernel_max_splits
        keys.append(PagedAttentionKey(layer, q_len, 2))  # merged in the kernel where it may
        if 2 <= in_kernel < most:  # more splits than merge in the kernel
            keys.append(PagedAttentionKey(layer, q_len, in_kernel + 1))
    if FRESH_PREFILL.enabled() and fresh_prefill_supported(info, **layer.fresh_prefill_facts()):
        keys.append(FreshPrefillKey(layer))
    return keys


def launch_fresh_prefill_warmup(key: FreshPrefillKey, device: torch.device) -> None:
    """One fresh prefill on scratch, q/key/value as views of one packed activation (as vLLM's
    qkv projection hands them over)."""
    layer = key.layer
    tokens = FRESH_PREFILL_MIN_QUERY_LEN
    heads = (layer.num_q_heads, layer.num_kv_heads, layer.num_kv_heads)
    qkv = torch.zeros((tokens, sum(heads), layer.head_size), dtype=layer.q_dtype, device=device)
    q, k, v = qkv.split(heads, dim=1)
    int32 = {"dtype": torch.int32, "device": device}
    fresh_prefill(
        q,
        k,
        v,
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.tensor([0, tokens], **int32),
        torch.tensor([tokens], **int32),
        softmax_scale=1.0 / math.sqrt(layer.head_size),
    )


def launch_paged_attention_warmup(
    key: PagedAttentionKey | FreshPrefillKey, device: torch.device
) -> None:
    """Run one launch of the key's variant on scratch (one request of a few pages)."""
    if isinstance(key, FreshPrefillKey):
        launch_fresh_prefill_warmup(key, device)
        return
    for launch in paged_attention_warmup_launches(key, device):
        launch.run()


def paged_attention_warmup_launches(
    key: PagedAttentionKey, device: torch.device, info: DeviceInfo | None = None
) -> list[KernelLaunch]:
    """The launches of the key's variant over scratch (one request of a few pages), planned
    as the layer's metadata builder plans on `info`'s device (default: `device`'s)."""
    layer = key.layer
    q_len, bs = key.max_seqlen_q, layer.block_size
    seq_len = q_len + bs  # some cached context before the queries
    pages = -(-seq_len // bs)
    # vLLM's layout: [num_blocks, num_kv_heads, block_size, head_size + head_size_v], K and V
    # views.
    hs_k, hs_v = layer.head_size, layer.value_head_size
    storage = torch.uint8 if layer.kv_dtype.itemsize == 1 else layer.kv_dtype
    kv = torch.zeros(
        (pages + 1, layer.num_kv_heads, bs, hs_k + hs_v), dtype=storage, device=device
    ).view(layer.kv_dtype)
    cache = paged_cache_layout(*kv.transpose(1, 2).split([hs_k, hs_v], dim=-1))
    q = torch.zeros((q_len, layer.num_q_heads, hs_k), dtype=layer.q_dtype, device=device)
    out = torch.empty((q_len, layer.num_q_heads, hs_v), dtype=layer.q_dtype, device=device)
    scale = torch.ones(1, dtype=torch.float32, device=device) if storage == torch.uint8 else None
    sinks = torch.zeros(layer.num_q_heads, dtype=torch.float32, device=device)
    options = LayerOptions(
        softmax_scale=1.0 / math.sqrt(layer.head_size),
        causal=layer.causal,
        sliding_window=layer.sliding_window,
        softcap=layer.softcap,
        sinks=sinks if layer.has_sinks else None,
        k_scale=scale,
        v_scale=scale,
    )
    plan = plan_paged_attention(
        layer.shape(info or device_info(device)), num_tokens=q_len, max_seqlen_q=q_len,
        max_seqlen_k=seq_len, num_splits=key.num_splits,
    )  # fmt: skip
    int32 = {"dtype": torch.int32, "device": device}
    return planned_launches(
        plan, q, cache, out, torch.tensor([0, q_len], **int32), torch.tensor([seq_len], **int32),
        torch.arange(1, pages + 1, **int32).view(1, pages), options,
    )  # fmt: skip


@dataclass(frozen=True)
class MlaGatherKey:
    """What BWX_MLA's context gather specialises on (`gather_and_maybe_dequant_cache`)."""

    cache_dtype: torch.dtype  # the cache's storage dtype (uint8 for fp8)
    kv_cache_dtype: str  # vLLM's name of it ("auto", "fp8", ...)
    out_dtype: torch.dtype
    latent_width: int
    block_size: int


def launch_mla_gather_warmup(key: MlaGatherKey, device: torch.device) -> None:
    """Gather one request's context of two pages (with a start offset, as chunks have)."""
    bs = key.block_size
    cache = torch.zeros((3, bs, key.latent_width), dtype=key.cache_dtype, device=device)
    rows = 2 * bs
    dst = torch.empty((rows, key.latent_width), dtype=key.out_dtype, device=device)
    int32 = {"dtype": torch.int32, "device": device}
    gather_and_maybe_dequant_cache(
        cache,
        dst,
        torch.tensor([[1, 2]], **int32),
        torch.tensor([0, rows], **int32),
        torch.zeros(rows, **int32),
        rows,
        key.kv_cache_dtype,
        torch.ones(1, dtype=torch.float32, device=device),
        torch.zeros(1, **int32),
    )


@dataclass(frozen=True)
class MlaDecodeKind:
    """What BWX_MLA's decode launches specialise on, besides the query length."""

    q_dtype: torch.dtype
    kv_dtype: torch.dtype  # as the kernel reads it: the model dtype or float8_e4m3fn
    num_heads: int
    kv_lora_rank: int
    block_size: int
    has_lse: bool


@dataclass(frozen=True)
class MlaDecodeKey:
    kind: MlaDecodeKind
    query_len: int  # one query length of each distinct row tile
    # 1: the one-split kernel; more: the split kernel and the merge config of that many splits
    num_splits: int
    batch: int = 1  # requests: the config table answers by batch size too


def mla_decode_warmup_keys(
    kind: MlaDecodeKind, max_query_len: int, info: DeviceInfo
) -> list[MlaDecodeKey]:
    """Every split variant of each config decode lengths 1..max_query_len reach, few requests
    or many (one split; split with each merge config): a captured graph fixes one split plan
    per batch size, eager mixed batches plan any."""
    keys, configs = [], set()
    # The scratch cache of `launch_mla_decode_warmup` is contiguous, as vLLM's is: TMA entries
    # apply to both alike.
    tma_page_size = kind.block_size if device_reads_tma(info) else None
    for query_len in range(1, max_query_len + 1):
        for batch in (1, FEW_PROGRAMS + 1):
            # The plan's config (and with it its variant) is the same for any split count.
            cfg = plan_mla_decode(
                batch, kind.num_heads, None, query_len, info, kv_dtype=kind.kv_dtype,
                q_dtype=kind.q_dtype, kv_lora_rank=kind.kv_lora_rank,
                tma_page_size=tma_page_size, num_splits=1,
            ).config  # fmt: skip
            if cfg not in configs:
                configs.add(cfg)
                keys += [MlaDecodeKey(kind, query_len, n, batch) for n in (1, 2, WIDE_MERGE_SPLITS)]
    return keys


def launch_mla_decode_warmup(key: MlaDecodeKey, device: torch.device) -> None:
    """`batch` requests of `query_len` tokens, each over the same two pages of scratch cache."""
    kind, q_len, batch = key.kind, key.query_len, key.batch
    width = kind.kv_lora_rank + SUPPORTED_LATENT[kind.kv_lora_rank]
    int32 = {"dtype": torch.int32, "device": device}
    fp8 = kind.kv_dtype == torch.float8_e4m3fn
    cache = torch.zeros(
        (3, kind.block_size, width), dtype=torch.uint8 if fp8 else kind.kv_dtype, device=device
    ).view(kind.kv_dtype)
    tokens = batch * q_len
    q = torch.zeros((tokens, kind.num_heads, width), dtype=kind.q_dtype, device=device)
    mla_decode(
        q,
        cache,
        torch.tensor([[1, 2]] * batch, **int32),
        torch.tensor([kind.block_size + q_len] * batch, **int32),
        torch.empty((tokens, kind.num_heads, kind.kv_lora_rank), dtype=kind.q_dtype, device=device),
        softmax_scale=1.0 / math.sqrt(width),
        kv_lora_rank=kind.kv_lora_rank,
        query_len=q_len,
        k_scale=torch.ones(1, dtype=torch.float32, device=device) if fp8 else None,
        lse_out=(
            torch.empty((tokens, kind.num_heads), dtype=torch.float32, device=device)
            if kind.has_lse
            else None
        ),
        num_splits=key.num_splits,
    )


class LaunchWarmup(VllmJitKernel):
    """A kernel's entry in vLLM's JIT warm-up: `keys(**registration)` lists the variants a
    registration can launch, `launch(key, device)` compiles one by running it on scratch."""

    def __init__(self, keys: Callable[..., list], launch: Callable[[Any, torch.device], None]):
        super().__init__()
        self._keys, self._launch = keys, launch

    def get_warmup_keys(self, **registration: Any) -> list:
        return self._keys(**registration)

    def compile(self, compile_key: Any) -> None:
        self._launch(compile_key, torch.device("cuda", torch.cuda.current_device()))


# The registry keys registrations by kernel object: one instance each, for every builder.
PAGED_ATTENTION_WARMUP = LaunchWarmup(paged_attention_warmup_keys, launch_paged_attention_warmup)
MLA_GATHER_WARMUP = LaunchWarmup(lambda key: [key], launch_mla_gather_warmup)
MLA_DECODE_WARMUP = LaunchWarmup(mla_decode_warmup_keys, launch_mla_decode_warmup)
