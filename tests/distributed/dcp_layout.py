"""Decode-context-parallel (DCP) local layout of a context gather. Pure torch, no vLLM.

Under DCP with ``N`` ranks and interleave ``I`` (vLLM's ``cp_kv_cache_interleave_size``), global
context position ``p`` of a request lives on rank ``(p // I) % N`` at that rank's local position
``(p // (N * I)) * I + p % I``. Each rank gathers its own share of a context chunk with the same
gather op, into a padded layout that is identical on every rank (vLLM's
``padded_local_cu_seq_lens``, ``padded_local_token_to_seq`` and local ``starts`` in
``mla_attention.py``): a request's chunk ``[start, start + length)`` takes
``padded_rows(start + length) - padded_rows(start)`` rows, with
``padded_rows(n) = ceil(n / (N * I)) * I``; rows a rank does not hold are padding.
`interleave_rank_outputs` puts the ranks' rows back into global order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def _check_dcp(dcp_world_size: int, cp_kv_cache_interleave_size: int, dcp_rank: int | None) -> None:
    if not isinstance(dcp_world_size, int) or dcp_world_size < 1:
        raise ValueError(f"dcp_world_size: expected an int >= 1, got {dcp_world_size!r}")
    if not isinstance(cp_kv_cache_interleave_size, int) or cp_kv_cache_interleave_size < 1:
        raise ValueError(
            "cp_kv_cache_interleave_size: expected an int >= 1, got "
            f"{cp_kv_cache_interleave_size!r}"
        )
    if dcp_rank is not None and not 0 <= dcp_rank < dcp_world_size:
        raise ValueError(f"dcp_rank: expected an int in [0, {dcp_world_size}), got {dcp_rank!r}")


def dcp_rank_of(positions: torch.Tensor, dcp_world_size: int, interleave: int) -> torch.Tensor:
    """Rank that holds each global position: ``(p // I) % N``."""
    return (positions // interleave) % dcp_world_size


def dcp_local_position(
    positions: torch.Tensor, dcp_world_size: int, interleave: int
) -> torch.Tensor:
    """Position of each global position inside its rank's local sequence."""
    return positions // (dcp_world_size * interleave) * interleave + positions % interleave


def dcp_local_seq_lens(
    seq_lens: torch.Tensor | Sequence[int],
    dcp_world_size: int,
    dcp_rank: int | None = None,
    cp_kv_cache_interleave_size: int = 1,
) -> torch.Tensor:
    """Tokens of each sequence held by `dcp_rank` (or by every rank: shape ``[..., N]``).

    Same values as vLLM's ``get_dcp_local_seq_lens`` (int32).
    """
    _check_dcp(dcp_world_size, cp_kv_cache_interleave_size, dcp_rank)
    lens = torch.as_tensor(seq_lens).to(torch.int64)
    if dcp_rank is None:
        ranks = torch.arange(dcp_world_size, device=lens.device)
        lens = lens.unsqueeze(-1)
    else:
        ranks = torch.tensor(dcp_rank, device=lens.device)
    n, i = dcp_world_size, cp_kv_cache_interleave_size
    full_rounds = lens // (n * i)  # whole N*I groups: I tokens on every rank
    rest = lens - full_rounds * n * i
    return (full_rounds * i + (rest - ranks * i).clamp(0, i)).to(torch.int32)


@dataclass(frozen=True)
class DcpLocalLayout:
    """Arguments of one rank's gather of a context chunk (same on every rank, except
    `valid_lens`). Tensors are int32 on the requested device; lists live on the host."""

    cu_seq_lens: torch.Tensor  # [B + 1] padded local row offsets
    token_to_seq: torch.Tensor  # [num_tokens]
    seq_starts: torch.Tensor  # [B] local start of the chunk in each local sequence
    num_tokens: int  # padded local rows (pass as num_tokens)
    padded_seq_lens: list[int]  # [B] padded local rows per sequence
    valid_lens: list[int]  # [B] leading rows of each sequence that this rank really holds
    dcp_world_size: int
    dcp_rank: int
    interleave: int


def build_dcp_local_layout(
    context_lens: torch.Tensor | Sequence[int],
    dcp_world_size: int,
    dcp_rank: int,
    cp_kv_cache_interleave_size: int = 1,
    context_starts: torch.Tensor | Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> DcpLocalLayout:
    """Padded local layout of the chunk ``[context_starts[b], + context_lens[b])`` of every
    sequence on `dcp_rank`, exactly as vLLM lays it out for its DCP chunked-context gather.

    `context_starts` (global, default 0) must be multiples of ``dcp_world_size *
    cp_kv_cache_interleave_size``, as vLLM's chunk planner makes them; otherwise a rank's
    local chunk would not start on a local interleave boundary.
    """
    _check_dcp(dcp_world_size, cp_kv_cache_interleave_size, dcp_rank)
    lens = [int(x) for x in torch.as_tensor(context_lens).reshape(-1).tolist()]
    if any(x < 0 for x in lens):
        raise ValueError(f"context_lens: expected lengths >= 0, got {lens}")
    starts = (
        [0] * len(lens)
        if context_starts is None
        else [int(x) for x in torch.as_tensor(context_starts).reshape(-1).tolist()]
    )
    if len(starts) != len(lens):
        raise ValueError(
            f"context_starts: expected {len(lens)} entries (one per sequence), got {len(starts)}"
        )
    n, i = dcp_world_size, cp_kv_cache_interleave_size
    if any(s < 0 or s % (n * i) for s in starts):
        raise ValueError(
            f"context_starts: expected multiples of dcp_world_size * interleave = {n * i}, "
            f"got {starts}"
        )

    def padded_rows(rows: int) -> int:
        return -(-rows // (n * i)) * i

    local_starts = [padded_rows(s) for s in starts]
    padded = [
        padded_rows(s + ln) - ls for s, ln, ls in zip(starts, lens, local_starts, strict=False)
    ]
    held_to_end = (
        dcp_local_seq_lens(
            [s + ln for s, ln in zip(starts, lens, strict=False)], n, dcp_rank, i
        ).tolist()
        if lens
        else []
    )
    valid = [
        min(max(0, h - ls), p) for h, ls, p in zip(held_to_end, local_starts, padded, strict=False)
    ]
    cu = [0]
    for p in padded:
        cu.append(cu[-1] + p)
    seq_ids = torch.repeat_interleave(
        torch.arange(len(lens), dtype=torch.int32), torch.tensor(padded, dtype=torch.long)
    )
    return DcpLocalLayout(
        cu_seq_lens=torch.tensor(cu, dtype=torch.int32, device=device),
        token_to_seq=seq_ids.to(device),
        seq_starts=torch.tensor(local_starts, dtype=torch.int32, device=device),
        num_tokens=cu[-1],
        padded_seq_lens=padded,
        valid_lens=valid,
        dcp_world_size=n,
        dcp_rank=dcp_rank,
        interleave=i,
    )


def interleave_rank_outputs(
    rank_outputs: Sequence[torch.Tensor],
    layout: DcpLocalLayout,
    context_lens: torch.Tensor | Sequence[int],
    context_starts: torch.Tensor | Sequence[int] | None = None,
) -> torch.Tensor:
    """Global-order context ``[sum(context_lens), *entry]`` from every rank's gathered rows.

    `rank_outputs[r]` is rank r's ``dst`` (at least ``layout.num_tokens`` rows) for the layout
    `build_dcp_local_layout` gave (any rank's: the padded layout is rank-independent).
    """
    n, i = layout.dcp_world_size, layout.interleave
    if len(rank_outputs) != n:
        raise ValueError(
            f"rank_outputs: expected {n} tensors (one per rank), got {len(rank_outputs)}"
        )
    lens = [int(x) for x in torch.as_tensor(context_lens).reshape(-1).tolist()]
    starts = (
        [0] * len(lens)
        if context_starts is None
        else [int(x) for x in torch.as_tensor(context_starts).reshape(-1).tolist()]
    )
    device = rank_outputs[0].device
    cu = layout.cu_seq_lens.tolist()
    local_starts = layout.seq_starts.tolist()
    ranks, rows = [], []
    for b, (s, ln) in enumerate(zip(starts, lens, strict=False)):
        p = torch.arange(s, s + ln, dtype=torch.long)
        ranks.append(dcp_rank_of(p, n, i))
        rows.append(cu[b] + dcp_local_position(p, n, i) - local_starts[b])
    if not ranks:
        return rank_outputs[0][:0]
    stacked = torch.stack([o[: layout.num_tokens] for o in rank_outputs])
    return stacked[torch.cat(ranks).to(device), torch.cat(rows).to(device)]
