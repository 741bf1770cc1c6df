"""Paged attention over vLLM's paged KV cache (the kernel of BWX_ATTN).

Plan once per batch (`plan_paged_attention`), launch per layer (`launch_paged_attention`);
`paged_attention` does both, with the input checks, for a standalone call.
"""

from __future__ import annotations

import torch

from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention.checks import (
    SUPPORTED_HEAD_SIZES,
    SUPPORTED_KV_DTYPES,
    SUPPORTED_Q_DTYPES,
    check_cache_layout,
    check_paged_attention,
    check_plan_fits,
    check_workspace,
)
from vllm_blackwell_ext.kernels.paged_attention.configs import (
    PREFILL_TMA_MIN_TRITON,
    SPLIT_KV_MAX_QUERY_LEN,
    AttnConfig,
    preferred_block_size,
)
from vllm_blackwell_ext.kernels.paged_attention.launch import (
    KernelLaunch,
    LayerOptions,
    launch_paged_attention,
    planned_launches,
)
from vllm_blackwell_ext.kernels.paged_attention.layout import (
    TMA_HEAD_SIZES,
    PagedCacheLayout,
    paged_cache_layout,
    tma_grid,
    tma_page_size,
    tma_readable_heads,
)
from vllm_blackwell_ext.kernels.paged_attention.plan import (
    MAX_SPLITS,
    VARIANTS,
    AttnPlan,
    AttnShape,
    plan_paged_attention,
    plan_split_kv,
    split_kv_max_rows,
    split_kv_max_tokens,
)
from vllm_blackwell_ext.kernels.paged_attention.tuned import AttnTuning, tuning_for
from vllm_blackwell_ext.kernels.paged_attention.workspace import SplitKVWorkspace

__all__ = [
    "MAX_SPLITS",
    "PREFILL_TMA_MIN_TRITON",
    "SPLIT_KV_MAX_QUERY_LEN",
    "SUPPORTED_HEAD_SIZES",
    "SUPPORTED_KV_DTYPES",
    "SUPPORTED_Q_DTYPES",
    "TMA_HEAD_SIZES",
    "VARIANTS",
    "AttnConfig",
    "AttnPlan",
    "AttnShape",
    "AttnTuning",
    "KernelLaunch",
    "LayerOptions",
    "PagedCacheLayout",
    "SplitKVWorkspace",
    "check_paged_attention",
    "check_plan_fits",
    "check_workspace",
    "launch_paged_attention",
    "paged_attention",
    "paged_cache_layout",
    "plan_paged_attention",
    "plan_split_kv",
    "planned_launches",
    "preferred_block_size",
    "split_kv_max_rows",
    "split_kv_max_tokens",
    "tma_grid",
    "tma_page_size",
    "tma_readable_heads",
    "tuning_for",
]


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: SplitKVWorkspace | None = None,
    num_splits: int | None = None,
    variant: str | None = None,
    config: AttnConfig | None = None,
    cache_layout: PagedCacheLayout | None = None,
) -> torch.Tensor:
    """Attention of `q` over the paged KV cache; writes `out[: cu_seqlens_q[-1]]` and returns it.

    Request b has query tokens q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] (length L_b) and KV
    length S_b = seq_lens[b] (its new tokens included, already in the cache); its query i sits
    at absolute position S_b - L_b + i. Causal: keys <= that position; non-causal: all S_b keys.
    `sliding_window` W bounds only how far back a query looks (keys >= position - W + 1).
    `sinks` adds one per-head logit to each softmax denominator (with a zero value).
    fp8 caches are dequantised as stored * k_scale / v_scale (scale 1 when both are None).
    `lse_out`, if given, gets the natural-log sum-exp of each row's (scaled, soft-capped)
    logits, the sink included. `num_splits` overrides the split-KV plan, `variant` (one of
    VARIANTS) and `config` the device rule's kernel (tuning, tests). `cache_layout`:
    `paged_cache_layout(key_cache, value_cache)`, made once by a caller that launches over the
    same cache every call. Checks every input, plans and launches; with a `workspace`,
    nothing is allocated and the host never reads device memory.
    """
    check_paged_attention(
        q, key_cache, value_cache, out, cu_seqlens_q, seq_lens, block_table,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, sliding_window=sliding_window,
        sinks=sinks, softcap=softcap, k_scale=k_scale, v_scale=v_scale, lse_out=lse_out,
    )  # fmt: skip
    if cache_layout is None:
        cache_layout = paged_cache_layout(key_cache, value_cache)
    check_cache_layout(cache_layout, key_cache, value_cache)
    if workspace is not None:
        check_workspace(workspace, q, value_cache.shape[3])
    shape = AttnShape.of_layout(device_info(q.device), q, cache_layout)
    plan = plan_paged_attention(
        shape, num_tokens=q.shape[0], max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        num_splits=num_splits, variant=variant, config=config,
        max_splits=workspace.max_splits if workspace is not None else None,
        max_rows=workspace.max_rows if workspace is not None else None,
    )  # fmt: skip
    layer = LayerOptions(softmax_scale, causal, sliding_window, softcap, sinks, k_scale, v_scale)
    launch_paged_attention(
        plan, q, cache_layout, out, cu_seqlens_q, seq_lens, block_table, layer,
        workspace=workspace, lse_out=lse_out,
    )  # fmt: skip
    return out
