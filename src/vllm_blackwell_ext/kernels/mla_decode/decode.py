"""`mla_decode`: check, plan and launch one MLA decode call (the standalone entry point).

Callers that decode over the same shapes on every layer (an attention backend) make the plan
once per batch (`plan_mla_decode`), check a layer's tensors once per cache, and call
`launch_mla_decode` per layer instead.
"""

from __future__ import annotations

import torch

from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.mla_decode import checks
from vllm_blackwell_ext.kernels.mla_decode.configs import MlaDecodeConfig
from vllm_blackwell_ext.kernels.mla_decode.launch import launch_mla_decode
from vllm_blackwell_ext.kernels.mla_decode.layout import (
    MlaCacheLayout,
    cache_tma_page_size,
    query_is_tma_readable,
)
from vllm_blackwell_ext.kernels.mla_decode.limits import SUPPORTED_LATENT
from vllm_blackwell_ext.kernels.mla_decode.plan import MlaDecodePlan, plan_mla_decode
from vllm_blackwell_ext.kernels.mla_decode.workspace import MlaDecodeWorkspace


def plan_for_tensors(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    kv_lora_rank: int,
    query_len: int = 1,
    num_splits: int | None = None,
    causal: bool = True,
    max_seq_len: int | None = None,
    config: MlaDecodeConfig | None = None,
    variant: str | None = None,
    cache_layout: MlaCacheLayout | None = None,
) -> MlaDecodePlan:
    """`plan_mla_decode` with the facts read from the tensors of a call (`mla_decode`'s
    arguments of the same names). Without `num_splits` and `max_seq_len` it reads
    `seq_lens.max()` back from the device (a host sync)."""
    info = device_info(q.device)
    if cache_layout is not None:
        tma_page_size = cache_layout.tma_page_size
    else:
        tma_page_size = cache_tma_page_size(kv_cache, info)
    batch = seq_lens.shape[0]
    if num_splits is None and max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if batch else 0
    return plan_mla_decode(
        batch, q.shape[1], max_seq_len, query_len, info, kv_dtype=kv_cache.dtype,
        q_dtype=q.dtype, kv_lora_rank=kv_lora_rank, tma_page_size=tma_page_size,
        query_tma_readable=query_is_tma_readable(q), causal=causal, num_splits=num_splits,
        variant=variant, config=config,
    )  # fmt: skip


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    softmax_scale: float,
    kv_lora_rank: int,
    query_len: int = 1,
    k_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: MlaDecodeWorkspace | None = None,
    num_splits: int | None = None,
    causal: bool = True,
    max_seq_len: int | None = None,
    config: MlaDecodeConfig | None = None,
    variant: str | None = None,
    compiled: list | None = None,
    check_inputs: bool = True,
    cache_layout: MlaCacheLayout | None = None,
) -> torch.Tensor:
    """Absorbed-query MLA decode over a paged latent cache; writes and returns `out`.

    q: [num_tokens, num_heads, kv_lora_rank + rope_dim] (request-major: token t belongs to
    request t // query_len); kv_cache: [num_blocks, block_size, kv_lora_rank + rope_dim], q's
    dtype (bf16 or fp16) or float8_e4m3fn (value = stored * k_scale); block_table: int32 [batch,
    max_blocks]; seq_lens: int32 [batch], KV length including the new tokens; out: [num_tokens,
    num_heads, kv_lora_rank]. Row j of a request sees keys [0, seq_len - query_len + j] (all
    seq_len keys when `causal=False`). A row that sees no key (seq_len 0, as on a DCP rank
    holding none of a request) gets output 0 and LSE -inf. `lse_out` (float32 [num_tokens,
    num_heads]) receives the natural-log LSE. With `workspace` and `num_splits` given, nothing
    is allocated and the host never waits on the GPU; otherwise `max_seq_len` (or, failing that,
    a host read of `seq_lens`) feeds the split planner. `config` / `variant` override the
    table's launch config and the rule's kernel (`plan_mla_decode`); `compiled`, when a list,
    receives the compiled split kernel (for shared/regs/spills). `check_inputs=False` skips
    the input checks for callers that checked the same tensors' layout once; `cache_layout`:
    `mla_cache_layout(kv_cache)`, made once by such a caller (None derives it per call).
    """
    if check_inputs:
        checks.check_mla_decode_inputs(
            q, kv_cache, block_table, seq_lens, out, kv_lora_rank=kv_lora_rank,
            query_len=query_len, k_scale=k_scale, lse_out=lse_out,
        )  # fmt: skip
    if cache_layout is not None:
        checks.check_cache_layout(cache_layout, kv_cache)
    if q.shape[0] == 0:
        return out
    plan = plan_for_tensors(
        q, kv_cache, seq_lens, kv_lora_rank=kv_lora_rank, query_len=query_len,
        num_splits=num_splits, causal=causal, max_seq_len=max_seq_len, config=config,
        variant=variant, cache_layout=cache_layout,
    )  # fmt: skip
    if workspace is not None:
        checks.check_workspace(workspace, plan)
    handle = launch_mla_decode(
        plan, q, kv_cache, block_table, seq_lens, out, softmax_scale=softmax_scale,
        k_scale=k_scale, lse_out=lse_out, workspace=workspace, cache_layout=cache_layout,
    )  # fmt: skip
    if compiled is not None:
        compiled.append(handle)
    return out


def mla_decode_flops(num_tokens: int, num_heads: int, context: int, kv_lora_rank: int) -> float:
    """Matrix FLOPs of one decode call: QK^T over latent+rope and P@V over the latent."""
    width = kv_lora_rank + SUPPORTED_LATENT[kv_lora_rank]
    return 2.0 * num_tokens * num_heads * context * (width + kv_lora_rank)
