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
from vllm_blackwell_ext.kernels.paged_attention.layout import PagedCacheLayout
from vllm_blackwell_ext.kernels.paged_attention.merge_kernel import _split_kv_merge_kernel
from vllm_blackwell_ext.kernels.paged_attention.plan import MAX_SPLITS, AttnPlan, fit_to_workspace
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
        return self.launcher.launch(
            self.grid, self.args, num_warps=self.num_warps, num_stages=self.num_stages,
            max_registers=self.max_registers,
        )  # fmt: skip


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
    def kernel_args(self) -> dict[str, Any]:
        """The attention kernel's arguments this layer fixes, by name (made once)."""
        return {
            "softmax_scale": float(self.softmax_scale),
            "softcap": float(self.softcap),
            "window": int(self.sliding_window or 0),
            "skip_fresh_from": int(self.skip_fresh_from),
            "CAUSAL": bool(self.causal),
            "USE_WINDOW": self.sliding_window is not None,
            "USE_SINKS": self.sinks is not None,
            "USE_SOFTCAP": self.softcap > 0.0,
            "USE_KV_SCALE": self.k_scale is not None,
        }

    @functools.cached_property
    def fixed(self) -> tuple[tuple[str, ...], tuple]:
        """(names, values) of `kernel_args`, as a binder takes them."""
        return tuple(self.kernel_args), tuple(self.kernel_args.values())


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
    if workspace is not None:
        plan = fit_to_workspace(plan, num_tokens, workspace.max_rows)
    cfg, kv_heads = plan.config, plan.shape.num_kv_heads
    num_q_blocks = num_tokens // cfg.block_q + batch  # an upper bound; surplus blocks exit
    if plan.split_kv:
        split = _SplitBuffers.make(plan, q, workspace, num_q_blocks)
    else:
        # placeholders: without SPLIT_KV the kernel never touches them
        split = _SplitBuffers(out, out, out, (0, 0, 0), (0, 0), False)
    if lse_out is not None:
        lse_t, lse_strides = lse_out, lse_out.stride()[:2]
    else:
        lse_t, lse_strides = out, (0, 0)
    # Unused pointer arguments get a tensor the kernel never reads through them.
    dummy = layer.sinks if layer.sinks is not None else layer.k_scale
    if dummy is None:
        dummy = lse_t
    outputs = _Outputs(out, lse_t, lse_strides, dummy)
    args = _attention_args(
        plan, q, layout, cu_seqlens_q, seq_lens, block_table, layer, outputs, split
    )
    grid = (num_q_blocks, kv_heads, plan.num_splits)
    launches = [
        KernelLaunch(
            ATTENTION_LAUNCHER, grid, args, cfg.num_warps, cfg.num_stages, cfg.max_registers
        )
    ]
    if plan.split_kv and not split.merge_in_kernel:
        launches.append(_merge_launch(plan, cu_seqlens_q, batch, layer, outputs, split))
    return launches


class _Outputs(NamedTuple):
    """What a launch writes (`out`, and the LSE output or `out` in its place) and the tensor
    passed for pointers the kernel never reads."""

    out: torch.Tensor
    lse: torch.Tensor
    lse_strides: tuple[int, int]
    dummy: torch.Tensor


def _attention_args(
    plan: AttnPlan,
    q: torch.Tensor,
    layout: PagedCacheLayout,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer: LayerOptions,
    outputs: _Outputs,
    split: _SplitBuffers,
) -> tuple:
    """The attention kernel's arguments in signature order, each given by name."""
    key_cache, value_cache = layout.key_cache, layout.value_cache
    if plan.config.tma_tiles:
        k_desc, v_desc = layout.descriptors(plan.config.tile_n)
    else:
        k_desc = v_desc = None
    out, lse_t, lse_strides, dummy = outputs
    plan_names, plan_values = plan.fixed
    layer_names, layer_values = layer.fixed
    bind = ATTENTION_LAUNCHER.binder(plan_names + layer_names)
    ks, vs, qs, os_ = key_cache.stride(), value_cache.stride(), q.stride(), out.stride()
    po, pl = split.o_strides, split.lse_strides
    return bind(
        plan_values + layer_values,
        q_ptr=q, k_ptr=key_cache, v_ptr=value_cache, out_ptr=out, lse_ptr=lse_t,
        part_o_ptr=split.part_o, part_lse_ptr=split.part_lse, split_count_ptr=split.counts,
        sink_ptr=dummy if layer.sinks is None else layer.sinks,
        k_scale_ptr=dummy if layer.k_scale is None else layer.k_scale,
        v_scale_ptr=dummy if layer.v_scale is None else layer.v_scale,
        cu_q_ptr=cu_seqlens_q, seq_lens_ptr=seq_lens, block_table_ptr=block_table,
        k_desc=k_desc, v_desc=v_desc, batch=seq_lens.shape[0],
        stride_qt=qs[0], stride_qh=qs[1], stride_kb=ks[0], stride_ks=ks[1], stride_kh=ks[2],
        stride_vb=vs[0], stride_vs=vs[1], stride_vh=vs[2], stride_ot=os_[0], stride_oh=os_[1],
        stride_lt=lse_strides[0], stride_lh=lse_strides[1],
        stride_pt=po[0], stride_ph=po[1], stride_ps=po[2], stride_plt=pl[0], stride_plh=pl[1],
        stride_bt=block_table.stride(0), WRITE_LSE=lse_t is not out,
        MERGE_IN_KERNEL=split.merge_in_kernel,
    )  # fmt: skip


class _SplitBuffers(NamedTuple):
    """Where a split launch writes its partials: the first rows of the caller's scratch as
    contiguous [tokens, heads, splits, Dv] and [tokens, heads, splits] (no allocation, not
    even a view), or new tensors for a call without a workspace."""

    part_o: torch.Tensor
    part_lse: torch.Tensor
    counts: torch.Tensor
    o_strides: tuple[int, int, int]
    lse_strides: tuple[int, int]
    merge_in_kernel: bool

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
        o_strides = (heads * splits * head_v, splits * head_v, head_v)
        merge_in_kernel = (
            splits <= plan.config.merge_in_kernel_max_splits
            and num_q_blocks * kv_heads <= counts.shape[0]
        )
        return cls(part_o, part_lse, counts, o_strides, (heads * splits, splits), merge_in_kernel)


def _merge_launch(
    plan: AttnPlan,
    cu_seqlens_q: torch.Tensor,
    batch: int,
    layer: LayerOptions,
    outputs: _Outputs,
    split: _SplitBuffers,
) -> KernelLaunch:
    head_v_pad = plan.constexprs["HEAD_V_PAD"]
    out, lse_t, lse_strides, dummy = outputs
    sinks = layer.sinks if layer.sinks is not None else dummy
    po, pl = split.o_strides, split.lse_strides
    args = MERGE_LAUNCHER.binder()(
        (),
        part_o_ptr=split.part_o, part_lse_ptr=split.part_lse, out_ptr=out, lse_ptr=lse_t,
        sink_ptr=sinks, cu_q_ptr=cu_seqlens_q, batch=batch,
        stride_pt=po[0], stride_ph=po[1], stride_ps=po[2], stride_plt=pl[0], stride_plh=pl[1],
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_lt=lse_strides[0], stride_lh=lse_strides[1], num_splits=plan.num_splits,
        HEAD_V=plan.shape.head_size_v, HEAD_V_PAD=head_v_pad,
        SPLITS_PAD=next_power_of_2(max(plan.num_splits, MAX_SPLITS)),
        USE_SINKS=layer.sinks is not None, WRITE_LSE=lse_t is not out,
    )  # fmt: skip
    return KernelLaunch(
        MERGE_LAUNCHER, (out.shape[0], plan.shape.num_q_heads, 1), args,
        4 if head_v_pad <= 128 else 8, DEFAULT_NUM_STAGES,
    )  # fmt: skip
