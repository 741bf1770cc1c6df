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

from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from vllm_blackwell_ext.kernels.paged_attention.kernel import _paged_attn_kernel
from vllm_blackwell_ext.kernels.paged_attention.layout import CACHE_ARG_NAMES, PagedCacheLayout
from vllm_blackwell_ext.kernels.paged_attention.merge_kernel import _split_kv_merge_kernel
from vllm_blackwell_ext.kernels.paged_attention.plan import (
    MERGE_PLAN_ARG_NAMES,
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
    launches = planned_launches(
        plan, q, layout, out, cu_seqlens_q, seq_lens, block_table, layer,
        workspace=workspace, lse_out=lse_out,
    )  # fmt: skip
    return [launch.run() for launch in launches]


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
    num_tokens, batch = q.shape[0], seq_lens.shape[0]
    if num_tokens == 0 or batch == 0 or plan.max_seqlen_q == 0:
        return []
    if workspace is not None and plan.num_splits > 1:
        plan = fit_to_workspace(plan, num_tokens, workspace.max_rows)
    cfg = plan.config
    num_q_blocks = num_tokens // cfg.block_q + batch  # an upper bound; surplus blocks exit
    if plan.num_splits == 1:
        # placeholders: without SPLIT_KV the kernel never touches them
        partials, counters = (out, out, 0, 0, 0, 0, 0), (out, False)
    else:
        partials, counters = _split_buffers(plan, q, workspace, num_q_blocks)
    outputs = _outputs(out, lse_out)
    # Unused pointer arguments get a tensor the kernel never reads through them.
    sinks, k_scale, v_scale = layer.sinks, layer.k_scale, layer.v_scale
    dummy = sinks if sinks is not None else k_scale if k_scale is not None else outputs[1]
    scales = (
        dummy if sinks is None else sinks,
        dummy if k_scale is None else k_scale,
        dummy if v_scale is None else v_scale,
    )
    stride_qt, stride_qh = q.stride()[:2]
    attention_args = _BIND_ATTENTION(
        plan.kernel_args, layer.kernel_args,
        layout.kernel_args(cfg.tile_n if cfg.tma_tiles else 0), partials, counters,
        # BATCH_ARG_NAMES
        (cu_seqlens_q, seq_lens, block_table, batch, block_table.stride(0)),
        scales, outputs, q_ptr=q, stride_qt=stride_qt, stride_qh=stride_qh,
    )  # fmt: skip
    launches = [
        KernelLaunch(
            ATTENTION_LAUNCHER, (num_q_blocks, plan.shape.num_kv_heads, plan.num_splits),
            attention_args, cfg.num_warps, cfg.num_stages, cfg.max_registers,
        )
    ]  # fmt: skip
    merge_in_kernel = counters[1]
    if plan.num_splits > 1 and not merge_in_kernel:
        merge_args = _BIND_MERGE(
            plan.merge_kernel_args, partials, outputs, cu_q_ptr=cu_seqlens_q,
            batch=batch, sink_ptr=scales[0], USE_SINKS=sinks is not None,
        )  # fmt: skip
        launches.append(
            KernelLaunch(
                MERGE_LAUNCHER, (num_tokens, plan.shape.num_q_heads, 1), merge_args,
                plan.merge_num_warps, DEFAULT_NUM_STAGES,
            )
        )  # fmt: skip
    return launches


def _split_buffers(
    plan: AttnPlan, q: torch.Tensor, workspace: SplitKVWorkspace | None, num_q_blocks: int
) -> tuple[tuple, tuple[torch.Tensor, bool]]:
    """A split launch's scratch, as the groups `PARTIAL_ARG_NAMES` and `COUNTER_ARG_NAMES`:
    where its splits write their partials and the merge reads them (the first rows of the
    caller's scratch as contiguous [tokens, heads, splits, Dv] and [tokens, heads, splits]: no
    allocation, not even a view; new tensors for a call without a workspace), and the counters
    of finished splits with which the last split of a (query block, KV head) merges them."""
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
    partials = (
        part_o, part_lse, heads * splits * head_v, splits * head_v, head_v, heads * splits,
        splits,
    )  # fmt: skip
    return partials, (counts, merge_in_kernel)


def _outputs(out: torch.Tensor, lse_out: torch.Tensor | None) -> tuple:
    """The call's outputs as the group `OUTPUT_ARG_NAMES` of both kernels; without an LSE
    output, `out` stands in for the pointer the kernels never write through."""
    stride_ot, stride_oh = out.stride()[:2]
    if lse_out is None:
        return out, out, stride_ot, stride_oh, 0, 0, False
    stride_lt, stride_lh = lse_out.stride()[:2]
    return out, lse_out, stride_ot, stride_oh, stride_lt, stride_lh, True


# The batch's metadata tensors, and the layer's per-head / per-tensor scales (a tensor the
# kernel never reads through them where the layer has none), as `planned_launches` passes them.
BATCH_ARG_NAMES = ("cu_q_ptr", "seq_lens_ptr", "block_table_ptr", "batch", "stride_bt")
SCALE_ARG_NAMES = ("sink_ptr", "k_scale_ptr", "v_scale_ptr")
# A split launch's partials (both kernels) and its counters of finished splits.
PARTIAL_ARG_NAMES = (
    "part_o_ptr", "part_lse_ptr", "stride_pt", "stride_ph", "stride_ps", "stride_plt",
    "stride_plh",
)  # fmt: skip
COUNTER_ARG_NAMES = ("split_count_ptr", "MERGE_IN_KERNEL")
# The call's outputs (both kernels).
OUTPUT_ARG_NAMES = (
    "out_ptr", "lse_ptr", "stride_ot", "stride_oh", "stride_lt", "stride_lh", "WRITE_LSE",
)  # fmt: skip
# The kernels' arguments by name: groups made where their values are fixed (the batch's plan,
# the layer, the cache pair, the split buffers, the batch's metadata, the layer's scales, the
# call's outputs), each value given with its group's names; the rest by keyword.
_BIND_ATTENTION = ATTENTION_LAUNCHER.binder(
    PLAN_ARG_NAMES, LAYER_ARG_NAMES, CACHE_ARG_NAMES, PARTIAL_ARG_NAMES, COUNTER_ARG_NAMES,
    BATCH_ARG_NAMES, SCALE_ARG_NAMES, OUTPUT_ARG_NAMES,
)  # fmt: skip
_BIND_MERGE = MERGE_LAUNCHER.binder(MERGE_PLAN_ARG_NAMES, PARTIAL_ARG_NAMES, OUTPUT_ARG_NAMES)
