"""Wide-head MLA decode with TMA-fed latent tiles: does a tensor-memory-access copy per page
lift the 64-row tiles (128 heads; 16 heads x 4 query tokens) off their 170-210 TFLOP/s?

The shipped 16-bit split kernel (`_mla_decode_split_kernel`) gathers every [BLOCK_N, 576] key
tile with `cp.async`, one 16-byte copy per thread per row chunk, its addresses computed per
tile. At 128 heads it is compute-bound at about a quarter of the tensor cores' rate; the ncu
profile (`h200-ncu-mla-035a69a.txt`) shows the load/store pipe at 39 % and the tensor pipe at
13 %, and 64-key tiles, faster by 1.07-1.17x, spilled (`h200-mla-wide-rows.txt`). A page of 64
tokens is one contiguous [64, 576] block of vLLM's MLA cache, so a key tile within a page is
five TMA copies (four 128-column latent chunks and the 64-column rope part): no per-thread
addresses, no gather instructions, fewer registers. This experiment times that kernel, with the
query from plain loads or through a descriptor, 32- or 64-key tiles and 1-3 stages, against the
shipped kernel on the same values, with the same split plan and the shipped merge, as CUDA-graph
replays, beside the matmul rate measured in the same run. Its result decides whether the
product's wide-row path takes TMA.

    python benchmarks/experiments/mla_wide_tma.py [--only SUBSTR]
    TRITON_INTERPRET=1 python benchmarks/experiments/mla_wide_tma.py --check
    python benchmarks/experiments/mla_wide_tma.py --compile-only [--capability 90]

`--check` runs every variant on small shapes against the pure-torch reference (the CPU
interpreter, or the GPU) and exits. `--compile-only` compiles each config for a GPU architecture
without one (Triton's bundled ptxas) and prints registers, shared memory and whether it spills
(`LDL`/`STL` in the SASS), or the compiler's refusal.

Bounds of the route: a tile must lie within one page (BLOCK_N divides the page size), and the
cache must be contiguous pages of [page, 576] (vLLM's MLA layout); a ragged last tile reads the
page's stale slots, so its rows past the keys are zeroed before they meet P (0 x NaN is NaN).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.mla_decode import (
    MlaDecodeWorkspace,
    _finish_rows,
    _mla_decode_merge_kernel,
    _softmax_step,
    _split_program,
    _store_rows,
    merge_config,
    mla_decode,
    mla_decode_flops,
    plan_mla_decode,
)
from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference

R, P = 512, 64
W = R + P
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class TmaConfig:
    block_n: int
    num_stages: int
    q_tma: bool  # the query through a descriptor (lands in shared memory) or plain loads
    # One key loop masking every tile's scores (slots past the keys must be finite: vLLM zeroes
    # its cache and writes finite K/V), or interior tiles unmasked and a masked loop after
    # that also zeroes the slots past the keys.
    one_loop: bool = True
    block_m: int = 64
    num_warps: int = 8

    @property
    def tag(self) -> str:
        return (
            f"tma m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages} "
            f"q_tma={int(self.q_tma)} one_loop={int(self.one_loop)}"
        )


CONFIGS = [
    TmaConfig(block_n, stages, q_tma)
    for block_n in (32, 64)
    for stages in (1, 2, 3)
    for q_tma in (False, True)
]
# The two-loop form spilled in every offline sm90 compile (Triton 3.6 and 3.7.1): one of it.
CONFIGS.append(TmaConfig(32, 2, True, one_loop=False))


@triton.jit
def _tile(
    acc0, acc1, acc2, acc3, m_i, l_i, q0, q1, q2, q3, qp, kl_desc, kr_desc, row, offs_n, n_ok,
    limit, scale, DC: tl.constexpr, MASKED: tl.constexpr, ZERO_TAIL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """One key tile of BLOCK_N rows starting at cache row `row` (within one page). MASKED
    applies the causal / length mask to the scores; ZERO_TAIL also zeroes the rows past the
    keys (the page's other slots) before P @ V meets them."""
    k0 = kl_desc.load([row, 0]).to(DOT_DTYPE)
    k1 = kl_desc.load([row, DC]).to(DOT_DTYPE)
    k2 = kl_desc.load([row, 2 * DC]).to(DOT_DTYPE)
    k3 = kl_desc.load([row, 3 * DC]).to(DOT_DTYPE)
    kr = kr_desc.load([row, 4 * DC]).to(DOT_DTYPE)
    if ZERO_TAIL:
        keep = n_ok[:, None]
        k0 = tl.where(keep, k0, 0.0)
        k1 = tl.where(keep, k1, 0.0)
        k2 = tl.where(keep, k2, 0.0)
        k3 = tl.where(keep, k3, 0.0)
        kr = tl.where(keep, kr, 0.0)
    s = tl.dot(q0, tl.trans(k0))
    s = tl.dot(q1, tl.trans(k1), s)
    s = tl.dot(q2, tl.trans(k2), s)
    s = tl.dot(q3, tl.trans(k3), s)
    s = tl.dot(qp, tl.trans(kr), s)
    if MASKED:
        p, alpha, m_i, l_i = _softmax_step(s * scale, m_i, l_i, offs_n, n_ok, limit)
    else:
        # Every key of an interior tile is visible to every row.
        s = s * scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    pd = p.to(DOT_DTYPE)
    acc0 = tl.dot(pd, k0, acc0 * alpha[:, None])
    acc1 = tl.dot(pd, k1, acc1 * alpha[:, None])
    acc2 = tl.dot(pd, k2, acc2 * alpha[:, None])
    acc3 = tl.dot(pd, k3, acc3 * alpha[:, None])
    return acc0, acc1, acc2, acc3, m_i, l_i


@triton.jit(do_not_specialize=["query_len", "num_splits", "num_row_groups"])
def _mla_tma_kernel(
    Q, q_desc, qr_desc, kl_desc, kr_desc, BT, SEQ, O_PART, L_PART, OUT, LSE,
    stride_qt, stride_qh, stride_bt, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_ot, stride_oh, stride_lse_t, qk_scale_log2, num_heads, query_len, num_splits,
    num_row_groups,
    R: tl.constexpr, P: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_LSE: tl.constexpr, Q_TMA: tl.constexpr, ONE_LOOP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    DC: tl.constexpr = R // 4
    b, split, seq_len, row_ok, head, tok, limit, start, end = _split_program(
        SEQ, num_heads, query_len, num_splits, num_row_groups, BLOCK_M, BLOCK_N, CAUSAL
    )
    if not SINGLE_SPLIT:
        if start >= seq_len:
            return
    offs_c = tl.arange(0, DC)
    if Q_TMA:
        # Rows of a contiguous [T, H, W] query as [T * H, W]: this program's first row.
        q_row0 = b * query_len * num_heads + tl.program_id(0) % num_row_groups * BLOCK_M
        q0 = q_desc.load([q_row0, 0]).to(DOT_DTYPE)
        q1 = q_desc.load([q_row0, DC]).to(DOT_DTYPE)
        q2 = q_desc.load([q_row0, 2 * DC]).to(DOT_DTYPE)
        q3 = q_desc.load([q_row0, 3 * DC]).to(DOT_DTYPE)
        qp = qr_desc.load([q_row0, R]).to(DOT_DTYPE)
    else:
        offs_p = tl.arange(0, P)
        q_row = tok.to(tl.int64) * stride_qt + head * stride_qh
        qm = row_ok[:, None]
        q0 = tl.load(Q + q_row[:, None] + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        q1 = tl.load(Q + q_row[:, None] + DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        q2 = tl.load(Q + q_row[:, None] + 2 * DC + offs_c[None, :], mask=qm, other=0.0).to(
            DOT_DTYPE
        )
        q3 = tl.load(Q + q_row[:, None] + 3 * DC + offs_c[None, :], mask=qm, other=0.0).to(
            DOT_DTYPE
        )
        qp = tl.load(Q + q_row[:, None] + R + offs_p[None, :], mask=qm, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    arange_n = tl.arange(0, BLOCK_N)
    if ONE_LOOP:
        full_hi = start
    else:
        # Interior tiles: whole, and every key visible to every row (rows see at least
        # seq_len - query_len + 1 keys).
        visible_to_all = seq_len - query_len + 1 if CAUSAL else seq_len
        full_hi = start + tl.maximum(tl.minimum(end, visible_to_all) - start, 0)
        full_hi = start + (full_hi - start) // BLOCK_N * BLOCK_N
        all_n = arange_n >= 0
        for n0 in range(start, full_hi, BLOCK_N):
            page = tl.load(bt_row + n0 // PAGE_SIZE)
            row = page * PAGE_SIZE + n0 % PAGE_SIZE
            acc0, acc1, acc2, acc3, m_i, l_i = _tile(
                acc0, acc1, acc2, acc3, m_i, l_i, q0, q1, q2, q3, qp, kl_desc, kr_desc, row,
                n0 + arange_n, all_n, limit, qk_scale_log2, DC, False, False, DOT_DTYPE,
            )  # fmt: skip
    for n0 in range(full_hi, end, BLOCK_N):
        page = tl.load(bt_row + n0 // PAGE_SIZE)
        row = page * PAGE_SIZE + n0 % PAGE_SIZE
        offs_n = n0 + arange_n
        acc0, acc1, acc2, acc3, m_i, l_i = _tile(
            acc0, acc1, acc2, acc3, m_i, l_i, q0, q1, q2, q3, qp, kl_desc, kr_desc, row,
            offs_n, offs_n < end, limit, qk_scale_log2, DC, True, not ONE_LOOP, DOT_DTYPE,
        )  # fmt: skip

    dst, row_off, inv_l = _finish_rows(
        m_i, l_i, 1.0, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
        stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
        stride_lse_t, False, SINGLE_SPLIT, HAS_LSE,
    )  # fmt: skip
    _store_rows(dst, row_off, offs_c, acc0 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + DC, offs_c, acc1 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * DC, offs_c, acc2 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 3 * DC, offs_c, acc3 * inv_l[:, None], row_ok)


class TmaMla:
    """The TMA kernel (and, with splits, the shipped merge) on fixed inputs, as a callable."""

    def __init__(self, q, cache, block_table, seq_lens, query_len, num_splits, cfg: TmaConfig):
        tokens, heads, width = q.shape
        pages, page_size, _ = cache.shape
        if width != W or page_size % cfg.block_n or not cache.is_contiguous():
            raise ValueError("needs a contiguous [pages, page, 576] cache and tiles within a page")
        if not q.is_contiguous():
            raise ValueError("needs a contiguous query")
        dc = R // 4
        flat = cache.view(pages * page_size, W)
        self.kl_desc = TensorDescriptor(flat, [pages * page_size, W], [W, 1], [cfg.block_n, dc])
        self.kr_desc = TensorDescriptor(flat, [pages * page_size, W], [W, 1], [cfg.block_n, P])
        q2d = q.view(tokens * heads, W)
        self.q_desc = TensorDescriptor(q2d, [tokens * heads, W], [W, 1], [cfg.block_m, dc])
        self.qr_desc = TensorDescriptor(q2d, [tokens * heads, W], [W, 1], [cfg.block_m, P])
        self.q, self.block_table, self.seq_lens = q, block_table, seq_lens
        self.query_len, self.num_splits, self.cfg = query_len, num_splits, cfg
        self.page_size = page_size
        self.out = torch.empty(tokens, heads, R, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
        self.o_part = torch.empty(
            tokens, heads, num_splits, R, dtype=torch.float32, device=q.device
        )
        self.l_part = torch.empty(tokens, heads, num_splits, dtype=torch.float32, device=q.device)
        self.row_groups = triton.cdiv(query_len * heads, cfg.block_m)
        self.dot_dtype = tl.float32 if q.device.type == "cpu" else tl.bfloat16
        self.compiled = None

    def __call__(self) -> torch.Tensor:
        q, cfg, s = self.q, self.cfg, self.num_splits
        tokens, heads, _ = q.shape
        batch = self.seq_lens.shape[0]
        single = s == 1
        if single:
            part = (0, 0, 0, 0, 0)
        else:
            part = (*self.o_part.stride()[:3], *self.l_part.stride()[:2])
        self.compiled = _mla_tma_kernel[(self.row_groups * s * batch,)](
            q, self.q_desc, self.qr_desc, self.kl_desc, self.kr_desc, self.block_table,
            self.seq_lens, self.o_part, self.l_part, self.out, self.lse,
            *q.stride()[:2], self.block_table.stride(0), *part, *self.out.stride()[:2],
            self.lse.stride(0), W**-0.5 * LOG2E, heads, self.query_len, s, self.row_groups,
            R=R, P=P, PAGE_SIZE=self.page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=True, SINGLE_SPLIT=single, HAS_LSE=True, Q_TMA=cfg.q_tma,
            ONE_LOOP=cfg.one_loop,
            DOT_DTYPE=self.dot_dtype, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if not single:
            block_r, block_s, warps = merge_config(s)
            _mla_decode_merge_kernel[(tokens, heads, R // block_r)](
                self.o_part, self.l_part, self.out, self.lse, self.seq_lens,
                *part, *self.out.stride()[:2], self.lse.stride(0), s, self.query_len,
                BLOCK_N=cfg.block_n, BLOCK_R=block_r, BLOCK_S=block_s, HAS_LSE=True,
                num_warps=warps,
            )  # fmt: skip
        return self.out


def make_inputs(batch, heads, ctx, query_len, page, device, seed=0):
    """Small inputs for `--check`: a shuffled block table over a few spare pages."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    per_seq = triton.cdiv(ctx, page)
    pages = batch * per_seq + 3
    cache = torch.randn(pages, page, W, generator=g).to(torch.bfloat16).to(device)
    perm = torch.randperm(pages, generator=g)[: batch * per_seq]
    block_table = perm.view(batch, per_seq).to(torch.int32).to(device)
    q = torch.randn(batch * query_len, heads, W, generator=g).to(torch.bfloat16).to(device)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return q, cache, block_table, seq_lens


def check() -> None:
    """Every variant against the reference on small shapes: ragged ends, several splits,
    causal rows of several query tokens, 64-row tiles over two row groups."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = [
        # batch, heads, ctx, query_len, splits
        (2, 128, 150, 1, 1),
        (2, 16, 100, 4, 2),
        (1, 64, 64, 1, 3),
        (3, 16, 37, 4, 1),
    ]
    configs = CONFIGS
    if device == "cpu":  # the interpreter: one of each kind (it ignores stages)
        configs = [TmaConfig(32, 1, q_tma, one_loop) for q_tma in (0, 1) for one_loop in (1, 0)]
    failures = 0
    for batch, heads, ctx, qlen, splits in shapes:
        q, cache, bt, seq = make_inputs(batch, heads, ctx, qlen, 64, device)
        ref, ref_lse = mla_decode_reference(
            q.float(), cache.float(), bt, seq, softmax_scale=W**-0.5, kv_lora_rank=R,
            query_len=qlen,
        )  # fmt: skip
        last = bt[:, (ctx - 1) // 64].long()
        for cfg in configs:
            # The slots past the keys: large finite values for the one-loop kernel (its
            # precondition), NaN for the kernel that zeroes them.
            cache[last, ctx % 64 or 64 :] = 1e4 if cfg.one_loop else float("nan")
            fn = TmaMla(q, cache, bt, seq, qlen, splits, cfg)
            out = fn().float().cpu()
            err = (out - ref).abs().max().item()
            lse_err = (fn.lse.cpu() - ref_lse).abs().max().item()
            ok = err <= 2e-2 and lse_err <= 1e-3
            failures += not ok
            print(
                f"check B={batch} h={heads} ctx={ctx} q_len={qlen} splits={splits} {cfg.tag}: "
                f"max|out err| {err:.2e} max|lse err| {lse_err:.2e} {'ok' if ok else 'FAIL'}",
                flush=True,
            )
    if failures:
        raise SystemExit(f"{failures} variant(s) off the reference")


CASES = [
    # name, heads, batch, ctx, query_len
    ("h128 bf16 B=64 ctx=32k", 128, 64, 32768, 1),
    ("h128 bf16 B=8 ctx=32k", 128, 8, 32768, 1),
    ("h64 bf16 B=64 ctx=32k", 64, 64, 32768, 1),
    ("h16 bf16 q_len=4 B=64 ctx=32k", 16, 64, 32768, 4),
    ("h32 bf16 q_len=4 B=64 ctx=32k", 32, 64, 32768, 4),
]


def shipped_us(q, cache, bt, seq, qlen, splits, cfg):
    """The shipped kernel with the same split plan: (us per replay, its output, its handle)."""
    from benchmarks.bench_mla_decode import graph_us

    tokens, heads, _ = q.shape
    out = torch.empty(tokens, heads, R, dtype=q.dtype, device=q.device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
    ws = MlaDecodeWorkspace.allocate(tokens, heads, splits, R, q.device)
    compiled: list = []

    def fn() -> torch.Tensor:
        return mla_decode(
            q, cache, bt, seq, out, softmax_scale=W**-0.5, kv_lora_rank=R, query_len=qlen,
            lse_out=lse, workspace=ws, num_splits=splits, config=cfg, compiled=compiled,
        )  # fmt: skip

    us = graph_us(fn)
    return us, out.float(), compiled[0]


def bench(only: str) -> None:
    from benchmarks.bench_mla_decode import graph_us, matmul_tflops

    print(f"matmul {matmul_tflops():.0f} TFLOP/s (bf16 8192^3, same run)", flush=True)
    info = device_info(torch.device("cuda"))
    # One page pool for every case (the largest takes 64 x 32k tokens), each case a shuffled
    # subset of it, so no two requests share pages.
    pages = max(batch * triton.cdiv(ctx, 64) for _, _, batch, ctx, _ in CASES) + 3
    cache = torch.randn(pages, 64, W, device="cuda", dtype=torch.bfloat16)
    for name, heads, batch, ctx, qlen in CASES:
        if only not in name:
            continue
        perm = torch.randperm(pages, device="cuda")[: batch * (ctx // 64)]
        bt = perm.view(batch, ctx // 64).to(torch.int32)
        q = torch.randn(batch * qlen, heads, W, device="cuda", dtype=torch.bfloat16)
        seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        flops = mla_decode_flops(batch * qlen, heads, ctx, R)
        splits, cfg0 = plan_mla_decode(batch, heads, ctx, qlen, info, kv_dtype=cache.dtype)
        us, ref, h = shipped_us(q, cache, bt, seq, qlen, splits, cfg0)
        print(
            f"{name}: shipped m{cfg0.block_m} n{cfg0.block_n} w{cfg0.num_warps} "
            f"s{cfg0.num_stages} splits={splits} {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s "
            f"regs={h.n_regs} spills={h.n_spills}",
            flush=True,
        )
        for cfg in CONFIGS:
            try:
                fn = TmaMla(q, cache, bt, seq, qlen, splits, cfg)
                us = graph_us(fn)
            except Exception as e:  # a config that does not compile or fit: say so, go on
                print(f"{name}: {cfg.tag}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            diff = (fn.out.float() - ref).abs().max().item()
            c = fn.compiled
            print(
                f"{name}: {cfg.tag} splits={splits} {us:8.1f} us {flops / us / 1e6:6.1f} "
                f"TFLOP/s regs={c.n_regs} spills={c.n_spills} shared={c.metadata.shared} "
                f"max|diff vs shipped| {diff:.1e}",
                flush=True,
            )
            del fn


def compile_only(capability: int) -> None:
    """Each config compiled offline for `capability`: registers, shared memory, spills."""
    from benchmarks.offline_compile import compile_offline

    print(f"# triton {triton.__version__}, offline compile for sm{capability}", flush=True)
    dc = R // 4
    ints = (
        "stride_qt", "stride_qh", "stride_bt", "stride_pt", "stride_ph", "stride_ps",
        "stride_lt", "stride_lh", "stride_ot", "stride_oh", "stride_lse_t", "num_heads",
        "query_len", "num_splits", "num_row_groups",
    )  # fmt: skip
    # What launches specialise on: 16-byte pointers, strides that are multiples of 16.
    aligned = ("Q", "OUT", "BT", "SEQ", "O_PART", "L_PART", "LSE", "stride_qt", "stride_qh")
    aligned += ("stride_ot", "stride_oh", "stride_pt", "stride_ph", "stride_ps")
    for single in (True, False):
        for cfg in CONFIGS:
            consts = dict(
                R=R, P=P, PAGE_SIZE=64, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=True,
                SINGLE_SPLIT=single, HAS_LSE=True, Q_TMA=cfg.q_tma, ONE_LOOP=cfg.one_loop,
                DOT_DTYPE=tl.bfloat16,
            )  # fmt: skip
            sig = {"Q": "*bf16", "OUT": "*bf16", "BT": "*i32", "SEQ": "*i32"}
            sig |= {n: "*fp32" for n in ("O_PART", "L_PART", "LSE")}
            sig |= {
                "q_desc": f"tensordesc<bf16[{cfg.block_m},{dc}]>",
                "qr_desc": f"tensordesc<bf16[{cfg.block_m},{P}]>",
                "kl_desc": f"tensordesc<bf16[{cfg.block_n},{dc}]>",
                "kr_desc": f"tensordesc<bf16[{cfg.block_n},{P}]>",
            }
            sig |= {n: "i32" for n in ints} | {"qk_scale_log2": "fp32"}
            tag = f"{cfg.tag} {'single' if single else 'split'}"
            try:
                stats = compile_offline(
                    _mla_tma_kernel, sig, consts, aligned, capability,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                )  # fmt: skip
            except Exception as e:  # the compiler's refusal is the finding
                print(f"{tag}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            print(f"{tag}: {stats}", flush=True)


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
        return
    print(
        f"# torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}"
    )
    bench(args.only)


if __name__ == "__main__":
    main()
