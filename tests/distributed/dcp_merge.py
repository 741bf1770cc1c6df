"""Decode-context-parallel (DCP) merge of per-rank attention partials. Pure torch, no vLLM.

Under DCP every rank attends over its shard of each sequence's KV cache (`mla_decode` with
``lse_out``) and holds a partial output ``o_r`` [T, H, D] normalised over its own keys and its
natural-log LSE ``l_r`` [T, H]. The full-context output is

    o = sum_r exp(l_r - L) * o_r,   L = logsumexp_r l_r,

computed as vLLM 0.32 does it (``vllm/v1/attention/ops/dcp.py``, ``cp_lse_ag_out_rs``): the LSEs
are all-gathered over the DCP group, each rank rescales its own output by ``exp(l_r - L)``
(`correct_attn_out`), and a reduce-scatter over the head dimension sums the rescaled outputs, each
rank keeping heads ``[rank * H / N, (rank + 1) * H / N)``.

A row that no rank holds a key of (every ``l_r`` is -inf) gets output 0 and LSE -inf, never NaN:
the max-shift uses 0 instead of -inf and every weight is then exp(-inf) = 0. NaN or +inf LSEs
are treated as -inf (an empty shard), as vLLM's kernel does.

`dcp_merge` runs the collectives over a `torch.distributed` process group (NCCL or gloo);
`dcp_merge_reference` is the same algebra in one process over all ranks' partials, the oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _sanitize_lse(lses: torch.Tensor) -> torch.Tensor:
    lses = lses.to(torch.float32)
    return torch.where(torch.isnan(lses) | (lses == float("inf")), float("-inf"), lses)


def global_lse(lses: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` over dim 0 of ``[N, T, H]`` natural-log LSEs; -inf where all are -inf."""
    lses = _sanitize_lse(lses)
    m = lses.amax(dim=0)
    m_safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    total = torch.exp(lses - m_safe).sum(dim=0)
    return torch.where(total > 0, m_safe + torch.log(total), torch.full_like(m, float("-inf")))


def correct_attn_out(
    out: torch.Tensor, lses: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s output rescaled by ``exp(lses[rank] - L)`` (fp32 math, `out`'s dtype), and L.

    out: [T, H, D] this rank's partial; lses: [N, T, H] every rank's natural-log LSE.
    """
    if out.dim() != 3:
        raise ValueError(f"out: expected [num_tokens, num_heads, head_dim], got {tuple(out.shape)}")
    if lses.dim() != 3 or lses.shape[1:] != out.shape[:2]:
        raise ValueError(
            f"lses: expected [world_size, {out.shape[0]}, {out.shape[1]}], got {tuple(lses.shape)}"
        )
    if not 0 <= rank < lses.shape[0]:
        raise ValueError(f"rank: expected an int in [0, {lses.shape[0]}), got {rank!r}")
    lse = global_lse(lses)
    mine = _sanitize_lse(lses[rank])
    # exp(-inf - x) = 0 for an empty shard; rows where L is -inf too get weight 0, not NaN.
    empty = torch.isneginf(lse)
    lse_safe = torch.where(empty, torch.zeros_like(lse), lse)
    weight = torch.where(empty, torch.zeros_like(lse), torch.exp(mine - lse_safe))
    return (out.to(torch.float32) * weight.unsqueeze(-1)).to(out.dtype), lse


# torch >= 2.13 names the flat collectives *_single and deprecates the *_tensor names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_stacked(t: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's `t` (same shape everywhere), stacked: ``[N, *t.shape]``. Collective."""
    world_size = dist.get_world_size(group)
    t = t.contiguous()
    # The concatenated form ([N * d0, ...]) is the one every backend accepts (gloo refuses the
    # stacked output shape).
    flat = torch.empty((world_size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    _all_gather_flat(flat, t, group=group)
    return flat.view(world_size, *t.shape)


def _check_group_args(out: torch.Tensor, lse: torch.Tensor, world_size: int) -> None:
    if out.dim() != 3:
        raise ValueError(f"out: expected [num_tokens, num_heads, head_dim], got {tuple(out.shape)}")
    if lse.shape != out.shape[:2]:
        raise ValueError(
            f"lse: expected [{out.shape[0]}, {out.shape[1]}] (out's tokens and heads), "
            f"got {tuple(lse.shape)}"
        )
    if out.shape[1] % world_size:
        raise ValueError(
            f"out: num_heads ({out.shape[1]}) must be a multiple of the group size ({world_size})"
        )


def dcp_merge(
    out: torch.Tensor,
    lse: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Merge this rank's DCP partial over `group`; returns this rank's heads ``[T, H / N, D]``.

    out: [T, H, D] this rank's partial output (normalised over its keys; 0 where it holds none);
    lse: [T, H] its natural-log LSE (-inf where it holds no key). Collective: every rank of
    `group` calls it with the same shapes. With `return_lse`, also the global LSE of this rank's
    heads ``[T, H / N]`` (fp32). `out` and `lse` are not modified.
    """
    world_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    _check_group_args(out, lse, world_size)
    num_tokens, num_heads, head_dim = out.shape
    lse32 = lse.to(torch.float32).contiguous()
    if world_size == 1:
        merged, lse_g = correct_attn_out(out, lse32.unsqueeze(0), 0)
        return (merged, lse_g) if return_lse else merged
    lses = all_gather_stacked(lse32, group)  # [N, T, H]
    corrected, lse_g = correct_attn_out(out, lses, rank)
    # Reduce-scatter over heads: put heads first so each rank's share is one contiguous chunk.
    by_head = corrected.transpose(0, 1).contiguous()  # [H, T, D]
    per_rank = num_heads // world_size
    mine = torch.empty((per_rank, num_tokens, head_dim), dtype=by_head.dtype, device=by_head.device)
    _reduce_scatter_flat(mine, by_head, op=dist.ReduceOp.SUM, group=group)
    merged = mine.transpose(0, 1).contiguous()
    if return_lse:
        return merged, lse_g[:, rank * per_rank : (rank + 1) * per_rank].contiguous()
    return merged


def dcp_merge_reference(
    outs: Sequence[torch.Tensor] | torch.Tensor,
    lses: Sequence[torch.Tensor] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-process oracle: every rank's partials in, full-context (out fp32 [T, H, D], lse
    fp32 [T, H]) out. Rank r of `dcp_merge` gets heads ``[r * H / N, (r + 1) * H / N)`` of it."""
    outs_t = torch.stack(list(outs)) if not isinstance(outs, torch.Tensor) else outs
    lses_t = torch.stack(list(lses)) if not isinstance(lses, torch.Tensor) else lses
    if outs_t.dim() != 4 or lses_t.shape != outs_t.shape[:3]:
        raise ValueError(
            "outs/lses: expected [N, T, H, D] and [N, T, H], got "
            f"{tuple(outs_t.shape)} and {tuple(lses_t.shape)}"
        )
    lse = global_lse(lses_t)
    lse_safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(_sanitize_lse(lses_t) - lse_safe)  # [N, T, H]; 0 for empty shards
    weights = torch.where(torch.isneginf(lse), torch.zeros_like(weights), weights)
    out = (outs_t.to(torch.float32) * weights.unsqueeze(-1)).sum(dim=0)
    return out, lse


__all__ = [
    "all_gather_stacked",
    "correct_attn_out",
    "dcp_merge",
    "dcp_merge_reference",
    "global_lse",
]
