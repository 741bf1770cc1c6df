"""Launch of the gather kernel from a `GatherPlan`, and the two kernel-level entry points.

`launch_kv_gather(plan, tensors..., num_rows=, batch_size=)` builds the kernel's arguments by
name (the plan's constexprs plus this call's tensors and sizes) and launches through a
`CachedLauncher`. It never allocates and makes one launch, or none when there is nothing to do.
`gather_and_maybe_dequant_cache` and `cp_gather_cache` plan and launch without validating:
`vllm_blackwell_ext.ops` runs `checks.py` first.
"""

from __future__ import annotations

import torch

from ..device import device_info
from ..launch_cache import CachedLauncher
from .checks import check_bounds_on_host, debug_bounds_enabled
from .configs import GatherConfig
from .kernel import _kv_gather_kernel
from .plan import GatherPlan, entry_width, plan_kv_gather

_GATHER_LAUNCHER = CachedLauncher(_kv_gather_kernel)


def _check_plan_matches(
    plan: GatherPlan, token_to_seq: torch.Tensor | None, seq_starts: torch.Tensor | None
) -> None:
    # The plan decides which pointers the kernel reads: a tensor it would ignore, or one it
    # would read that is missing, means the plan was made for another call.
    if (token_to_seq is not None) != plan.has_token_to_seq:
        raise ValueError(
            f"token_to_seq: expected {'a tensor' if plan.has_token_to_seq else 'None'} "
            f"(the plan's has_token_to_seq={plan.has_token_to_seq}), got "
            f"{'None' if token_to_seq is None else 'a tensor'}"
        )
    if (seq_starts is not None) != plan.has_seq_starts:
        raise ValueError(
            f"seq_starts: expected {'a tensor' if plan.has_seq_starts else 'None'} "
            f"(the plan's has_seq_starts={plan.has_seq_starts}), got "
            f"{'None' if seq_starts is None else 'a tensor'}"
        )


def launch_kv_gather(
    plan: GatherPlan,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor | None,
    seq_starts: torch.Tensor | None,
    scale: torch.Tensor | None,
    *,
    num_rows: int,
    batch_size: int,
    debug_bounds: bool | None = None,
) -> None:
    """Launch the gather `plan` describes on already-validated arguments.

    With token_to_seq (gather_and_maybe_dequant_cache): rows ``t < num_rows`` (num_tokens).
    Without (cp_gather_cache): rows ``t < num_rows`` (``dst.shape[0]``) mapped to sequences by
    bisection of ``cu_seq_lens[: batch_size + 1]``. `scale` is read only when the plan
    dequantizes. `debug_bounds` (default: the ``BWX_DEBUG_BOUNDS`` environment variable) checks
    the indices on the host first and raises on a bad one; without it, the kernel skips rows
    with bad indices.
    """
    _check_plan_matches(plan, token_to_seq, seq_starts)
    if num_rows <= 0 or batch_size <= 0:
        return
    if debug_bounds is None:
        debug_bounds = debug_bounds_enabled()
    if debug_bounds:
        check_bounds_on_host(
            src_cache, block_table, cu_seq_lens, token_to_seq, num_rows, batch_size, seq_starts
        )
    # Views cost host time: only where the dtype differs (vLLM often hands fp8 caches over
    # already viewed as their fp8 type).
    if plan.src_view is not None and src_cache.dtype != plan.src_view:
        src_cache = src_cache.view(plan.src_view)
    if plan.dst_view is not None and dst.dtype != plan.dst_view:
        dst = dst.view(plan.dst_view)
    num_blocks, block_size = src_cache.shape[:2]
    stride_src_block, stride_src_slot = src_cache.stride()[:2]
    # Unused pointer arguments get a real tensor of the right kind; constexprs keep them unread.
    args = {
        **plan.constexprs,
        "src_ptr": src_cache,
        "dst_ptr": dst,
        "block_table_ptr": block_table,
        "cu_seq_lens_ptr": cu_seq_lens,
        "token_to_seq_ptr": cu_seq_lens if token_to_seq is None else token_to_seq,
        "seq_starts_ptr": cu_seq_lens if seq_starts is None else seq_starts,
        "scale_ptr": scale if plan.dequant else cu_seq_lens,
        "num_rows": num_rows,
        "batch_size": batch_size,
        "search_steps": (batch_size - 1).bit_length(),
        "block_size": block_size,
        "num_blocks": num_blocks,
        "max_blocks_per_seq": block_table.shape[1],
        "stride_bt": block_table.stride(0),
        "stride_src_block": stride_src_block,
        "stride_src_slot": stride_src_slot,
        "stride_dst_row": dst.stride(0),
    }
    _GATHER_LAUNCHER.launch_by_name(
        plan.grid(num_rows), args, num_warps=plan.num_warps, num_stages=plan.num_stages
    )


def gather_and_maybe_dequant_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None = None,
    config: GatherConfig | None = None,
) -> None:
    """Kernel-level entry (no validation: `vllm_blackwell_ext.ops` validates first).

    `config` overrides the device's launch config (tuning, benchmarks)."""
    plan = plan_kv_gather(
        kv_cache_dtype,
        src_cache.dtype,
        entry_width(src_cache),
        seq_starts is not None,
        device_info(src_cache.device),
        config=config,
    )
    launch_kv_gather(
        plan,
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        seq_starts,
        scale,
        num_rows=num_tokens,
        batch_size=block_table.shape[0],
    )


def cp_gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    config: GatherConfig | None = None,
) -> None:
    """Kernel-level entry of the raw copy (no validation: `vllm_blackwell_ext.ops` validates)."""
    plan = plan_kv_gather(
        None,
        src_cache.dtype,
        entry_width(src_cache),
        seq_starts is not None,
        device_info(src_cache.device),
        config=config,
    )
    launch_kv_gather(
        plan,
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        None,
        seq_starts,
        None,
        num_rows=dst.shape[0],
        batch_size=batch_size,
    )
