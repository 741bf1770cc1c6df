"""Fresh prefill: causal attention of prompts without cached context over the step's own K/V,
read by TMA (Hopper). Plan once per layer (`plan_fresh_prefill`), launch per step
(`launch_fresh_prefill`); `fresh_prefill` checks, plans and launches a standalone call."""

from __future__ import annotations

import torch

from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.fresh_prefill.checks import check_fresh_prefill
from vllm_blackwell_ext.kernels.fresh_prefill.launch import launch_fresh_prefill
from vllm_blackwell_ext.kernels.fresh_prefill.plan import (
    FRESH_PREFILL_CAPABILITIES,
    FRESH_PREFILL_HEAD_SIZES,
    FRESH_PREFILL_MIN_QUERY_LEN,
    FreshPrefillConfig,
    FreshPrefillPlan,
    fresh_prefill_config,
    fresh_prefill_requests,
    fresh_prefill_supported,
    has_fresh_prefill,
    plan_fresh_prefill,
)

__all__ = [
    "FRESH_PREFILL_CAPABILITIES",
    "FRESH_PREFILL_HEAD_SIZES",
    "FRESH_PREFILL_MIN_QUERY_LEN",
    "FreshPrefillConfig",
    "FreshPrefillPlan",
    "check_fresh_prefill",
    "fresh_prefill",
    "fresh_prefill_config",
    "fresh_prefill_requests",
    "fresh_prefill_supported",
    "has_fresh_prefill",
    "launch_fresh_prefill",
    "plan_fresh_prefill",
]


def fresh_prefill(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    softmax_scale: float,
    config: FreshPrefillConfig | None = None,
) -> torch.Tensor:
    """Causal attention of each request without cached context and with at least
    FRESH_PREFILL_MIN_QUERY_LEN queries, over its own keys; returns `out`.

    Request b's queries are q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] (length L_b); it is this
    kernel's when seq_lens[b] == L_b, and then its keys and values are the same rows of `key`
    and `value` (query i sits at position i). Only those requests' rows of `out` are written.
    `config` overrides the device's launch config (tuning, tests).
    """
    check_fresh_prefill(q, key, value, out, cu_seqlens_q, seq_lens)
    plan = plan_fresh_prefill(
        device_info(q.device),
        num_q_heads=q.shape[1],
        num_kv_heads=key.shape[1],
        head_size=q.shape[2],
        config=config,
    )
    launch_fresh_prefill(plan, q, key, value, out, cu_seqlens_q, seq_lens, softmax_scale)
    return out
