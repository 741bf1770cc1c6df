"""The single-process DCP merge algebra (`dcp_merge_reference`, `correct_attn_out`), no ranks.

Partials are computed in fp64 by plain softmax over random key shards, so the merge must give
the full softmax to fp32 rounding (1e-5).
"""

from __future__ import annotations

import torch

from tests.distributed.dcp_merge import correct_attn_out, dcp_merge_reference


def _partials(scores: torch.Tensor, values: torch.Tensor, owner: torch.Tensor, n: int):
    """Per-rank (normalised output, natural-log LSE) of keys `owner == r`; empty -> (0, -inf)."""
    outs, lses = [], []
    for r in range(n):
        s = scores[..., owner == r]  # [T, H, k_r]
        if s.shape[-1] == 0:
            outs.append(torch.zeros(*scores.shape[:2], values.shape[-1], dtype=torch.float64))
            lses.append(torch.full(scores.shape[:2], float("-inf"), dtype=torch.float64))
            continue
        outs.append(torch.softmax(s, -1) @ values[owner == r])
        lses.append(torch.logsumexp(s, -1))
    return torch.stack(outs).float(), torch.stack(lses).float()


def test_merged_shards_equal_the_full_softmax_with_empty_shards():
    g = torch.Generator().manual_seed(0)
    t, h, k, d, n = 3, 4, 5, 8, 4  # 5 keys over 4 ranks, interleave 2: rank 3 holds none
    scores = torch.randn(t, h, k, generator=g, dtype=torch.float64) * 3
    values = torch.randn(k, d, generator=g, dtype=torch.float64)
    owner = (torch.arange(k) // 2) % n
    outs, lses = _partials(scores, values, owner, n)
    out, lse = dcp_merge_reference(outs, lses)
    torch.testing.assert_close(out, (torch.softmax(scores, -1) @ values).float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).float(), atol=1e-5, rtol=0)
    # Summing every rank's corrected output is the same merge (what the reduce-scatter does).
    summed = sum(correct_attn_out(outs[r], lses, r)[0] for r in range(n))
    torch.testing.assert_close(summed, out, atol=1e-6, rtol=0)


def test_rows_no_rank_holds_merge_to_zero_without_nan():
    n, t, h, d = 2, 2, 3, 4
    outs = torch.zeros(n, t, h, d)
    lses = torch.full((n, t, h), float("-inf"))
    lses[0, 1] = 0.5  # token 1 has keys on rank 0 only
    outs[0, 1] = 1.0
    lses[1, 0, 0] = float("nan")  # treated as an empty shard, as vLLM's kernel does
    out, lse = dcp_merge_reference(outs, lses)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(out[0], torch.zeros(h, d)) and torch.isneginf(lse[0]).all()
    assert torch.equal(out[1], torch.ones(h, d)) and torch.equal(lse[1], torch.full((h,), 0.5))
    for r in range(n):
        corrected, _ = correct_attn_out(outs[r].to(torch.bfloat16), lses, r)
        assert not corrected.isnan().any()
