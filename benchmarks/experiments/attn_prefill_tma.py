"""Causal prefill with TMA-fed K/V tiles: how close can a Triton kernel come to SDPA here?

The shipped prefill (`_paged_attn_kernel`, 128 x 128 tiles) gathers each K/V tile with
`cp.async` through the block table, since vLLM's 16-token pages are shorter than a tile. This
experiment times, on the same values and in one run, torch SDPA, the shipped kernel at pages of
16 and of 128 tokens, and a kernel that loads each tile with one tensor-memory-access copy
(`_tma_prefill_kernel` below), with and without Triton's warp specialisation of the key loop:
from the cache through a 2D descriptor where a page holds whole tiles (pages of 128), and from
the chunk's own contiguous K/V, as a forward receives them, at any page size (pages of 16).
Its result decides whether a TMA path is worth adding to the product kernel, and gives the
Triton ceiling behind the prefill goal of `BWX_ATTN`.

    python benchmarks/experiments/attn_prefill_tma.py [--only SUBSTR]
    TRITON_INTERPRET=1 python benchmarks/experiments/attn_prefill_tma.py --check
    python benchmarks/experiments/attn_prefill_tma.py --compile-only [--capability 90]

`--check` runs the TMA kernel on small shapes against the pure-torch reference (the CPU
interpreter, or the GPU) and exits. `--compile-only` compiles every config for a GPU
architecture without one (Triton's bundled ptxas) and prints registers, shared memory, warps
and whether warp specialisation took (`setmaxnreg` in the PTX), or the compiler's refusal; then
the product's `fresh_prefill` kernel (this experiment's contiguous route, shipped) with its
registers and spills.

What Triton 3.6's Hopper warp specialisation (`tl.range(..., warp_specialize=True)`) accepts,
found by offline sm90 compiles: a kernel whose query tile comes through a descriptor, with no
search loop and no early return ahead of the key loop (the first makes the pass skip the
kernel, the second makes it fail) and no second key loop after it (fails); 64-row tiles on 4
warps only (128 rows on 4 warps fails, 8 warps are left as they are). It then runs 12 warps
in three partitions (`setmaxnreg` 232 / 120 / 40). Hence the host-built program list and the
single masked loop of the specialised variants. Triton 3.7.1 (vLLM 0.32's) is no different
offline: 128-row tiles on 8 warps compile to 8 warps without `setmaxnreg`, 64-row tiles on 4
warps to 12 in the same three partitions.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.paged_attention import launch_config, paged_attention
from vllm_blackwell_ext.reference.paged_attention import paged_attention_ref

HQ, HKV, D = 32, 8, 128
LOG2E = 1.4426950408889634


@triton.jit
def _scores(q, k, qk_scale):
    if q.dtype == tl.float32:  # the CPU interpreter (its bf16 dots multiply raw bits)
        k = k.to(tl.float32)
    return tl.dot(q, tl.trans(k)) * qk_scale


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32: tl.constexpr):
    """The online-softmax step of a tile whose scores `s` are at hand."""
    if DOT_FP32:
        v = v.to(tl.float32)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _softmax_step(acc, l_i, m_i, q, k, v, s_mask, MASKED: tl.constexpr, qk_scale):
    s = _scores(q, k, qk_scale)
    if MASKED:
        s = tl.where(s_mask, s, float("-inf"))
    DOT_FP32: tl.constexpr = q.dtype == tl.float32
    return _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)


@triton.jit
def _tile_row(bt_row, start, q_start, kv_head, NUM_KV_HEADS, PAGE: tl.constexpr):
    """Descriptor row of key `start`: in the paged cache, or (PAGE == 0) in the chunk's K/V."""
    if PAGE == 0:
        row = q_start + start
    else:
        page = tl.load(bt_row + start // PAGE)
        row = (page * NUM_KV_HEADS + kv_head) * PAGE + start % PAGE
    return row


@triton.jit
def _loop_row(
    row_next,
    bt_row,
    start,
    pos_last,
    q_start,
    kv_head,
    NUM_KV_HEADS,
    PAGE: tl.constexpr,
    TILE_N: tl.constexpr,
    READAHEAD: tl.constexpr,
):
    """(descriptor row of the tile at key `start`, the row carried to the next iteration).

    READAHEAD: the row was read one iteration ahead (a loop-carried value, so the TMA copy
    does not wait on a load of its own iteration); the read past the last tile is clamped to
    the block's last key, whose page exists. Otherwise it is read here.
    """
    if READAHEAD:
        ahead = tl.minimum(start + TILE_N, pos_last)
        return row_next, _tile_row(bt_row, ahead, q_start, kv_head, NUM_KV_HEADS, PAGE)
    return _tile_row(bt_row, start, q_start, kv_head, NUM_KV_HEADS, PAGE), row_next


@triton.jit
def _page_row(pages, offs_pb, index, start, kv_head, NUM_KV_HEADS, PAGE: tl.constexpr):
    """Descriptor row of key `start`, whose page id is `pages[index]` (a register vector)."""
    page = tl.sum(tl.where(offs_pb == index, pages, 0))
    return (page * NUM_KV_HEADS + kv_head) * PAGE + start % PAGE


@triton.jit
def _skewed_step(
    q, k_desc, v_desc, row_k, k_col, row_v, v_col, s, acc, l_i, m_i, qk_scale,
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    """One skewed step: ask for the next tile's scores (key row `row_k`), then run this
    tile's softmax and P @ V (scores `s`, value row `row_v`); returns the next scores."""
    s_next = _scores(q, k_desc.load([row_k, k_col]), qk_scale)
    v = v_desc.load([row_v, v_col])
    acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)
    return s_next, acc, l_i, m_i


@triton.jit
def _tma_prefill_kernel(
    q_desc,  # q as [T, H, HEAD], block [BLOCK_Q, GQA, HEAD]
    # Paged: both the cache as 2D [num_blocks * HKV * PAGE, 2 * HEAD], block [TILE_N, HEAD].
    # PAGE == 0: the chunk's own key and value, each as 2D [T, HKV * HEAD].
    k_desc,
    v_desc,
    out_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    block_table_ptr,
    work_ptr,  # per program: (request, query block), from the host
    qk_scale,  # softmax scale x log2(e)
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GQA: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    PAGE: tl.constexpr,  # tokens per page, a multiple of TILE_N; 0: contiguous K/V
    STAGES: tl.constexpr,
    SINGLE_LOOP: tl.constexpr,  # one loop, causal mask on every tile (what WARP_SPEC needs)
    WARP_SPEC: tl.constexpr,
    DOT_FP32: tl.constexpr,
    READAHEAD: tl.constexpr = False,  # paged: block-table reads one tile ahead
    PAGE_BATCH: tl.constexpr = 0,  # paged, > 0: page ids read this many at a time (`_page_row`)
    SKEW: tl.constexpr = False,  # tile j + 1's scores asked for before tile j's softmax
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GQA
    # No search loop and no early return before the key loop: Triton 3.6's Hopper warp
    # specialisation skips a kernel with the one and fails on the other.
    pid_q = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = tl.load(work_ptr + 2 * pid_q)
    q_block = tl.load(work_ptr + 2 * pid_q + 1)
    q_start = tl.load(cu_q_ptr + req)
    q_len = tl.load(cu_q_ptr + req + 1) - q_start
    ctx_len = tl.load(seq_lens_ptr + req) - q_len

    offs_m = tl.arange(0, BLOCK_M)
    q_local = q_block * BLOCK_Q + offs_m // GQA
    head = kv_head * GQA + offs_m % GQA
    row_ok = q_local < q_len
    q_pos = ctx_len + q_local
    tok = (q_start + q_local).to(tl.int64)
    # Rows past the request (the next request's, or zeros past the end) are never stored.
    q = q_desc.load([q_start + q_block * BLOCK_Q, kv_head * GQA, 0]).reshape(BLOCK_M, HEAD)
    if DOT_FP32:
        q = q.to(tl.float32)
    pos_first = ctx_len + q_block * BLOCK_Q
    pos_last = ctx_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len) - 1
    tile_hi = (pos_last + TILE_N) // TILE_N
    if SINGLE_LOOP:
        full_hi = tile_hi
    else:
        full_hi = (pos_first + 1) // TILE_N  # tiles every row sees whole

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD], tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt
    if PAGE == 0:
        k_col = kv_head * HEAD
        v_col = kv_head * HEAD
    else:
        k_col = 0
        v_col = HEAD
    offs_n = tl.arange(0, TILE_N)
    # Keys past a row's position get -inf, so p = 0; the cache slots they read are finite
    # (written earlier, or zeros from allocation), so 0 x value adds nothing.
    # READAHEAD (`_loop_row`): each tile's row read one iteration ahead.
    row_next = _tile_row(bt_row, 0, q_start, kv_head, NUM_KV_HEADS, PAGE)
    if PAGE_BATCH > 0:
        # The page ids of PAGE_BATCH pages in one vector load ahead of an inner key loop, so
        # no tile's copy waits on a block-table read of its own (the pipelined loop computes
        # its rows from registers); the pipeline drains once per batch.
        TILES_PER_PAGE: tl.constexpr = PAGE // TILE_N
        BATCH_TILES: tl.constexpr = PAGE_BATCH * TILES_PER_PAGE
        offs_pb = tl.arange(0, PAGE_BATCH)
        num_pages = (ctx_len + q_len + PAGE - 1) // PAGE
        for b0 in range(0, full_hi, BATCH_TILES):
            p0 = b0 // TILES_PER_PAGE
            pages = tl.load(bt_row + p0 + offs_pb, mask=p0 + offs_pb < num_pages, other=0)
            batch_tiles = tl.minimum(full_hi - b0, BATCH_TILES)
            if SKEW:
                # SKEW within each batch: the batch's first scores ahead of its loop; the
                # last tile's scores are asked for again at its end and go unused.
                row_v = _page_row(pages, offs_pb, 0, b0 * TILE_N, kv_head, NUM_KV_HEADS, PAGE)
                s = _scores(q, k_desc.load([row_v, k_col]), qk_scale)
                for t in tl.range(0, batch_tiles, num_stages=STAGES):
                    t_next = tl.minimum(t + 1, batch_tiles - 1)
                    start_next = (b0 + t_next) * TILE_N
                    row_k = _page_row(pages, offs_pb, t_next // TILES_PER_PAGE, start_next,
                                      kv_head, NUM_KV_HEADS, PAGE)  # fmt: skip
                    s, acc, l_i, m_i = _skewed_step(
                        q, k_desc, v_desc, row_k, k_col, row_v, v_col, s, acc, l_i, m_i,
                        qk_scale, DOT_FP32,
                    )  # fmt: skip
                    row_v = row_k
            else:
                for t in tl.range(0, batch_tiles, num_stages=STAGES):
                    start = (b0 + t) * TILE_N
                    row = _page_row(pages, offs_pb, t // TILES_PER_PAGE, start, kv_head,
                                    NUM_KV_HEADS, PAGE)  # fmt: skip
                    k = k_desc.load([row, k_col])
                    v = v_desc.load([row, v_col])
                    visible = (start + offs_n)[None, :] <= q_pos[:, None]
                    acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, visible, False, qk_scale)
    elif SKEW:
        # As the product's `fresh_prefill` with `skew_scores`: the softmax of tile j runs
        # beside the tensor cores' work on tile j + 1's scores and tile j - 1's P @ V. The
        # last scores asked for (the tile at the block's last key again) go unused.
        row_v = row_next
        s = _scores(q, k_desc.load([row_v, k_col]), qk_scale)
        for j in tl.range(0, full_hi, num_stages=STAGES):
            ahead = tl.minimum((j + 1) * TILE_N, pos_last)
            row_k = _tile_row(bt_row, ahead, q_start, kv_head, NUM_KV_HEADS, PAGE)
            s, acc, l_i, m_i = _skewed_step(
                q, k_desc, v_desc, row_k, k_col, row_v, v_col, s, acc, l_i, m_i, qk_scale,
                DOT_FP32,
            )  # fmt: skip
            row_v = row_k
    else:
        for j in tl.range(0, full_hi, num_stages=STAGES, warp_specialize=WARP_SPEC):
            start = j * TILE_N
            row, row_next = _loop_row(
                row_next, bt_row, start, pos_last, q_start, kv_head, NUM_KV_HEADS, PAGE,
                TILE_N, READAHEAD,
            )  # fmt: skip
            k = k_desc.load([row, k_col])
            v = v_desc.load([row, v_col])
            visible = (start + offs_n)[None, :] <= q_pos[:, None]
            acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, visible, SINGLE_LOOP, qk_scale)
    if not SINGLE_LOOP:
        for j in tl.range(full_hi, tile_hi):
            start = j * TILE_N
            row, row_next = _loop_row(
                row_next, bt_row, start, pos_last, q_start, kv_head, NUM_KV_HEADS, PAGE, TILE_N,
                READAHEAD,
            )  # fmt: skip
            k = k_desc.load([row, k_col])
            v = v_desc.load([row, v_col])
            visible = (start + offs_n)[None, :] <= q_pos[:, None]
            acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, visible, True, qk_scale)
    out = acc / l_i[:, None]
    offs_d = tl.arange(0, HEAD)
    tl.store(
        out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


@dataclass(frozen=True)
class TmaConfig:
    block_q: int  # query tokens per program (x GQA rows)
    tile_n: int
    num_warps: int
    stages: int
    single_loop: bool = False
    warp_spec: bool = False  # needs single_loop (Triton 3.6's Hopper pass fails otherwise)
    readahead: bool = False  # paged: each tile's page read one iteration ahead
    page_batch: int = 0  # paged, > 0: page ids read this many at a time, ahead of the tiles
    skew: bool = False  # each tile's scores asked for one tile ahead (two loops; within batches)


def query_blocks(cu: torch.Tensor, block_q: int) -> torch.Tensor:
    """(request, query block) of each program, longest blocks first, as int32 [n, 2]."""
    lens = cu.diff().tolist()
    work = [(b, i) for b, n in enumerate(lens) for i in range(-(-n // block_q))]
    work.sort(key=lambda w: -w[1])
    return torch.tensor(work, dtype=torch.int32, device=cu.device).view(-1, 2)


def tma_prefill(
    q, kv, out, cu, seq_lens, block_table, cfg: TmaConfig, work: torch.Tensor, contig=None
):
    """Causal prefill over a [num_blocks, HKV, PAGE, 2 * HEAD] cache (vLLM's layout), or,
    given `contig` = (key, value) [T, HKV, HEAD] of prefills without context, over those."""
    nb, hkv, page, two_d = kv.shape
    head = two_d // 2
    gqa = q.shape[1] // hkv
    if cfg.skew and (cfg.single_loop or cfg.readahead or cfg.warp_spec):
        raise ValueError(f"cfg: skew with two loops, no readahead expected, got {cfg}")
    if contig is not None:
        if cfg.readahead or cfg.page_batch:
            raise ValueError(f"cfg: a contiguous read has no pages to read ahead, got {cfg}")
        page = 0
        k_desc, v_desc = (
            TensorDescriptor.from_tensor(t.view(t.shape[0], hkv * head), [cfg.tile_n, head])
            for t in contig
        )
    elif page % cfg.tile_n:
        raise ValueError(f"page: a multiple of tile_n={cfg.tile_n} expected, got {page}")
    elif cfg.page_batch and (cfg.single_loop or cfg.readahead):
        raise ValueError(f"cfg: page_batch without single_loop or readahead expected, got {cfg}")
    else:
        cache = kv.view(nb * hkv * page, two_d)
        k_desc = v_desc = TensorDescriptor.from_tensor(cache, [cfg.tile_n, head])
    q_desc = TensorDescriptor.from_tensor(q, [cfg.block_q, gqa, head])
    _tma_prefill_kernel[(work.shape[0], hkv)](
        q_desc, k_desc, v_desc, out, cu, seq_lens, block_table, work, head**-0.5 * LOG2E,
        out.stride(0), out.stride(1), block_table.stride(0),
        NUM_KV_HEADS=hkv, GQA=gqa, HEAD=head, BLOCK_Q=cfg.block_q, TILE_N=cfg.tile_n,
        PAGE=page, STAGES=cfg.stages, SINGLE_LOOP=cfg.single_loop, WARP_SPEC=cfg.warp_spec,
        DOT_FP32=q.device.type == "cpu", READAHEAD=cfg.readahead, PAGE_BATCH=cfg.page_batch,
        SKEW=cfg.skew, num_warps=cfg.num_warps,
    )  # fmt: skip


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    kv: torch.Tensor
    out: torch.Tensor
    cu: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_seqlen_q: int


def make_inputs(
    lens: list[int], page: int, device: str, hq=HQ, hkv=HKV, d=D, ctx: int = 0
) -> Inputs:
    """Causal prefills of `lens` queries after `ctx` cached keys each, pages in random order."""
    g = torch.Generator(device="cpu").manual_seed(0)
    pages = [-(-(ctx + n) // page) for n in lens]
    nb = sum(pages)
    kv = torch.randn(nb, hkv, page, 2 * d, generator=g).to(torch.bfloat16).to(device)
    perm = torch.randperm(nb, generator=g).to(torch.int32)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at : at + n]
        at += n
    q = torch.randn(sum(lens), hq, d, generator=g).to(torch.bfloat16).to(device)
    cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32).to(device)
    return Inputs(
        q, kv, torch.empty_like(q), cu,
        torch.tensor([ctx + n for n in lens], dtype=torch.int32, device=device),
        table.to(device), max(lens),
    )  # fmt: skip


def kv_views(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.kv.shape[-1] // 2
    k, v = x.kv.transpose(1, 2).split(d, dim=-1)
    return k, v


def contiguous_kv(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's keys and values in token order, [T, HKV, HEAD] each (what a forward gets)."""
    k, v = kv_views(x)
    page = k.shape[1]
    positions = [torch.arange(n, device=x.q.device) for n in x.seq_lens.tolist()]
    pages = torch.cat([x.block_table[b, p // page] for b, p in enumerate(positions)]).long()
    slots = torch.cat([p % page for p in positions])
    return k[pages, slots].contiguous(), v[pages, slots].contiguous()


def check() -> None:
    """TMA kernel vs the pure-torch reference on small shapes (interpreter or GPU)."""
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    cases = [
        ([40, 70], 32, TmaConfig(8, 16, 4, 2), False),
        ([96, 33], 64, TmaConfig(4, 32, 4, 2, single_loop=True), False),
        ([40, 70], 16, TmaConfig(8, 32, 4, 2), True),
        ([40, 70], 32, TmaConfig(8, 16, 4, 2, skew=True), False),
        ([40, 70], 16, TmaConfig(8, 32, 4, 2, skew=True), True),
    ]
    if device == "cuda":
        cases += [
            ([1000, 3000], 128, TmaConfig(32, 128, 8, 2), False),
            ([1000, 3000], 128, TmaConfig(32, 64, 8, 3, skew=True), False),
            ([1000, 3000], 16, TmaConfig(32, 64, 8, 3, skew=True), True),
            ([1000, 3000], 128, TmaConfig(16, 128, 4, 2, True, True), False),
            ([1000, 3000], 16, TmaConfig(16, 128, 4, 2, True, True), True),
        ]
    for lens, page, cfg, contig in cases:
        x = make_inputs(lens, page, device, hq=8, hkv=2, d=64 if device == "cpu" else 128)
        work = query_blocks(x.cu, cfg.block_q)
        kv = contiguous_kv(x) if contig else None
        tma_prefill(x.q, x.kv, x.out, x.cu, x.seq_lens, x.block_table, cfg, work, kv)
        k, v = kv_views(x)
        ref, _ = paged_attention_ref(
            x.q.float(), k.float(), v.float(), x.cu, x.seq_lens, x.block_table,
            softmax_scale=x.q.shape[-1] ** -0.5, causal=True,
        )  # fmt: skip
        err = (x.out.float() - ref).abs().max().item()
        print(f"check lens={lens} page={page} contiguous={contig} {cfg}: max |err| {err:.2e}")
        # bf16 output and bf16 P in the second dot: each rounds to 2**-9 relative
        torch.testing.assert_close(x.out.float(), ref, atol=1e-2, rtol=1e-2)


# (query tokens x GQA = 128 or 64 rows, keys, warps, stages[, single loop, warp spec]); warp
# specialisation compiles on Triton 3.6 only for 64-row tiles on 4 warps.
TMA_CONFIGS = (
    TmaConfig(32, 128, 8, 2), TmaConfig(32, 128, 8, 3), TmaConfig(32, 64, 8, 3),
    TmaConfig(32, 64, 8, 4), TmaConfig(16, 64, 4, 3), TmaConfig(16, 128, 4, 2),
    TmaConfig(32, 128, 8, 2, True), TmaConfig(16, 128, 4, 2, True),
    TmaConfig(16, 128, 4, 2, True, True), TmaConfig(16, 64, 4, 2, True, True),
    TmaConfig(16, 128, 4, 3, True, True), TmaConfig(16, 64, 4, 4, True, True),
    TmaConfig(32, 64, 8, 3, skew=True), TmaConfig(32, 64, 8, 4, skew=True),
    TmaConfig(32, 128, 8, 2, skew=True),
)  # fmt: skip
# Variants of the paged read only (`attn_chunk_prefill_tma.py` times them).
PAGED_CONFIGS = (TmaConfig(32, 128, 8, 3, readahead=True), TmaConfig(32, 128, 8, 3, page_batch=16))
CASES = (("prefill causal B=1 L=8k", [8192]), ("prefill causal B=4 L=4k", [4096] * 4))


def graph_us(fn) -> float:
    from benchmarks.bench_paged_attention import graph_us as replay_us

    return replay_us(fn, 10, 40)


def sdpa_us(x: Inputs, lens: list[int]) -> float:
    """FlashAttention through SDPA on the same values, K/V contiguous and repeated per head."""
    from benchmarks.harness import bench_us

    b, n = len(lens), lens[0]
    k, v = kv_views(x)
    kd = k[x.block_table.long()].reshape(b, n, HKV, D).transpose(1, 2)
    vd = v[x.block_table.long()].reshape(b, n, HKV, D).transpose(1, 2)
    kd = kd.repeat_interleave(HQ // HKV, 1).contiguous()
    vd = vd.repeat_interleave(HQ // HKV, 1).contiguous()
    qd = x.q.view(b, n, HQ, D).transpose(1, 2).contiguous()
    f = torch.nn.functional.scaled_dot_product_attention
    return bench_us(lambda: f(qd, kd, vd, is_causal=True, scale=D**-0.5), 10, 40)


def shipped_us(x: Inputs) -> tuple[float, str]:
    k, v = kv_views(x)
    cfg = launch_config(x.q, k, v, x.max_seqlen_q)

    def fn() -> None:
        paged_attention(
            x.q, k, v, x.out, x.cu, x.seq_lens, x.block_table, max_seqlen_q=x.max_seqlen_q,
            max_seqlen_k=x.max_seqlen_q, softmax_scale=D**-0.5, causal=True,
        )  # fmt: skip

    tag = f"m={cfg.block_m} n={cfg.tile_n} w={cfg.num_warps} st={cfg.num_stages}"
    return graph_us(fn), tag


def tma_us(x: Inputs, cfg: TmaConfig, contig) -> float:
    work = query_blocks(x.cu, cfg.block_q)
    return graph_us(
        lambda: tma_prefill(x.q, x.kv, x.out, x.cu, x.seq_lens, x.block_table, cfg, work, contig)
    )


def report_tma(
    label: str, x: Inputs, cfg: TmaConfig, contig, ref: torch.Tensor, flops: float
) -> None:
    """Time one TMA variant and print its line (time, TFLOP/s, gap to the shipped output)."""
    try:
        x.out.zero_()
        us = tma_us(x, cfg, contig)
    except Exception as e:  # a variant that does not compile: say so, go on
        print(f"{label}: {type(e).__name__}: {str(e)[:300]}")
        return
    diff = (x.out.float() - ref.float()).abs().max().item()
    print(
        f"{label}: {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s (max |diff| vs shipped {diff:.1e})",
        flush=True,
    )


def bench(only: str) -> None:
    for name, lens in CASES:
        if only not in name:
            continue
        flops = 4.0 * HQ * D * sum(n * (n + 1) // 2 for n in lens)
        for page in (16, 128):
            x = make_inputs(lens, page, "cuda")
            if page == 16:
                us = sdpa_us(x, lens)
                print(f"{name}: sdpa {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s", flush=True)
            us, tag = shipped_us(x)
            ref = x.out.clone()
            print(
                f"{name}: page={page} shipped {tag}: {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s",
                flush=True,
            )
            # Pages of 16: TMA from the chunk's own contiguous K/V; pages of 128: from the cache.
            contig = contiguous_kv(x) if page == 16 else None
            source = "contiguous" if page == 16 else "paged"
            for cfg in TMA_CONFIGS:
                tag = (
                    f"tma {source} m={cfg.block_q * HQ // HKV} n={cfg.tile_n} "
                    f"w={cfg.num_warps} st={cfg.stages} one_loop={int(cfg.single_loop)} "
                    f"ws={int(cfg.warp_spec)}"
                )
                report_tma(f"{name}: page={page} {tag}", x, cfg, contig, ref, flops)
            del x, ref, contig
            torch.cuda.empty_cache()


def compile_only(
    capability: int, configs: tuple[TmaConfig, ...] = TMA_CONFIGS + PAGED_CONFIGS
) -> None:
    """Each TMA config (paged, pages of 128; and contiguous) compiled offline for `capability`."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from benchmarks.offline_compile import stats_of

    print(f"# triton {triton.__version__}, offline compile for sm{capability}")
    k = _tma_prefill_kernel
    for page in (128, 0):
        for cfg in configs:
            if page == 0 and (cfg.readahead or cfg.page_batch):
                continue  # paged variants
            consts = dict(
                NUM_KV_HEADS=HKV, GQA=HQ // HKV, HEAD=D, BLOCK_Q=cfg.block_q, TILE_N=cfg.tile_n,
                PAGE=page, STAGES=cfg.stages, SINGLE_LOOP=cfg.single_loop,
                WARP_SPEC=cfg.warp_spec, DOT_FP32=False, READAHEAD=cfg.readahead,
                PAGE_BATCH=cfg.page_batch, SKEW=cfg.skew,
            )  # fmt: skip
            ptrs = ("out_ptr", "cu_q_ptr", "seq_lens_ptr", "block_table_ptr", "work_ptr")
            sig = {n: "constexpr" for n in consts}
            sig |= {n: "*bf16" if n == "out_ptr" else "*i32" for n in ptrs}
            sig |= {n: f"tensordesc<bf16[{cfg.tile_n},{D}]>" for n in ("k_desc", "v_desc")}
            sig["q_desc"] = f"tensordesc<bf16[{cfg.block_q},{HQ // HKV},{D}]>"
            sig |= {"qk_scale": "fp32", "stride_ot": "i32", "stride_oh": "i32", "stride_bt": "i32"}
            aligned = (*ptrs, "stride_ot", "stride_oh")
            attrs = {(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
            tag = (
                f"{'contiguous' if page == 0 else 'paged'} m={cfg.block_q * HQ // HKV} "
                f"n={cfg.tile_n} w={cfg.num_warps} st={cfg.stages} "
                f"one_loop={int(cfg.single_loop)} ws={int(cfg.warp_spec)} "
                f"readahead={int(cfg.readahead)} page_batch={cfg.page_batch} "
                f"skew={int(cfg.skew)}"
            )
            try:
                c = triton.compile(
                    ASTSource(fn=k, signature=sig, constexprs=consts, attrs=attrs),
                    target=GPUTarget("cuda", capability, 32),
                    options=dict(num_warps=cfg.num_warps, num_stages=cfg.stages),
                )
            except Exception as e:  # the compiler's refusal is the finding
                print(f"{tag}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            caps = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", c.asm["ptx"])
            print(
                f"{tag}: warps {c.metadata.num_warps}, "
                f"maxnreg {sorted({int(n) for _, n in caps}, reverse=True) or '-'}, "
                f"TMA copies in the PTX {c.asm['ptx'].count('cp.async.bulk.tensor')}, "
                f"{stats_of(c)}",
                flush=True,
            )


def fresh_prefill_tag(cfg) -> str:
    """A `FreshPrefillConfig` as the experiments' lines name it."""
    return (f"m={cfg.block_m} n={cfg.tile_n} w={cfg.num_warps} st={cfg.num_stages} "
            f"skew={int(cfg.skew_scores)}")  # fmt: skip


def compile_shipped(
    capability: int,
    configs: tuple | None = None,
    shapes: tuple[tuple[int, int], ...] = ((128, 4), (128, 1), (128, 16), (64, 4)),
) -> None:
    """The product's `fresh_prefill` kernel (the contiguous route above, as BWX_ATTN launches
    it) compiled offline for `capability` with each of `configs` (default: the GPU's) at each
    (head, GQA) of `shapes`: registers, shared memory, spills and serialised wgmma."""
    from benchmarks.offline_compile import compile_offline
    from vllm_blackwell_ext.kernels import fresh_prefill as fp

    for cfg in configs or (fp._GPU_CONFIG,):
        for head, gqa in shapes:
            bq = cfg.block_m // gqa
            consts = dict(
                GQA=gqa, HEAD=head, BLOCK_Q=bq, TILE_N=cfg.tile_n, STAGES=cfg.num_stages,
                DOT_FP32=False, SKEW=cfg.skew_scores,
            )  # fmt: skip
            sig = {"q_desc": f"tensordesc<bf16[{bq},{gqa},{head}]>", "out_ptr": "*bf16"}
            sig |= {n: f"tensordesc<bf16[{cfg.tile_n},{head}]>" for n in ("k_desc", "v_desc")}
            sig |= {n: "*i32" for n in ("cu_q_ptr", "seq_lens_ptr")}
            sig |= {n: "i32" for n in ("batch", "stride_ot", "stride_oh", "min_query_len")}
            sig["qk_scale"] = "fp32"
            # what the launches specialise on: 16-byte pointers, output strides of 16
            aligned = ("out_ptr", "cu_q_ptr", "seq_lens_ptr", "stride_ot", "stride_oh")
            stats = compile_offline(
                fp._fresh_prefill_kernel, sig, consts, aligned, capability,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
            print(f"fresh_prefill {fresh_prefill_tag(cfg)} head={head} gqa={gqa}: {stats}",
                  flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--check", action="store_true", help="correctness on small shapes only")
    ap.add_argument("--compile-only", action="store_true", help="offline compile facts only")
    ap.add_argument("--capability", type=int, default=90, help="with --compile-only")
    args = ap.parse_args()
    if args.check:
        check()
        return
    if args.compile_only:
        compile_only(args.capability)
        compile_shipped(args.capability)
        return
    gpu = torch.cuda.get_device_name()
    print(f"# torch {torch.__version__}, triton {triton.__version__}, {gpu}")
    bench(args.only)


if __name__ == "__main__":
    main()
