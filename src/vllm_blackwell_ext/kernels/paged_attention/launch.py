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
    """One kernel launch as planned: the launcher, grid, arguments by name and options."""

    launcher: CachedLauncher
    grid: tuple[int, int, int]
    args: dict[str, Any]
    num_warps: int
    num_stages: int
    max_registers: int = 0

    def run(self) -> Any:
        """Launch it; returns the compiled handle (None under the interpreter)."""
        return self.launcher.launch_by_name(
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

    Returns the compiled handles launched (empty under the interpreter's None handles).
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
    args = _attention_args(
        plan, q, layout, out, cu_seqlens_q, seq_lens, block_table, layer, lse_out
    )
    if plan.split_kv:
        split = _SplitBuffers.make(plan, q, out, workspace, num_q_blocks)
        args.update(split.args(plan, num_q_blocks * kv_heads))
    else:
        # placeholders: without SPLIT_KV the kernel never touches them
        args.update(_UNSPLIT_ARGS, part_o_ptr=out, part_lse_ptr=out, split_count_ptr=out)
    launches = [
        KernelLaunch(
            ATTENTION_LAUNCHER,
            (num_q_blocks, kv_heads, plan.num_splits),
            args,
            cfg.num_warps,
            cfg.num_stages,
            cfg.max_registers,
        )  # fmt: skip
    ]
    if plan.split_kv and not args["MERGE_IN_KERNEL"]:
        launches.append(_merge_launch(plan, out, cu_seqlens_q, batch, args, split))
    return launches


def _attention_args(
    plan: AttnPlan,
    q: torch.Tensor,
    layout: PagedCacheLayout,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer: LayerOptions,
    lse_out: torch.Tensor | None,
) -> dict[str, Any]:
    """The attention kernel's arguments but for the split scratch."""
    key_cache, value_cache = layout.key_cache, layout.value_cache
    if plan.config.tma_tiles:
        k_desc, v_desc = layout.descriptors(plan.config.tile_n)
    else:
        k_desc = v_desc = None
    if lse_out is not None:
        lse_t, (stride_lt, stride_lh) = lse_out, lse_out.stride()[:2]
    else:
        lse_t, stride_lt, stride_lh = out, 0, 0
    # Unused pointer arguments get a tensor the kernel never reads through them.
    dummy = layer.sinks if layer.sinks is not None else layer.k_scale
    if dummy is None:
        dummy = lse_t
    ks, vs, qs, os_ = key_cache.stride(), value_cache.stride(), q.stride(), out.stride()
    return {
        **plan.kernel_args,
        **layer.kernel_args,
        "q_ptr": q, "k_ptr": key_cache, "v_ptr": value_cache, "out_ptr": out, "lse_ptr": lse_t,
        "sink_ptr": dummy if layer.sinks is None else layer.sinks,
        "k_scale_ptr": dummy if layer.k_scale is None else layer.k_scale,
        "v_scale_ptr": dummy if layer.v_scale is None else layer.v_scale,
        "cu_q_ptr": cu_seqlens_q, "seq_lens_ptr": seq_lens, "block_table_ptr": block_table,
        "k_desc": k_desc, "v_desc": v_desc, "batch": seq_lens.shape[0],
        "stride_qt": qs[0], "stride_qh": qs[1],
        "stride_kb": ks[0], "stride_ks": ks[1], "stride_kh": ks[2],
        "stride_vb": vs[0], "stride_vs": vs[1], "stride_vh": vs[2],
        "stride_ot": os_[0], "stride_oh": os_[1], "stride_lt": stride_lt, "stride_lh": stride_lh,
        "stride_bt": block_table.stride(0),
        "WRITE_LSE": lse_out is not None,
    }  # fmt: skip


# The split scratch's arguments of an unsplit launch, but for its placeholder tensors.
_UNSPLIT_ARGS: dict[str, Any] = {
    "stride_pt": 0, "stride_ph": 0, "stride_ps": 0, "stride_plt": 0, "stride_plh": 0,
    "MERGE_IN_KERNEL": False,
}  # fmt: skip


class _SplitBuffers(NamedTuple):
    """Where a split launch writes its partials: the first rows of the caller's scratch as
    contiguous [tokens, heads, splits, Dv] and [tokens, heads, splits] (no allocation, not
    even a view), or new tensors for a call without a workspace."""

    part_o: torch.Tensor
    part_lse: torch.Tensor
    counts: torch.Tensor
    o_strides: tuple[int, int, int]
    lse_strides: tuple[int, int]

    @classmethod
    def make(
        cls, plan: AttnPlan, q: torch.Tensor, out: torch.Tensor,
        workspace: SplitKVWorkspace | None, num_q_blocks: int,
    ) -> _SplitBuffers:  # fmt: skip
        tokens, heads = q.shape[0], q.shape[1]
        splits, head_v = plan.num_splits, plan.shape.head_size_v
        if workspace is None:
            f32 = {"dtype": torch.float32, "device": q.device}
            part_o = torch.empty((tokens, heads, splits, head_v), **f32)
            part_lse = torch.empty((tokens, heads, splits), **f32)
            kv_heads = plan.shape.num_kv_heads
            counts = torch.zeros(num_q_blocks * kv_heads, dtype=torch.int32, device=q.device)
        else:
            part_o, part_lse = workspace.partial_out, workspace.partial_lse
            counts = workspace.split_counts
        o_strides = (heads * splits * head_v, splits * head_v, head_v)
        return cls(part_o, part_lse, counts, o_strides, (heads * splits, splits))

    def args(self, plan: AttnPlan, num_counts: int) -> dict[str, Any]:
        merge_in_kernel = (
            plan.num_splits <= plan.config.merge_in_kernel_max_splits
            and num_counts <= self.counts.shape[0]
        )
        return {
            "part_o_ptr": self.part_o, "part_lse_ptr": self.part_lse,
            "split_count_ptr": self.counts,
            "stride_pt": self.o_strides[0], "stride_ph": self.o_strides[1],
            "stride_ps": self.o_strides[2],
            "stride_plt": self.lse_strides[0], "stride_plh": self.lse_strides[1],
            "MERGE_IN_KERNEL": merge_in_kernel,
        }  # fmt: skip


def _merge_launch(
    plan: AttnPlan,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    batch: int,
    attn_args: dict[str, Any],
    split: _SplitBuffers,
) -> KernelLaunch:
    head_v_pad = plan.constexprs["HEAD_V_PAD"]
    a = attn_args
    args = {
        "part_o_ptr": split.part_o, "part_lse_ptr": split.part_lse, "out_ptr": out,
        "lse_ptr": a["lse_ptr"], "sink_ptr": a["sink_ptr"], "cu_q_ptr": cu_seqlens_q,
        "batch": batch,
        "stride_pt": a["stride_pt"], "stride_ph": a["stride_ph"], "stride_ps": a["stride_ps"],
        "stride_plt": a["stride_plt"], "stride_plh": a["stride_plh"],
        "stride_ot": a["stride_ot"], "stride_oh": a["stride_oh"],
        "stride_lt": a["stride_lt"], "stride_lh": a["stride_lh"],
        "num_splits": plan.num_splits,
        "HEAD_V": plan.shape.head_size_v, "HEAD_V_PAD": head_v_pad,
        "SPLITS_PAD": next_power_of_2(max(plan.num_splits, MAX_SPLITS)),
        "USE_SINKS": a["USE_SINKS"], "WRITE_LSE": a["WRITE_LSE"],
    }  # fmt: skip
    return KernelLaunch(
        MERGE_LAUNCHER, (out.shape[0], plan.shape.num_q_heads, 1), args,
        4 if head_v_pad <= 128 else 8, DEFAULT_NUM_STAGES,
    )  # fmt: skip
