"""Launch a paged-attention plan: kernel arguments by name, no validation, no planning.

`launch_paged_attention(plan, tensors...)` runs what `plan.plan_paged_attention` decided.
With a workspace nothing here allocates or reads device memory on the host, so an attention
backend's forward can launch it inside a CUDA graph. `planned_launches` returns the same
launches without running them (offline compile checks).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from vllm_blackwell_ext.kernels.host_ints import next_power_of_2
from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from vllm_blackwell_ext.kernels.paged_attention.kernel import _paged_attn_kernel
from vllm_blackwell_ext.kernels.paged_attention.layout import CACHE_ARG_NAMES, PagedCacheLayout
from vllm_blackwell_ext.kernels.paged_attention.merge_kernel import _split_kv_merge_kernel
from vllm_blackwell_ext.kernels.paged_attention.plan import (
    MAX_SPLITS,
    PLAN_ARG_NAMES,
    AttnPlan,
    fit_to_workspace,
)
from vllm_blackwell_ext.kernels.paged_attention.workspace import SplitKVWorkspace

ATTENTION_LAUNCHER = CachedLauncher(_paged_attn_kernel)
MERGE_LAUNCHER = CachedLauncher(_split_kv_merge_kernel)


class KernelLaunch(NamedTuple):
    """One kernel launch as planned: the launcher, grid, arguments in signature order (named
    by `named()`) and options."""

    launcher: CachedLauncher
    grid: tuple[int, int, int]
    args: tuple
    num_warps: int
    num_stages: int
    max_registers: int = 0

    def named(self) -> dict[str, Any]:
        """The arguments by parameter name."""
        return dict(zip(self.launcher.arg_names, self.args, strict=True))

    def run(self) -> Any:
        """Launch it; returns the compiled handle (None under the interpreter)."""
        launcher, grid, args, num_warps, num_stages, max_registers = self
        return launcher.launch(
            grid, args, num_warps=num_warps, num_stages=num_stages, max_registers=max_registers
        )


@dataclass(frozen=True)
class LayerOptions:
    """A layer's side of a launch: what its attention computes besides the batch's plan."""

    softmax_scale: float
    causal: bool = True
    sliding_window: int | None = None
    softcap: float = 0.0
    sinks: torch.Tensor | None = None  # fp32 [num_q_heads]
    k_scale: torch.Tensor | None = None  # fp32 [1], fp8 caches
    v_scale: torch.Tensor | None = None
    # > 0: requests without cached context of this many queries are `fresh_prefill`'s.
    skip_fresh_from: int = 0

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The values of the attention kernel's arguments `LAYER_ARG_NAMES` (made once)."""
        return (
            float(self.softmax_scale), float(self.softcap), int(self.sliding_window or 0),
            int(self.skip_fresh_from), bool(self.causal), self.sliding_window is not None,
            self.sinks is not None, self.softcap > 0.0, self.k_scale is not None,
        )  # fmt: skip


# The attention kernel's arguments a layer fixes, as `LayerOptions.kernel_args` holds them.
LAYER_ARG_NAMES = (
    "softmax_scale", "softcap", "window", "skip_fresh_from",
    "CAUSAL", "USE_WINDOW", "USE_SINKS", "USE_SOFTCAP", "USE_KV_SCALE",
)  # fmt: skip


def launch_paged_attention(
    plan: AttnPlan,
    q: torch.Tensor,
    layout: PagedCacheLayout,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer: LayerOptions,
    *,
    workspace: SplitKVWorkspace | None = None,
    lse_out: torch.Tensor | None = None,
) -> list:
    """Attention of `q` over `layout`'s caches as `plan` says; writes `out` (and `lse_out`).

    Returns the compiled handles launched (None for each under the interpreter).
    """
    attention = _attention_launch(
        plan, q, layout, out, cu_seqlens_q, seq_lens, block_table, layer, workspace, lse_out
    )
    if attention is None:
        return []
    grid, args, plan, split = attention
    cfg = plan.config
    handle = ATTENTION_LAUNCHER.launch(
        grid, args, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        max_registers=cfg.max_registers,
    )  # fmt: skip
    if plan.num_splits == 1 or split.MERGE_IN_KERNEL:
        return [handle]
    merge = _merge_launch(plan, cu_seqlens_q, seq_lens.shape[0], layer, out, lse_out, split)
    return [handle, merge.run()]


def planned_launches(
    plan: AttnPlan,
    q: torch.Tensor,
    layout: PagedCacheLayout,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer: LayerOptions,
    *,
    workspace: SplitKVWorkspace | None = None,
    lse_out: torch.Tensor | None = None,
) -> list[KernelLaunch]:
    """The launches of `launch_paged_attention`, not run: the attention kernel, and the merge
    kernel where a split launch does not merge in the kernel."""
    attention = _attention_launch(
        plan, q, layout, out, cu_seqlens_q, seq_lens, block_table, layer, workspace, lse_out
    )
    if attention is None:
        return []
    grid, args, plan, split = attention
    cfg = plan.config
    launches = [
        KernelLaunch(
            ATTENTION_LAUNCHER, grid, args, cfg.num_warps, cfg.num_stages, cfg.max_registers
        )
    ]
    if plan.num_splits > 1 and not split.MERGE_IN_KERNEL:
        batch = seq_lens.shape[0]
        launches.append(_merge_launch(plan, cu_seqlens_q, batch, layer, out, lse_out, split))
    return launches


def _attention_launch(
    plan: AttnPlan,
    q: torch.Tensor,
    layout: PagedCacheLayout,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer: LayerOptions,
    workspace: SplitKVWorkspace | None,
    lse_out: torch.Tensor | None,
) -> tuple[tuple[int, int, int], tuple, AttnPlan, _SplitBuffers] | None:
    """The attention kernel's grid and arguments, the plan fitted to the workspace and the
    split buffers; None where there is nothing to compute."""
    num_tokens, batch = q.shape[0], seq_lens.shape[0]
    if num_tokens == 0 or batch == 0 or plan.max_seqlen_q == 0:
        return None
    if workspace is not None and plan.num_splits > 1:
        plan = fit_to_workspace(plan, num_tokens, workspace.max_rows)
    cfg = plan.config
    num_q_blocks = num_tokens // cfg.block_q + batch  # an upper bound; surplus blocks exit
    if plan.num_splits > 1:
        split = _SplitBuffers.make(plan, q, workspace, num_q_blocks)
    else:
        # placeholders: without SPLIT_KV the kernel never touches them
        split = _SplitBuffers(out, out, out, 0, 0, 0, 0, 0, False)
    if lse_out is None:
        lse, stride_lt, stride_lh = out, 0, 0
    else:
        lse, (stride_lt, stride_lh) = lse_out, lse_out.stride()[:2]
    # Unused pointer arguments get a tensor the kernel never reads through them.
    sinks, k_scale, v_scale = layer.sinks, layer.k_scale, layer.v_scale
    dummy = sinks if sinks is not None else k_scale if k_scale is not None else lse
    (stride_qt, stride_qh), (stride_ot, stride_oh) = q.stride()[:2], out.stride()[:2]
    args = _BIND_ATTENTION(
        plan.kernel_args, layer.kernel_args,
        layout.kernel_args(cfg.tile_n if cfg.tma_tiles else 0), split,
        # BATCH_ARG_NAMES
        (cu_seqlens_q, seq_lens, block_table, batch, block_table.stride(0)),
        # SCALE_ARG_NAMES
        (
            dummy if sinks is None else sinks,
            dummy if k_scale is None else k_scale,
            dummy if v_scale is None else v_scale,
        ),
        q_ptr=q, out_ptr=out, lse_ptr=lse, stride_qt=stride_qt, stride_qh=stride_qh,
        stride_ot=stride_ot, stride_oh=stride_oh, stride_lt=stride_lt, stride_lh=stride_lh,
        WRITE_LSE=lse_out is not None,
    )  # fmt: skip
    return (num_q_blocks, plan.shape.num_kv_heads, plan.num_splits), args, plan, split


class _SplitBuffers(NamedTuple):
    """Where a split launch writes its partials, as the attention kernel's arguments of those
    names: the first rows of the caller's scratch as contiguous [tokens, heads, splits, Dv]
    and [tokens, heads, splits] (no allocation, not even a view), or new tensors for a call
    without a workspace."""

    part_o_ptr: torch.Tensor
    part_lse_ptr: torch.Tensor
    split_count_ptr: torch.Tensor
    stride_pt: int
    stride_ph: int
    stride_ps: int
    stride_plt: int
    stride_plh: int
    MERGE_IN_KERNEL: bool

    @classmethod
    def make(
        cls, plan: AttnPlan, q: torch.Tensor, workspace: SplitKVWorkspace | None,
        num_q_blocks: int,
    ) -> _SplitBuffers:  # fmt: skip
        tokens, heads = q.shape[0], q.shape[1]
        splits, head_v = plan.num_splits, plan.shape.head_size_v
        kv_heads = plan.shape.num_kv_heads
        if workspace is None:
            f32 = {"dtype": torch.float32, "device": q.device}
            part_o = torch.empty((tokens, heads, splits, head_v), **f32)
            part_lse = torch.empty((tokens, heads, splits), **f32)
            counts = torch.zeros(num_q_blocks * kv_heads, dtype=torch.int32, device=q.device)
        else:
            part_o, part_lse = workspace.partial_out, workspace.partial_lse
            counts = workspace.split_counts
        merge_in_kernel = (
            splits <= plan.config.merge_in_kernel_max_splits
            and num_q_blocks * kv_heads <= counts.shape[0]
        )
        return cls(
            part_o, part_lse, counts, heads * splits * head_v, splits * head_v, head_v,
            heads * splits, splits, merge_in_kernel,
        )  # fmt: skip


# The batch's metadata tensors, and the layer's per-head / per-tensor scales (a tensor the
# kernel never reads through them where the layer has none), as `planned_launches` passes them.
BATCH_ARG_NAMES = ("cu_q_ptr", "seq_lens_ptr", "block_table_ptr", "batch", "stride_bt")
SCALE_ARG_NAMES = ("sink_ptr", "k_scale_ptr", "v_scale_ptr")
# The attention kernel's arguments by name: groups made where their values are fixed (the
# batch's plan, the layer, the cache pair, the split buffers, the batch's metadata, the
# layer's scales), each value given with its group's names; the query and outputs by keyword.
_BIND_ATTENTION = ATTENTION_LAUNCHER.binder(
    PLAN_ARG_NAMES, LAYER_ARG_NAMES, CACHE_ARG_NAMES, _SplitBuffers._fields, BATCH_ARG_NAMES,
    SCALE_ARG_NAMES,
)  # fmt: skip


def _merge_launch(
    plan: AttnPlan,
    cu_seqlens_q: torch.Tensor,
    batch: int,
    layer: LayerOptions,
    out: torch.Tensor,
    lse_out: torch.Tensor | None,
    split: _SplitBuffers,
) -> KernelLaunch:
    head_v_pad = plan.constexprs["HEAD_V_PAD"]
    lse, lse_strides = (out, (0, 0)) if lse_out is None else (lse_out, lse_out.stride()[:2])
    args = MERGE_LAUNCHER.binder()(
        part_o_ptr=split.part_o_ptr, part_lse_ptr=split.part_lse_ptr, out_ptr=out, lse_ptr=lse,
        sink_ptr=next(t for t in (layer.sinks, layer.k_scale, lse) if t is not None),
        cu_q_ptr=cu_seqlens_q,
        batch=batch, stride_pt=split.stride_pt, stride_ph=split.stride_ph,
        stride_ps=split.stride_ps, stride_plt=split.stride_plt, stride_plh=split.stride_plh,
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_lt=lse_strides[0], stride_lh=lse_strides[1], num_splits=plan.num_splits,
        HEAD_V=plan.shape.head_size_v, HEAD_V_PAD=head_v_pad,
        SPLITS_PAD=next_power_of_2(max(plan.num_splits, MAX_SPLITS)),
        USE_SINKS=layer.sinks is not None, WRITE_LSE=lse_out is not None,
    )  # fmt: skip
    return KernelLaunch(
        MERGE_LAUNCHER, (out.shape[0], plan.shape.num_q_heads, 1), args,
        4 if head_v_pad <= 128 else 8, DEFAULT_NUM_STAGES,
    )  # fmt: skip
