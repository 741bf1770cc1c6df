"""One DCP rank of `test_dcp_ranks.py` (spawned, one process per rank). Imports nothing from vLLM.

Every rank builds the same random MLA cache (same seed), keeps the tokens vLLM places on it
(global position p lives on rank ``(p // I) % N``), and runs, per case:

- decode: `mla_decode` with LSE over its shard, `dcp_merge` (all-gather LSE, rescale,
  reduce-scatter over heads), compared with the single-process full-context `mla_decode`, the
  fp32 reference and the single-process merge oracle over all ranks' partials;
- chunked-context prefill gather: `gather_and_maybe_dequant_cache` of its padded local layout,
  all-gather, reorder into global order, compared with the single-rank gather of the full cache.

Assertion failures are recorded per case (every rank still runs every collective, so no rank
waits forever); each rank writes ``rank<r>.json`` into the result directory.
Kernel modules are imported inside `run_rank`, after ``TRITON_INTERPRET`` is set for gloo ranks.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import traceback
from pathlib import Path

import torch

# Tolerances (justified in test_dcp_ranks.py's docstring).
OUT_ATOL = 2e-2  # one mla_decode vs the fp32 reference, as in tests/kernels/test_mla_decode.py
OUT_RTOL = 2e-2
LSE_ATOL = 1e-3
BF16_EPS = 2.0**-9  # unit roundoff of bf16 (8 stored mantissa bits)
ROPE = {512: 64, 256: 32}


def cases_for(world_size: int, on_gpu: bool) -> list[dict]:
    """The cases every rank runs, in order. Names are the test ids."""
    if on_gpu:
        # Real widths; lengths around page and interleave edges, shorter than N, one long.
        shape = dict(kv_lora_rank=512, num_heads=16, block_size=64)
        seq_lens = [1, world_size - 1, 0, 17, 1000, 4097]
    else:
        # Interpreter: tiny (CI budget); still empty shards and a second prefill chunk.
        shape = dict(kv_lora_rank=256, num_heads=4, block_size=8)
        seq_lens = [1, 0, 3, 37, 70]
    out = []
    for interleave in (1, 16):
        for kv in ("bf16", "fp8"):
            out.append(
                dict(
                    name=f"N{world_size}-I{interleave}-{kv}",
                    seq_lens=[max(0, s) for s in seq_lens],
                    interleave=interleave,
                    kv=kv,
                    seed=1000 * world_size + 10 * interleave + (kv == "fp8"),
                    **shape,
                )
            )
    return out


def _paged(rows: list[torch.Tensor], block_size: int, width: int, dtype, gen) -> tuple:
    """A paged cache holding each sequence's rows in shuffled pages (plus spare pages of noise)."""
    pages = [max(1, math.ceil(len(r) / block_size)) for r in rows]
    num_blocks = sum(pages) + 2
    cache = torch.randn(num_blocks, block_size, width, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    bt = torch.zeros(len(rows), max(pages), dtype=torch.int32)
    at = 0
    for b, (r, n) in enumerate(zip(rows, pages, strict=True)):
        bt[b, :n] = perm[at : at + n].to(torch.int32)
        at += n
        pos = torch.arange(len(r))
        cache[bt[b, pos // block_size].long(), pos % block_size] = r
    return cache, bt


def _close(name: str, got, want, atol: float, rtol: float) -> None:
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


def run_case(case: dict, rank: int, world_size: int, device: torch.device, group) -> dict:
    from tests.distributed.dcp_layout import (
        build_dcp_local_layout,
        dcp_local_seq_lens,
        dcp_rank_of,
        interleave_rank_outputs,
    )
    from tests.distributed.dcp_merge import (
        all_gather_stacked,
        dcp_merge,
        dcp_merge_reference,
    )
    from vllm_blackwell_ext import ops
    from vllm_blackwell_ext.kernels.mla_decode import mla_decode
    from vllm_blackwell_ext.reference.kv_gather import gather_and_maybe_dequant_cache_ref
    from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference

    n, i = world_size, case["interleave"]
    r_lat, heads, bs = case["kv_lora_rank"], case["num_heads"], case["block_size"]
    width = r_lat + ROPE[r_lat]
    lens = case["seq_lens"]
    batch = len(lens)
    fp8 = case["kv"] == "fp8"
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16

    # Same data on every rank: one generator, one seed.
    g = torch.Generator().manual_seed(case["seed"])
    values = [torch.randn(s, width, generator=g) for s in lens]
    values = [(v * 8).to(dtype) if fp8 else v.to(dtype) for v in values]
    k_scale = torch.tensor([0.125], dtype=torch.float32) if fp8 else None
    q = torch.randn(batch, heads, width, generator=g).to(torch.bfloat16)
    g_cache, g_bt = _paged(values, bs, width, dtype, g)

    # This rank's shard, in local order (local position rises with p on a rank), followed by
    # noise up to the padded local length the chunked gather reads (padded_rows(len)).
    local_rows = []
    for v in values:
        mine = v[dcp_rank_of(torch.arange(len(v)), n, i) == rank]
        padded = -(-len(v) // (n * i)) * i
        noise = torch.randn(padded - len(mine), width, generator=g).to(dtype)
        local_rows.append(torch.cat([mine, noise]))
    lg = torch.Generator().manual_seed(case["seed"] + 7919 * (rank + 1))
    l_cache, l_bt = _paged(local_rows, bs, width, dtype, lg)
    l_lens = dcp_local_seq_lens(lens, n, rank, i)

    def dev(t):
        return None if t is None else t.to(device)

    q, g_cache, g_bt, l_cache, l_bt, k_scale = map(dev, (q, g_cache, g_bt, l_cache, l_bt, k_scale))
    softmax_scale = width**-0.5

    def decode(cache, bt, seq_lens):
        out = torch.empty(batch, heads, r_lat, dtype=torch.bfloat16, device=device)
        lse = torch.empty(batch, heads, dtype=torch.float32, device=device)
        mla_decode(
            q,
            cache,
            bt,
            seq_lens.to(torch.int32).to(device),
            out,
            softmax_scale=softmax_scale,
            kv_lora_rank=r_lat,
            k_scale=k_scale,
            lse_out=lse,
        )
        return out, lse

    # ---- decode + merge (collectives first, all ranks, then checks)
    out_l, lse_l = decode(l_cache, l_bt, l_lens)
    merged, lse_m = dcp_merge(out_l, lse_l, group, return_lse=True)
    all_out = all_gather_stacked(out_l, group)
    all_lse = all_gather_stacked(lse_l, group)

    # ---- chunked-context prefill gather: two chunks, the second starting at N * I
    kv_str = "fp8" if fp8 else "auto"
    chunks = [
        ([0] * batch, [min(s, n * i) for s in lens]),
        ([n * i] * batch, [max(0, s - n * i) for s in lens]),
    ]
    gathers = []
    for starts, c_lens in chunks:
        if sum(c_lens) == 0:
            continue
        lay = build_dcp_local_layout(c_lens, n, rank, i, starts, device=device)
        dst = torch.full((lay.num_tokens + 1, width), 1234.0, dtype=torch.bfloat16, device=device)
        ops.gather_and_maybe_dequant_cache(
            l_cache,
            dst,
            l_bt,
            lay.cu_seq_lens,
            lay.token_to_seq,
            lay.num_tokens,
            kv_str,
            k_scale,
            lay.seq_starts,
        )
        every = all_gather_stacked(dst[: lay.num_tokens], group)
        got = interleave_rank_outputs(list(every.unbind(0)), lay, c_lens, starts)
        # Single-rank gather of the same chunk from the undistributed cache.
        total = sum(c_lens)
        cu = torch.tensor([0, *torch.tensor(c_lens).cumsum(0).tolist()], dtype=torch.int32)
        t2s = torch.repeat_interleave(torch.arange(batch), torch.tensor(c_lens)).to(torch.int32)
        st = torch.tensor(starts, dtype=torch.int32)
        want = torch.full((total, width), -1.0, dtype=torch.bfloat16, device=device)
        ops.gather_and_maybe_dequant_cache(
            g_cache,
            want,
            g_bt,
            cu.to(device),
            t2s.to(device),
            total,
            kv_str,
            k_scale,
            st.to(device),
        )
        ref = torch.full((total, width), -1.0, dtype=torch.bfloat16)
        gather_and_maybe_dequant_cache_ref(
            g_cache.cpu(),
            ref,
            g_bt.cpu(),
            cu,
            t2s,
            total,
            kv_str,
            None if k_scale is None else k_scale.cpu(),
            st,
        )
        gathers.append((got.cpu(), want.cpu(), ref))

    # ---- checks (no collective below this line)
    full_out, full_lse = decode(g_cache, g_bt, torch.tensor(lens))
    ref_out, ref_lse = mla_decode_reference(
        q.cpu(),
        g_cache.cpu(),
        g_bt.cpu(),
        torch.tensor(lens, dtype=torch.int32),
        softmax_scale=softmax_scale,
        kv_lora_rank=r_lat,
        k_scale=None if k_scale is None else k_scale.cpu(),
    )
    hs = slice(rank * heads // n, (rank + 1) * heads // n)
    merged, lse_m = merged.float().cpu(), lse_m.cpu()
    oracle_out, oracle_lse = dcp_merge_reference(all_out.cpu(), all_lse.cpu())
    full_out, full_lse = full_out.float().cpu()[:, hs], full_lse.cpu()[:, hs]
    ref_out, ref_lse, oracle_out, oracle_lse = (
        ref_out[:, hs],
        ref_lse[:, hs],
        oracle_out[:, hs],
        oracle_lse[:, hs],
    )

    assert torch.isfinite(merged).all(), "merged output has NaN/inf"
    assert not torch.isnan(lse_m).any(), "merged LSE has NaN"
    empty_seq = torch.tensor(lens) == 0
    assert torch.equal(merged[empty_seq], torch.zeros_like(merged[empty_seq])), (
        "a sequence no rank holds a token of must merge to 0"
    )
    assert torch.equal(torch.isneginf(lse_m), torch.isneginf(ref_lse)), "-inf LSE rows differ"
    fin = torch.isfinite(ref_lse)
    # Oracle: same partials, merged in fp32 in one process; only the merge's bf16 roundings differ.
    scale = max(1.0, float(all_out.float().abs().max()))
    _close("merged vs oracle", merged, oracle_out, (n + 1) * BF16_EPS * scale, 0.0)
    _close("merged LSE vs oracle", lse_m[fin], oracle_lse[fin], 1e-5, 1e-6)
    # Full context: the single-process kernel and the fp32 reference.
    merge_slack = (n + 1) * BF16_EPS * scale
    _close("merged vs full-context mla_decode", merged, full_out, OUT_ATOL + merge_slack, OUT_RTOL)
    _close("merged vs reference", merged, ref_out, OUT_ATOL + merge_slack, OUT_RTOL)
    _close("merged LSE vs full-context", lse_m[fin], full_lse[fin], 2 * LSE_ATOL, 0.0)
    _close("merged LSE vs reference", lse_m[fin], ref_lse[fin], LSE_ATOL, 0.0)
    for k, (got, want, ref) in enumerate(gathers):
        assert torch.equal(got, want), f"chunk {k}: DCP gather differs from the single-rank gather"
        assert torch.equal(got, ref), f"chunk {k}: DCP gather differs from the reference gather"

    all_lens = dcp_local_seq_lens(lens, n, None, i)
    return {
        "empty_shards": int(((all_lens == 0) & (torch.tensor(lens) > 0)[:, None]).sum()),
        "gather_chunks": len(gathers),
        "max_err_vs_reference": float((merged - ref_out).abs().max()) if merged.numel() else 0.0,
    }


def run_rank(rank: int, world_size: int, backend: str, port: int, result_dir: str) -> None:
    """Entry point of one spawned rank (torch.multiprocessing.spawn passes `rank` first)."""
    if backend == "gloo":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        torch.set_num_threads(1)
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=300),
        **({"device_id": device} if backend == "nccl" else {}),
    )
    results = {}
    try:
        for case in cases_for(world_size, backend == "nccl"):
            try:
                results[case["name"]] = {
                    "ok": True,
                    **run_case(case, rank, world_size, device, None),
                }
            except AssertionError as e:
                results[case["name"]] = {"ok": False, "error": f"{e}\n{traceback.format_exc()}"}
    finally:
        Path(result_dir, f"rank{rank}.json").write_text(json.dumps(results, indent=1))
        dist.destroy_process_group()
