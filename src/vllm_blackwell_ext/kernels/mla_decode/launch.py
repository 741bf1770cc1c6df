"""Launch an `MlaDecodePlan`: the split kernel of its variant, then the merge of its splits.

`launch_mla_decode(plan, tensors...)` validates nothing (the plan's maker did: `checks`),
allocates nothing when given a workspace, and never waits on the GPU: it builds each kernel's
arguments by name, starting from the plan's constant part (`MlaDecodePlan.split_constants`,
made once per plan) and adding the tensors, their strides and the softmax scale.
`mla_decode_launches` gives the same launches without running them (offline compile checks).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from vllm_blackwell_ext.kernels.mla_decode import gluon_kernel
from vllm_blackwell_ext.kernels.mla_decode.layout import (
    GLUON_NUM_WARPS,
    MlaCacheLayout,
    gluon_cache_descriptors,
    gluon_query_descriptors,
    tma_descriptors,
)
from vllm_blackwell_ext.kernels.mla_decode.merge_kernel import _mla_decode_merge_kernel
from vllm_blackwell_ext.kernels.mla_decode.plan import MlaDecodePlan, scale_log2
from vllm_blackwell_ext.kernels.mla_decode.split_fp8_kernel import _mla_decode_split_fp8_kernel
from vllm_blackwell_ext.kernels.mla_decode.split_kernel import _mla_decode_split_kernel
from vllm_blackwell_ext.kernels.mla_decode.workspace import MlaDecodeWorkspace

Tensor = torch.Tensor

_SPLIT_LAUNCHER = CachedLauncher(_mla_decode_split_kernel)
_SPLIT_FP8_LAUNCHER = CachedLauncher(_mla_decode_split_fp8_kernel)
_MERGE_LAUNCHER = CachedLauncher(_mla_decode_merge_kernel)


class KernelLaunch(NamedTuple):
    """One kernel launch of a plan, not run: what offline compile checks need."""

    kernel: Any  # the @triton.jit / @gluon.jit function
    grid: tuple[int, int, int]
    kwargs: dict[str, Any]  # every parameter by name
    num_warps: int
    num_stages: int | None  # None: Triton's default


def _partials(
    plan: MlaDecodePlan, out: torch.Tensor, workspace: MlaDecodeWorkspace | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o_part, l_part): the workspace's first rows, addressed as contiguous [T, H, S, R] and
    [T, H, S] through the plan's strides (no views: eager launches pay host time per view);
    `out` as an unused placeholder for one split."""
    if plan.single_split:
        return out, out
    if workspace is None:
        workspace = MlaDecodeWorkspace.allocate(
            plan.num_tokens, plan.num_heads, plan.num_splits, plan.kv_lora_rank, out.device
        )
    return workspace.o_part, workspace.l_part


def _split_kwargs(
    plan: MlaDecodePlan, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor, out: Tensor,
    softmax_scale: float, k_scale: Tensor | None, lse_out: Tensor | None, o_part: Tensor,
    l_part: Tensor,
) -> dict[str, Any]:  # fmt: skip
    """The arguments every split variant takes, by name (tensors, strides, flags)."""
    args = dict(plan.split_constants)
    args.update(
        BT=block_table, SEQ=seq_lens, KSCALE=out if k_scale is None else k_scale,
        O_PART=o_part, L_PART=l_part, OUT=out, LSE=out if lse_out is None else lse_out,
        stride_bt=block_table.stride(0), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_lse_t=0 if lse_out is None else lse_out.stride(0),
        qk_scale_log2=scale_log2(softmax_scale), PAGE_SIZE=kv_cache.shape[1],
        HAS_SCALE=k_scale is not None, HAS_LSE=lse_out is not None,
    )  # fmt: skip
    return args


def _triton_split_kwargs(
    plan: MlaDecodePlan, q: Tensor, kv_cache: Tensor, cache_layout: MlaCacheLayout | None,
    args: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """`args` plus what the Triton split kernels add: q and the cache, their strides, and the
    TMA descriptors of the 16-bit kernel (None where it gathers)."""
    args.update(
        Q=q, KV=kv_cache, stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_kv_page=kv_cache.stride(0), stride_kv_tok=kv_cache.stride(1),
    )  # fmt: skip
    if plan.variant == "triton_tma":
        block_n, rank = plan.config.block_n, plan.kv_lora_rank
        if cache_layout is not None:
            descs = cache_layout.descriptors(block_n, rank)
        else:
            descs = tma_descriptors(kv_cache, block_n, rank)
        args["KL_DESC"], args["KR_DESC"] = descs
    elif plan.variant == "triton":
        args["KL_DESC"] = args["KR_DESC"] = None
    return args


def _gluon_split_kwargs(
    q: Tensor, kv_cache: Tensor, cache_layout: MlaCacheLayout | None, args: dict[str, Any]
) -> dict[str, Any]:
    """`args` plus the Gluon kernel's query and cache descriptors."""
    q_descs = gluon_query_descriptors(q)
    if cache_layout is not None:
        kv_descs = cache_layout.gluon_descriptors()
    else:
        kv_descs = gluon_cache_descriptors(kv_cache)
    args["q_lat_desc"], args["q_rope_desc"] = q_descs
    args["kv_lat_desc"], args["kv_rope_desc"] = kv_descs
    return args


def _split_launch(
    plan: MlaDecodePlan, q: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
    out: Tensor, softmax_scale: float, k_scale: Tensor | None, lse_out: Tensor | None,
    o_part: Tensor, l_part: Tensor, cache_layout: MlaCacheLayout | None,
) -> KernelLaunch:  # fmt: skip
    """The split stage of the plan's variant."""
    args = _split_kwargs(plan, kv_cache, block_table, seq_lens, out, softmax_scale, k_scale,
                         lse_out, o_part, l_part)  # fmt: skip
    if plan.variant == "gluon":
        args = _gluon_split_kwargs(q, kv_cache, cache_layout, args)
        kernel = gluon_kernel._mla_decode_gluon_kernel
        return KernelLaunch(kernel, plan.grid, args, GLUON_NUM_WARPS, None)
    args = _triton_split_kwargs(plan, q, kv_cache, cache_layout, args)
    kernel = (
        _mla_decode_split_fp8_kernel if plan.variant == "triton_fp8" else _mla_decode_split_kernel
    )
    cfg = plan.config
    return KernelLaunch(kernel, plan.grid, args, cfg.num_warps, cfg.num_stages)


def _merge_launch(
    plan: MlaDecodePlan, seq_lens: Tensor, out: Tensor, lse_out: Tensor | None, o_part: Tensor,
    l_part: Tensor,
) -> KernelLaunch:  # fmt: skip
    """The merge of the plan's splits."""
    args = dict(plan.merge_constants)
    args.update(
        O_PART=o_part, L_PART=l_part, OUT=out, LSE=out if lse_out is None else lse_out,
        SEQ=seq_lens, stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_lse_t=0 if lse_out is None else lse_out.stride(0), HAS_LSE=lse_out is not None,
    )  # fmt: skip
    warps = plan.merge[2]
    return KernelLaunch(_mla_decode_merge_kernel, plan.merge_grid, args, warps, DEFAULT_NUM_STAGES)


def mla_decode_launches(
    plan: MlaDecodePlan,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    softmax_scale: float,
    k_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: MlaDecodeWorkspace | None = None,
    cache_layout: MlaCacheLayout | None = None,
) -> list[KernelLaunch]:
    """The launches `launch_mla_decode` runs for these arguments (split, then the merge of a
    plan with several splits), without running them."""
    o_part, l_part = _partials(plan, out, workspace)
    launches = [
        _split_launch(plan, q, kv_cache, block_table, seq_lens, out, softmax_scale, k_scale,
                      lse_out, o_part, l_part, cache_layout)
    ]  # fmt: skip
    if not plan.single_split:
        launches.append(_merge_launch(plan, seq_lens, out, lse_out, o_part, l_part))
    return launches


# By the kernel's id: each Triton kernel's cached launcher.
_LAUNCHERS = {id(launcher.kernel): launcher
              for launcher in (_SPLIT_LAUNCHER, _SPLIT_FP8_LAUNCHER, _MERGE_LAUNCHER)}  # fmt: skip


def _run(launch: KernelLaunch) -> Any:
    """Run one launch: Triton kernels through their cached launcher, the Gluon kernel (one
    launch per layer and step, its handle cached by Triton) through its own binder."""
    launcher = _LAUNCHERS.get(id(launch.kernel))
    if launcher is None:
        return launch.kernel[launch.grid](**launch.kwargs, num_warps=launch.num_warps)
    return launcher.launch_by_name(
        launch.grid, launch.kwargs, num_warps=launch.num_warps, num_stages=launch.num_stages
    )


def launch_mla_decode(
    plan: MlaDecodePlan,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    softmax_scale: float,
    k_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: MlaDecodeWorkspace | None = None,
    cache_layout: MlaCacheLayout | None = None,
) -> Any:
    """Run `plan` over these tensors; returns the split kernel's compiled handle (None under
    the interpreter). q, kv_cache, block_table, seq_lens, out, k_scale, lse_out: as
    `mla_decode` takes them, of the plan's shapes and dtypes; `workspace`: scratch holding
    `plan.workspace_rows` (allocated here when None and the plan splits); `cache_layout`:
    `mla_cache_layout(kv_cache)`, made once by callers that keep it (descriptors reused)."""
    if plan.num_tokens == 0:
        return None
    launches = mla_decode_launches(
        plan, q, kv_cache, block_table, seq_lens, out, softmax_scale=softmax_scale,
        k_scale=k_scale, lse_out=lse_out, workspace=workspace, cache_layout=cache_layout,
    )  # fmt: skip
    handle = _run(launches[0])
    for launch in launches[1:]:
        _run(launch)
    return handle
