"""Launch a fresh-prefill plan: TMA descriptors of the step's own q/key/value, arguments by
name, no validation."""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.fresh_prefill.kernel import _fresh_prefill_kernel
from vllm_blackwell_ext.kernels.fresh_prefill.plan import FreshPrefillPlan
from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher

# Through compiled handles (`launch_cache`): prefill layers launch it eagerly on every step.
FRESH_PREFILL_LAUNCHER = CachedLauncher(_fresh_prefill_kernel)
_LOG2E = 1.4426950408889634


def launch_fresh_prefill(
    plan: FreshPrefillPlan,
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
):
    """The fresh requests' attention into their rows of `out`; returns the compiled handle."""
    tokens, batch = q.shape[0], seq_lens.shape[0]
    if tokens == 0 or batch == 0:
        return None
    cfg, gqa, head = plan.config, plan.gqa, plan.head_size
    block_q = plan.block_q
    q_desc = TensorDescriptor(
        q, [tokens, plan.num_q_heads, head], list(q.stride()), [block_q, gqa, head]
    )
    k_desc, v_desc = (
        TensorDescriptor(
            t, [tokens, plan.num_kv_heads * head], [t.stride(0), 1], [cfg.tile_n, head]
        )
        for t in (key, value)
    )
    args = {
        "q_desc": q_desc, "k_desc": k_desc, "v_desc": v_desc, "out_ptr": out,
        "cu_q_ptr": cu_seqlens_q, "seq_lens_ptr": seq_lens, "batch": batch,
        "qk_scale": float(softmax_scale) * _LOG2E,
        "stride_ot": out.stride(0), "stride_oh": out.stride(1),
        "min_query_len": plan.min_query_len,
        "GQA": gqa, "HEAD": head, "BLOCK_Q": block_q, "TILE_N": cfg.tile_n,
        "STAGES": cfg.num_stages, "DOT_FP32": plan.dot_fp32, "SKEW": cfg.skew_scores,
    }  # fmt: skip
    num_q_blocks = tokens // block_q + batch  # an upper bound; surplus blocks exit at once
    return FRESH_PREFILL_LAUNCHER.launch_by_name(
        (num_q_blocks, plan.num_kv_heads, 1), args, num_warps=cfg.num_warps,
        num_stages=DEFAULT_NUM_STAGES,
    )  # fmt: skip
