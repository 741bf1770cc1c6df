"""DCP local layout: every rank gathers its share with the kernel, and interleaving the rank
outputs gives back the global gathered context.

Tolerance: exact. The scales are powers of two and fp8/bf16 values are exact in bf16, so no
rounding happens anywhere (the CPU interpreter's bf16 truncation therefore cannot show either).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.dcp_layout import (
    build_dcp_local_layout,
    dcp_local_position,
    dcp_local_seq_lens,
    dcp_rank_of,
    interleave_rank_outputs,
)
from vllm_blackwell_ext.kernels import kv_gather as kvk
from vllm_blackwell_ext.reference.kv_gather import gather_and_maybe_dequant_cache_ref

I32 = torch.int32


def test_placement_follows_interleave_blocks_round_robin():
    p = torch.arange(12)
    # N=2, I=2: positions 0,1 -> rank 0; 2,3 -> rank 1; 4,5 -> rank 0 (local 2,3); ...
    assert dcp_rank_of(p, 2, 2).tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert dcp_local_position(p, 2, 2).tolist() == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5]
    assert dcp_rank_of(p, 3, 1).tolist() == [0, 1, 2] * 4


@given(
    lens=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    n=st.integers(1, 8),
    i=st.sampled_from([1, 2, 4, 16, 64]),
)
@settings(max_examples=100, deadline=None)
def test_local_seq_lens_count_the_positions_each_rank_holds(lens, n, i):
    per_rank = dcp_local_seq_lens(lens, n, None, i)
    for b, ln in enumerate(lens):
        held = torch.bincount(dcp_rank_of(torch.arange(ln), n, i), minlength=n)
        assert per_rank[b].tolist() == held.tolist()
        for r in range(n):
            assert dcp_local_seq_lens(lens, n, r, i)[b] == held[r]


def test_padded_layout_is_the_same_on_every_rank_except_valid_rows():
    lens, starts = [10, 0, 7], [0, 8, 16]
    layouts = [build_dcp_local_layout(lens, 4, r, 2, starts) for r in range(4)]
    for lay in layouts[1:]:
        assert torch.equal(lay.cu_seq_lens, layouts[0].cu_seq_lens)
        assert torch.equal(lay.token_to_seq, layouts[0].token_to_seq)
        assert torch.equal(lay.seq_starts, layouts[0].seq_starts)
    # padded_rows(n) = ceil(n / 8) * 2: seq 0 -> 4 rows, seq 1 -> 0, seq 2 -> ceil(23/8)*2 - 4 = 2.
    assert layouts[0].padded_seq_lens == [4, 0, 2]
    assert layouts[0].seq_starts.tolist() == [0, 2, 4]
    # Global 0..9: ranks hold 4, 2, 2, 2 tokens; chunk [16, 23): ranks hold 2, 2, 2, 1.
    assert [lay.valid_lens for lay in layouts] == [[4, 0, 2], [2, 0, 2], [2, 0, 2], [2, 0, 1]]
    assert sum(v for lay in layouts for v in lay.valid_lens) == sum(lens)


def test_layout_rejects_chunk_starts_off_the_rank_grid():
    with pytest.raises(ValueError, match="context_starts"):
        build_dcp_local_layout([8], 2, 0, 4, context_starts=[4])
    with pytest.raises(ValueError, match="dcp_rank"):
        build_dcp_local_layout([8], 2, 2, 4)
    with pytest.raises(ValueError, match="cp_kv_cache_interleave_size"):
        build_dcp_local_layout([8], 2, 0, 0)


def simulate(lens, starts, n, i, block_size, kv, device, seed):
    """Global cache + per-rank caches of the same context; gather every rank; interleave."""
    gen = torch.Generator().manual_seed(seed)
    entry = 64
    full = [
        s + ln for s, ln in zip(starts, lens, strict=False)
    ]  # each request's whole context so far
    if kv == "fp8":
        values = [
            (torch.randn(f, entry, generator=gen) * 8).to(torch.float8_e4m3fn).view(torch.uint8)
            for f in full
        ]
        store_dtype, scale = torch.uint8, torch.tensor([0.25], device=device)
    else:
        values = [torch.randn(f, entry, generator=gen).to(torch.bfloat16) for f in full]
        store_dtype, scale = torch.bfloat16, None

    def paged(seqs):  # one cache holding each listed sequence in its own random pages
        pages = [(len(v) + block_size - 1) // block_size for v in seqs]
        nb = sum(pages) + 2
        cache = torch.randint(0, 120, (nb, block_size, entry), generator=gen).to(store_dtype)
        perm = torch.randperm(nb, generator=gen)
        bt = torch.zeros(len(seqs), max(pages + [1]), dtype=torch.long)
        at = 0
        for b, (v, np_) in enumerate(zip(seqs, pages, strict=False)):
            bt[b, :np_] = perm[at : at + np_]
            at += np_
            for pos in range(len(v)):
                cache[bt[b, pos // block_size], pos % block_size] = v[pos]
        return cache.to(device), bt.to(I32).to(device)

    # Global truth: the oracle's gather of [start, start + len) from an undistributed cache.
    gcache, gbt = paged(values)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=I32, device=device)
    t2s = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(I32).to(device)
    want = torch.zeros(sum(lens), entry, dtype=torch.bfloat16, device=device)
    gather_and_maybe_dequant_cache_ref(
        gcache,
        want,
        gbt,
        cu,
        t2s,
        sum(lens),
        kv,
        scale,
        torch.tensor(starts, dtype=I32, device=device),
    )

    outs = []
    for r in range(n):
        lay = build_dcp_local_layout(lens, n, r, i, starts, device=device)
        local = []
        for v, _s, _ln, ls, pl in zip(
            values, starts, lens, lay.seq_starts.tolist(), lay.padded_seq_lens, strict=False
        ):
            p = torch.arange(len(v))
            mine = v[dcp_rank_of(p, n, i) == r]  # in local order: local index rises with p
            # Padded rows past what this rank holds read whatever the pages contain.
            junk = torch.full((max(0, ls + pl - len(mine)), entry), 3).to(store_dtype)
            local.append(torch.cat([mine, junk]))
        cache, bt = paged(local)
        dst = torch.full((lay.num_tokens + 1, entry), -1.0, dtype=torch.bfloat16, device=device)
        kvk.gather_and_maybe_dequant_cache(
            cache,
            dst,
            bt,
            lay.cu_seq_lens,
            lay.token_to_seq,
            lay.num_tokens,
            kv,
            scale,
            lay.seq_starts,
        )
        outs.append(dst)
    lay0 = build_dcp_local_layout(lens, n, 0, i, starts, device=device)
    return interleave_rank_outputs(outs, lay0, lens, starts), want


@given(
    lens=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    n=st.integers(1, 4),
    i=st.sampled_from([1, 2, 4, 8]),
    chunk=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    block_size=st.sampled_from([1, 4, 16]),
    kv=st.sampled_from(["fp8", "auto"]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=30, deadline=None)
def test_rank_gathers_interleave_back_to_the_global_context(
    lens, n, i, chunk, block_size, kv, seed, device
):
    # Chunk starts are multiples of N * I, as vLLM's chunk planner makes them.
    starts = [c * n * i for c in chunk[: len(lens)]]
    got, want = simulate(lens, starts, n, i, block_size, kv, device, seed)
    assert torch.equal(got, want)


def test_rank_gathers_interleave_back_with_uneven_lengths_and_empty_sequences(device):
    got, want = simulate([13, 0, 1, 29], [0, 0, 6, 12], 3, 2, 16, "fp8", device, seed=7)
    assert torch.equal(got, want)
